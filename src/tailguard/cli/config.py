"""`tailguard config list | status | mark-good | diff | rollback | reload`: the configs a gateway
applied (kept in its state directory, `tailguard.gateway.ops.store`), the known-good baseline, what
changed between two or between what runs and the file, and a running gateway sent back to the
baseline (or any stored config) live, with the file told when it would bring the change back."""

from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Optional

import typer

if TYPE_CHECKING:
    from tailguard.config import GatewayConfig
    from tailguard.gateway.ops.store import ConfigStore, Entry

_CONFIG = typer.Option(None, "--config", "-c", help="The gateway's tailguard.yaml (its state is beside it).")
_STATE = typer.Option(None, "--state-dir", help="The gateway's state directory (as given to `serve --state-dir`).")
_WAIT_S = 10.0


def register(app: typer.Typer) -> None:
    config = typer.Typer(help="Applied configs, the known-good baseline, diff and live rollback.",
                         add_completion=False, no_args_is_help=True, rich_markup_mode=None)
    config.command("list")(list_configs)
    config.command("status")(status)
    config.command("mark-good")(mark_good)
    config.command("diff")(diff)
    config.command("rollback")(rollback)
    config.command("reload")(reload)
    app.add_typer(config, name="config")


def _store(config: Path | None, state_dir: Path | None) -> ConfigStore:
    from tailguard.gateway.ops.store import ConfigStore, default_state_dir

    if state_dir is not None:
        return ConfigStore(state_dir)
    if config is None:
        _fail("give --config FILE (the state is beside it) or --state-dir DIR", 2)
    return ConfigStore(default_state_dir(config))


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def list_configs(config: Optional[Path] = _CONFIG, state_dir: Optional[Path] = _STATE) -> None:
    """Every stored config: number, hash, when it was last applied and how; `*` the one applied
    last, `good` the baseline."""
    from tailguard.errors import ConfigError

    store = _store(config, state_dir)
    try:
        entries, history, good = store.entries(), store.history(), store.good()
    except ConfigError as e:
        _fail(str(e))
    if not entries:
        _fail(f"no configs stored in {store.root} yet (start `tailguard serve` first)")
    last = {a.n: a for a in history}
    current = history[-1].n if history else None
    for entry in entries:
        a = last.get(entry.n)
        marks = ("*" if entry.n == current else " ") + (" good" if good is not None and good.n == entry.n else "")
        when = f"{a.at}  {a.how:<16}" if a is not None else ""
        typer.echo(f"{entry.n:4d} {entry.hash}  {when:<43} {marks}".rstrip())


def mark_good(n: Optional[int] = typer.Argument(None, help="Config number (default: the one applied last)."),
              config: Optional[Path] = _CONFIG, state_dir: Optional[Path] = _STATE) -> None:
    """Mark a stored config as the known-good baseline that `rollback` returns to."""
    from tailguard.errors import ConfigError

    store = _store(config, state_dir)
    try:
        entry = store.mark_good(n if n is not None else store.current().n)
    except ConfigError as e:
        _fail(str(e))
    typer.echo(f"config {entry.n} ({entry.hash}) is the known-good baseline")


def diff(a: Optional[str] = typer.Argument(None, help="A config number, `good`, `current`, or a YAML file "
                                                      "(default: what runs, compared with the --config file)."),
         b: Optional[str] = typer.Argument(None, help="The same, compared against A (default: `current`)."),
         config: Optional[Path] = _CONFIG, state_dir: Optional[Path] = _STATE) -> None:
    """What changed from A to B, setting by setting in the YAML's dotted names. With neither: from
    the config the gateway runs to the --config file, which is what a reload would apply."""
    from tailguard.errors import ConfigError
    from tailguard.config import load_config
    from tailguard.settings import described, flatten

    try:
        store = _store(config, state_dir) if config is not None or state_dir is not None else None
        if a is None and b is None:
            if config is None or store is None:
                raise ConfigError("give --config FILE to compare it with what runs, or two configs: "
                                  "tailguard config diff good current -c FILE")
            entry = store.current()
            typer.echo(f"from {_applied(store, entry.n)} config {entry.n} ({entry.hash}) to the file {config}:")
            old, new = entry.load(), load_config(config)
        else:
            old, new = _resolve(a or "good", store), _resolve(b or "current", store)
    except ConfigError as e:
        _fail(str(e))
    found = described(flatten(old.settings()), flatten(new.settings()))
    typer.echo("\n".join(found) if found else "no setting differs")


