"""`tailguard audit verify | export`: check the audit trail's hash chains (every entry edited,
removed or reordered is named, and heads logged earlier are looked for), and write its entries
as JSON lines for a SIEM (`tailguard.audit`, docs/security.md)."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Optional

import typer

if TYPE_CHECKING:
    from tailguard.audit.store import AuditStore

_CONFIG = typer.Option(None, "--config", "-c", help="The gateway's tailguard.yaml: its `audit:` says where the trail is.")
_STATE = typer.Option(None, "--state-dir", help="The gateway's state directory (its audit.sqlite3).")
_STORE = typer.Option(None, "--store", help="The trail itself: a SQLite file, or a postgresql:// URL.")
_CHAIN = typer.Option(None, "--chain", help="One chain only (default: every chain in the store).")


def register(app: typer.Typer) -> None:
    audit = typer.Typer(help="The audit trail: verify its hash chains, export its entries.", add_completion=False,
                        no_args_is_help=True, rich_markup_mode=None)
    audit.command("verify")(verify)
    audit.command("export")(export)
    app.add_typer(audit, name="audit")


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _open(config: Path | None, state_dir: Path | None, store: str | None) -> AuditStore:
    from tailguard.audit.store import FILE_NAME, open_store
    from tailguard.errors import ConfigError

    if store is not None:
        url = store if store.startswith(("postgresql://", "postgres://")) else None
        path = None if url is not None else Path(store)
        if path is not None and not path.is_file():
            _fail(f"no audit trail at {path}")
        return open_store(url or "sqlite", path)
    if config is None and state_dir is None:
        _fail("give --config FILE, --state-dir DIR or --store FILE|URL")
    where = "sqlite"
    path = state_dir / FILE_NAME if state_dir is not None else None
    if config is not None:
        from tailguard.config import load_config
        from tailguard.gateway.ops.store import default_state_dir

        try:
            a = load_config(config).audit
        except ConfigError as e:
            _fail(str(e))
        where = a.store
        path = a.path or (state_dir or default_state_dir(config)) / FILE_NAME
    if where == "sqlite" and (path is None or not path.is_file()):
        _fail(f"no audit trail at {path} (is `audit.enabled` on?)")
    return open_store(where, path)


def _instant(value: str | None, name: str) -> float | None:
    """Unix seconds, or an ISO 8601 date or time (UTC unless it says otherwise)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        t = datetime.datetime.fromisoformat(value)
    except ValueError:
        _fail(f"{name} {value!r}: give Unix seconds or an ISO 8601 time, e.g. 2025-01-31T12:00:00Z")
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.timezone.utc)
    return t.timestamp()


def verify(
    config: Optional[Path] = _CONFIG, state_dir: Optional[Path] = _STATE, store: Optional[str] = _STORE,
    chain: Optional[str] = _CHAIN,
    head: Optional[list[str]] = typer.Option(
        None, "--head", metavar="CHAIN:N:HASH",
        help="A head the gateway logged earlier (`audit_head`): that entry must still be there, with that hash, "
        "or the chain was cut off or rewritten after it. Repeat for several."),
) -> None:
    """Check every chain (or one): each entry's hash, each link to the entry before it, the numbers
    in order. Exits 1 naming each entry where a chain breaks."""
    from tailguard.audit.chain import verify as check

    s = _open(config, state_dir, store)
    wanted = _heads(head or [])
    broken = 0
    try:
        chains = [chain] if chain is not None else s.chains()
        if not chains:
            _fail("the trail has no entries yet", 1)
        for name in chains:
            anchor = s.anchor(name)
            problems, top = check(name, s.entries(name), anchor)
            problems_heads = [h for h in wanted if h[0] == name and not _has(s, name, h[1], h[2], anchor)]
            for p in problems:
                typer.echo(str(p))
            for _, n, h in problems_heads:
                typer.echo(f"chain {name} entry {n}: not found with hash {h} (the chain was cut off or rewritten "
                           "after it was logged)")
            broken += len(problems) + len(problems_heads)
            since = f"from entry {anchor[0] + 1} (older ones deleted by retention)" if anchor else "from entry 1"
            verdict = "ok" if not problems and not problems_heads else "BROKEN"
            typer.echo(f"chain {name}: {top.entries} entries {since}, head {top}: {verdict}")
    finally:
        s.close()
    if broken:
        raise typer.Exit(1)


def _heads(given: list[str]) -> list[tuple[str, int, str]]:
    out = []
    for h in given:
        name, _, rest = h.rpartition(":")
        chain_name, _, n = name.rpartition(":")
        if not chain_name or not n.isdigit() or len(rest) != 64:
            _fail(f"--head {h!r}: give CHAIN:N:HASH as the gateway logged it")
        out.append((chain_name, int(n), rest))
    return out


def _has(s: AuditStore, chain: str, n: int, h: str, anchor: tuple[int, str] | None) -> bool:
    if anchor is not None and n <= anchor[0]:
        return n < anchor[0] or anchor[1] == h  # deleted by retention since: only the anchor can say
    return s.hash_of(chain, n) == h


def export(
    config: Optional[Path] = _CONFIG, state_dir: Optional[Path] = _STATE, store: Optional[str] = _STORE,
    chain: Optional[str] = _CHAIN,
    since: Optional[str] = typer.Option(None, "--since", help="From this time on (Unix seconds or ISO 8601)."),
    until: Optional[str] = typer.Option(None, "--until", help="Before this time."),
    caller: Optional[str] = typer.Option(None, "--caller", help="One caller's entries (its API key's name)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write here instead of stdout."),
) -> None:
    """The entries as JSON lines, each its document with `chain`, `seq` and `hash`, by chain and
    number: what a SIEM ingests."""
    import orjson

    s = _open(config, state_dir, store)
    lo, hi = _instant(since, "--since"), _instant(until, "--until")
    sink = out.open("wb") if out is not None else sys.stdout.buffer
    n = 0
    try:
        for e in s.entries(chain, since=lo, until=hi, caller=caller):
            sink.write(orjson.dumps({**e.fields(), "chain": e.chain, "seq": e.seq, "hash": e.hash}) + b"\n")
            n += 1
    finally:
        s.close()
        if out is not None:
            sink.close()
    if out is not None:
        typer.echo(f"{n} entries written to {out}", err=True)
