"""Reading a `tailguard.yaml` from disk: `load_config(path)`. Apart from the models because only
this step touches files and YAML; an unreadable file, bad YAML or a top level that is no mapping
each become a `ConfigError` naming the file, like the validation problems after them."""

from __future__ import annotations

from pathlib import Path

import yaml

from tailguard.errors import ConfigError
from tailguard.gateway.config.gateway import GatewayConfig
from tailguard.gateway.config.problems import validate


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a `tailguard.yaml`; every problem becomes a `ConfigError` naming file and field."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config file: {e.strerror or e}") from None
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
    return validate(GatewayConfig, data, str(p))
