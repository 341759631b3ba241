"""One worker's share of a config when `tailguard serve --workers N` runs N gateway processes on
one port (pure: no I/O).

Without `state.url` (one ledger in Redis that every process reads and writes) each worker holds
its own slots and limits, so every cap that bounds something the workers share is divided by N: a
backend's slots (so the engine never gets more than `max_concurrency` requests at once), a
caller's rate, token and parallel limits (the kernel spreads a caller's connections over the workers about
evenly), a class's queue, the connection cap and the queued-body budget (one host's memory).
Dividing is the honest fallback: the sum of the workers' caps never exceeds the configured one,
at the price that one worker may refuse while another has room (gunicorn's and nginx's workers
have the same limit without shared state: `limit_conn` zones are what nginx shares for it).
Per-request bounds (body size, max_tokens, timeouts) are not shares and stay as they are.
"""

from __future__ import annotations

from tailguard.config.gateway import GatewayConfig


def share(value: int, n: int) -> int:
    """`value` divided among `n` workers, rounded down, at least 1."""
    return max(1, value // n)


def _opt(value: int | None, n: int) -> int | None:
    return None if value is None else share(value, n)


def per_worker(cfg: GatewayConfig, n: int) -> GatewayConfig:
    """The config each of `n` workers runs: `cfg` with every shared cap divided by `n`. With
    `state.url`, backends' slots and callers' limits are one count in Redis over every
    process (`gateway.shared`, docs/scale-out.md): those stay whole."""
    if n <= 1:
        return cfg
    backends = []
    for b in cfg.backends:
        update: dict[str, object] = {"max_concurrency": share(b.max_concurrency, n)}
        if b.reserved_slots:
            update["reserved_slots"] = share(b.reserved_slots, n)
        if b.adaptive is not None:
            a = b.adaptive
            update["adaptive"] = a.model_copy(update={"min": share(a.min, n), "max": share(a.max, n),
                                                      "initial": _opt(a.initial, n)})
        backends.append(b.model_copy(update=update))
    keys = {k: v.model_copy(update={"rpm_limit": _opt(v.rpm_limit, n), "tpm_limit": _opt(v.tpm_limit, n),
                                    "max_parallel_requests": _opt(v.max_parallel_requests, n)})
            for k, v in cfg.auth.api_keys.items()}
    classes = [c.model_copy(update={"max_queue_len": share(c.max_queue_len, n)}) for c in cfg.classes]
    limits = cfg.limits.model_copy(update={
        "max_connections": share(cfg.limits.max_connections, n),
        "max_queued_body_bytes": share(cfg.limits.max_queued_body_bytes, n)})
    if cfg.state.url is not None:
        backends, keys = list(cfg.backends), dict(cfg.auth.api_keys)
    return cfg.model_copy(update={"backends": backends, "classes": classes, "limits": limits,
                                  "auth": cfg.auth.model_copy(update={"api_keys": keys})})
