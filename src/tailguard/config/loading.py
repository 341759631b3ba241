"""Reading a `tailguard.yaml` from disk: `load_config(path)`. Apart from the models because only
this step touches files and YAML; an unreadable file, bad YAML or a top level that is no mapping
each become a `ConfigError` naming the file, like the validation problems after them.

`auth.api_keys_file` names a second file of keys, in the shape of `auth.api_keys` (a Kubernetes
Secret mounted as a file, kept out of the config that goes into version control): its keys join
the config's as it is read (and at each reload), so every check on keys applies to them, and the
config recorded as applied holds them as keys, not as the file's name, so a rollback brings back
the keys that ran."""

from __future__ import annotations

from pathlib import Path

import yaml

from tailguard.errors import ConfigError
from tailguard.config.gateway import GatewayConfig
from tailguard.config.problems import validate


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a `tailguard.yaml`; every problem becomes a `ConfigError` naming file and field."""
    p = Path(path)
    data = _mapping(p, "config file")
    auth = data.get("auth")
    if isinstance(auth, dict) and auth.get("api_keys_file") is not None:
        data = {**data, "auth": _with_key_file(auth, p.parent)}
    return validate(GatewayConfig, data, str(p))


def names_key_file(path: Path) -> bool:
    """Whether the config in `path` reads its keys from `auth.api_keys_file`."""
    auth = _mapping(path, "config file").get("auth")
    return isinstance(auth, dict) and auth.get("api_keys_file") is not None


def _with_key_file(auth: dict[str, object], base: Path) -> dict[str, object]:
    """`auth` with the keys of its `api_keys_file` (relative to the config's folder) among its
    `api_keys`; a key in both is a `ConfigError` (which settings would count?)."""
    rest = dict(auth)
    name = rest.pop("api_keys_file")
    if not isinstance(name, str):
        raise ConfigError(f"auth.api_keys_file: expected a file name, got {name!r}")
    f = base / Path(name).expanduser()
    extra = _mapping(f, "key file (auth.api_keys_file)")
    keys = rest.get("api_keys") or {}
    if not isinstance(keys, dict):
        return rest  # the model names what is wrong with it
    both = [k for k in extra if k in keys]
    if both:
        raise ConfigError(f"{f}: {len(both)} key(s) are also in the config's auth.api_keys; list each key once")
    rest["api_keys"] = {**keys, **{str(k): v if v is not None else {} for k, v in extra.items()}}
    return rest


def _mapping(p: Path, what: str) -> dict[str, object]:
    """The YAML mapping in `p`; an unreadable file, bad YAML or no mapping is a `ConfigError`."""
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read {what}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = ""
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{p}: not valid YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of settings, got {type(data).__name__}")
    return data
