"""Which gateway config a run was measured under, and which settings differed between two runs;
pure, no I/O.

A run through a tailguard gateway holds the config's hash on every record (the
`X-Tailguard-Config` header) and, in `run.json`, the settings the gateway reported at the start
(`gateway_config`, from its `/config`). Comparing two runs is only a clean experiment when one
setting changed (the article's rule: change one variable per run), so `bench compare` and
`doctor --against` name the settings that differ and warn when there is more than one, when a
run's config changed while it ran, or when the configs differ but their settings were not recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import measured
from tailguard.settings import described, flatten


def seen(records: Sequence[RequestRecord]) -> dict[str, int]:
    """How many measured requests each config hash answered, in order of first sight."""
    out: dict[str, int] = {}
    for r in measured(records):
        if r.config is not None:
            out[r.config] = out.get(r.config, 0) + 1
    return out


def run_config(records: Sequence[RequestRecord], meta: dict[str, Any]) -> dict[str, Any] | None:
    """The run's gateway config: {hash, n, seen (requests per hash), settings}; None when it met
    no tailguard gateway."""
    recorded = meta.get("gateway_config") or {}
    hashes = seen(records)
    head = recorded.get("hash") or next(iter(hashes), None)
    if head is None:
        return None
    return {"hash": head, "n": recorded.get("n"), "seen": hashes, "settings": recorded.get("settings")}


def config_changes(before: dict[str, Any] | None, after: dict[str, Any] | None,
                   runs: tuple[str, str] = ("the before run", "the after run")) -> dict[str, Any] | None:
    """What differed between two runs' configs (`run_config` of each), with the warnings to show;
    None when neither ran through a tailguard gateway."""
    if before is None and after is None:
        return None
    warnings = [w for run, c in zip(runs, (before, after)) if (w := _mixed(c, run)) is not None]
    out: dict[str, Any] = {"before": before and before["hash"], "after": after and after["hash"], "changes": None,
                           "warnings": warnings}
    if before is None or after is None:
        return out  # one run straight to the backend, one through a gateway: the gateway is what is compared
    if before["settings"] is not None and after["settings"] is not None:
        changes = described(flatten(before["settings"]), flatten(after["settings"]))
        out["changes"] = changes
        if len(changes) > 1:
            warnings.append(f"{len(changes)} gateway settings differ between the runs: change one per run, or "
                            "this comparison cannot say which one made the difference")
    elif before["hash"] != after["hash"]:
        warnings.append(f"the gateway configs differ ({before['hash']} -> {after['hash']}) but their settings were "
                        "not recorded: `tailguard config diff` on the gateway's state directory names them")
    return out


def within_run(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """For one run alone: a warning when its config changed while it ran, else None."""
    w = _mixed(config, "this run")
    return None if w is None else {"before": None, "after": None, "changes": None, "warnings": [w]}


def _mixed(config: dict[str, Any] | None, run: str) -> str | None:
    if config is None or len(config["seen"]) < 2:
        return None
    counts = ", ".join(f"{h}: {n}" for h, n in config["seen"].items())
    return f"the gateway's config changed during {run}, its figures mix configs (requests answered by each: {counts})"


def config_lines(changes: dict[str, Any] | None) -> list[str]:
    """`config_changes` as lines for a terminal."""
    if changes is None:
        return []
    lines = []
    if changes["before"] is None and changes["after"] is None:
        pass  # one run alone: its warning says it
    elif changes["before"] == changes["after"]:
        lines.append(f"gateway config: {changes['before']} in both runs")
    else:
        before, after = (changes[k] or "none (straight to the backend)" for k in ("before", "after"))
        lines.append(f"gateway config: {before} -> {after}")
    lines += [f"  {c}" for c in changes["changes"] or []]
    lines += [f"warning: {w}" for w in changes["warnings"]]
    return lines
