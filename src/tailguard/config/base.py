"""What every section of the gateway's config shares, in a module of its own so that each
section imports it and none imports another: the base model (unknown keys are errors, a
validated config never changes), the front's defaults the sections start from, and
`fingerprint`, how a secret is named wherever it would otherwise be shown."""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib.util
import os
import secrets
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tailguard.front import params as fp
from tailguard.front.adaptive import AdaptiveParams

# The front's defaults (tailguard.front.params), so each default number lives in one place.
_CLS = fp.ClassSpec(name="")
_INTAKE = fp.IntakeParams(classes=())
_OUTPUT = fp.OutputEstimateParams()
_QUEUE = fp.QueueParams()
_PREEMPT = fp.PreemptionParams()
_BACKEND = fp.BackendSpec(name="")
_ADAPTIVE = AdaptiveParams()
_HEALTH = fp.HealthParams()
_RETRY = fp.RetryParams()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The optional extras of pyproject.toml a setting may need, each by a module it installs.
EXTRAS = {"redis": "redis", "postgres": "psycopg", "otel": "opentelemetry.exporter.otlp.proto.http"}


def require_extra(extra: str) -> None:
    """A validation problem (ValueError, said under the setting that needs it) when `extra` is not
    installed, saying what to install: checked as the config is read, not as the gateway first
    reaches for the library and dies with a traceback."""
    try:
        found = importlib.util.find_spec(EXTRAS[extra]) is not None
    except ImportError:  # its parent package is missing (or blocked)
        found = False
    if not found:
        raise ValueError(f"needs the `{extra}` extra, which is not installed: pip install 'tailguard[{extra}]'")


# Where the per-install fingerprint key is kept, unless TAILGUARD_FINGERPRINT_KEY gives one.
FINGERPRINT_KEY_ENV = "TAILGUARD_FINGERPRINT_KEY"


def fingerprint(secret: str) -> str:
    """How a secret (a client's or a backend's key) is named in settings, metrics, logs and
    errors: a keyed hash (HMAC-SHA256 under this install's own random key, 64 bits shown), so a
    weak key cannot be found again from its fingerprint by hashing guesses offline, as an
    unkeyed SHA-256 cut to 32 bits allowed."""
    digest = hmac.new(_fingerprint_key(), secret.encode(), hashlib.sha256).hexdigest()
    return "key:" + digest[:16]


@functools.cache
def _fingerprint_key() -> bytes:
    """This install's fingerprint key: `$TAILGUARD_FINGERPRINT_KEY`, else a random key made once
    and kept private in `$XDG_STATE_HOME/tailguard/fingerprint.key` (~/.local/state), so the
    gateway, its CLI and a later run name a key alike."""
    given = os.environ.get(FINGERPRINT_KEY_ENV)
    if given:
        return given.encode()
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "tailguard"
    path = state / "fingerprint.key"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = secrets.token_hex(32).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # made meanwhile by another process: theirs is the key
        return path.read_bytes()
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key