def _applied(store: ConfigStore, n: int) -> str:
    """How to name stored config `n`: the running one, or (with no gateway up) the one applied last."""
    from tailguard.errors import ConfigError

    try:
        store.running_pid()
    except ConfigError:
        return "the last applied (no gateway runs now)"
    return "the running" if store.current().n == n else "stored"


def status(config: Optional[Path] = _CONFIG, state_dir: Optional[Path] = _STATE) -> None:
    """The running, baseline and file configs side by side (number and hash), and what to do when
    the file is not what runs."""
    from tailguard.errors import ConfigError
    from tailguard.config import load_config

    store = _store(config, state_dir)
    try:
        running = store.current()
        good = store.good()
        on_disk = None if config is None else load_config(config).digest()
        up = _applied(store, running.n) == "the running"
    except ConfigError as e:
        _fail(str(e))
    rows = [("running" if up else "last run", f"config {running.n}", running.hash),
            ("baseline", "none marked" if good is None else f"config {good.n}", "-" if good is None else good.hash)]
    if on_disk is not None:
        rows.append(("file", str(config), on_disk))
    for what, name, h in rows:
        typer.echo(f"{what:<9} {h:<12}  {name}")
    if on_disk is not None and on_disk != running.hash:
        typer.echo(f"the file differs from what runs: `tailguard config diff -c {config}` shows how; "
                   f"`tailguard config reload -c {config}` applies it")


def _resolve(which: str, store: ConfigStore | None) -> GatewayConfig:
    from tailguard.errors import ConfigError
    from tailguard.config import load_config

    if not which.isdigit() and which not in ("good", "current"):
        return load_config(which)
    if store is None:
        raise ConfigError(f"{which!r} names a stored config: give --config FILE or --state-dir DIR")
    if which == "current":
        return store.current().load()
    if which == "good":
        good = store.good()
        if good is None:
            raise ConfigError(f"no baseline marked in {store.root} (tailguard config mark-good N)")
        return good.load()
    return store.get(int(which)).load()


def rollback(to: Optional[int] = typer.Option(None, "--to", help="Config number (default: the baseline)."),
             write: bool = typer.Option(False, "--write", help="Also put the restored settings in the --config file, "
                                        "keeping its comments and layout (the file as it was is kept beside it, as "
                                        "FILE.bak)."),
             config: Optional[Path] = _CONFIG, state_dir: Optional[Path] = _STATE,
             force: bool = typer.Option(False, "--force", help="Apply it even if it weakens the gateway's guard "
                                        "(as `reload --force`).")) -> None:
    """Return the running gateway to the known-good baseline (or config N), live: queued and
    running requests are kept. Says when the --config file still holds the change, which the next
    reload or restart would bring back."""
    from tailguard.errors import ConfigError
    from tailguard.config.loading import names_key_file

    store = _store(config, state_dir)
    try:
        if to is None:
            good = store.good()
            if good is None:
                raise ConfigError(f"no baseline marked in {store.root} (tailguard config mark-good N)")
            to = good.n
        entry = store.get(to)
        if write and config is None:
            raise ConfigError("--write needs the file: give --config FILE")
        if write and config is not None and names_key_file(config):  # a stored config holds the keys themselves
            raise ConfigError(f"{config} reads its keys from auth.api_keys_file, and config {entry.n} holds them as "
                              "keys: --write would copy them into the config. Roll back without --write and edit "
                              "the file by hand.")
        _signal_and_wait(store, {"n": entry.n, "how": f"rollback to {entry.n}", "force": force})
        if config is not None:
            _settle_file(config, entry, write)
    except ConfigError as e:
        _fail(str(e))


def _settle_file(config: Path, entry: Entry, write: bool) -> None:
    """After a rollback: write `entry` into the file (keeping the old file), or warn when the file
    differs from it, naming the settings the next reload or restart would bring back."""
    from tailguard.config import load_config
    from tailguard.settings import described, flatten

    changes = described(flatten(entry.load().settings()), flatten(load_config(config).settings()))
    if not changes:
        return
    if write:
        _write_into(config, entry)
        return
    typer.echo(f"warning: {config} still differs from config {entry.n}, which runs now; the next reload or "
               f"restart brings back:\n  " + "\n  ".join(changes) +
               f"\nrun `tailguard config rollback --to {entry.n} --write -c {config}` to write config {entry.n} into it "
               "(keeping the file as it is beside it)", err=True)


def _write_into(config: Path, entry: Entry) -> None:
    """Config `entry`'s settings written into the file in place of its own, keeping its comments,
    order and layout (`config.rewrite`), the file as it was kept as FILE.bak. Written only when the
    result loads as exactly that config; otherwise the file is left alone and the reason said."""
    import yaml

    from tailguard.config import load_config
    from tailguard.config.rewrite import rewritten
    from tailguard.errors import ConfigError

    tmp = config.with_name(f".{config.name}.rollback")
    try:
        tmp.write_text(rewritten(config.read_text(encoding="utf-8"), yaml.safe_load(entry.path.read_text()) or {}),
                       encoding="utf-8")
        shutil.copymode(config, tmp)
        ok = load_config(tmp).digest() == entry.hash
        why = "the file written that way would not load as that config"
    except (OSError, ValueError, ConfigError, yaml.YAMLError) as e:
        ok, why = False, str(e).splitlines()[0]
    if not ok:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"config {entry.n} runs now, but --write did not write it into {config} keeping the file's "
                          f"comments ({why}): the file is unchanged; write it by hand from {entry.path}")
    kept = config.with_name(config.name + ".bak")
    shutil.copy2(config, kept)
    os.replace(tmp, config)
    typer.echo(f"wrote config {entry.n}'s settings into {config}, its comments and layout kept (the file as it was: "
               f"{kept})")


def reload(config: Optional[Path] = _CONFIG, state_dir: Optional[Path] = _STATE,
           force: bool = typer.Option(
               False, "--force", "--allow-auth-change",
               help="Apply the file even if it weakens the gateway's guard (removes every API key, more than half "
               "of them or every admin key, or opens /metrics to everyone); refused otherwise, saying why.")) -> None:
    """Make the running gateway read its --config file again (as SIGHUP does), and say how it went."""
    from tailguard.errors import ConfigError

    try:
        _signal_and_wait(_store(config, state_dir), {"how": "reload", "force": force})
    except ConfigError as e:
        _fail(str(e))


def _signal_and_wait(store: ConfigStore, request: dict[str, object]) -> None:
    """Leave the request, SIGHUP the gateway, and wait for its result (at most `_WAIT_S`)."""
    from tailguard.errors import ConfigError

    pid = store.running_pid()
    ident = uuid.uuid4().hex
    store.take_json(store.result_file)  # an old result must not be read as ours
    # Made for the config running now, and now: the gateway ignores a leftover request.
    history = store.history()
    made_for = history[-1].hash if history else None
    store.write_json(store.request_file, {"id": ident, "made_for": made_for, "at": time.time(), **request})
    started = time.monotonic()
    os.kill(pid, signal.SIGHUP)
    while time.monotonic() - started < _WAIT_S:
        result = store.take_json(store.result_file)
        if result is not None and result.get("id") == ident:
            took = time.monotonic() - started
            if not result.get("ok"):
                raise ConfigError(f"the gateway kept its config: {result.get('error')}")
            typer.echo(f"config {result.get('n')} ({result.get('hash')}) applied by pid {pid} in {took:.2f} s")
            return
        time.sleep(0.02)
    raise ConfigError(f"no answer from the gateway (pid {pid}) within {_WAIT_S:g} s: its log says why; "
                      f"`tailguard config status` shows which config it runs")
