"""Validation problems as the `ConfigError` a person reads: one line per problem, located by
its setting path (`classes[1] (batch).rank`), with unknown keys called unknown settings. Its
own module, knowing no section, because both a config file (`load_config`) and the command
line (`GatewayConfig.quick`) validate through it."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from tailguard.errors import ConfigError
from tailguard.config.base import fingerprint

M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], data: dict[str, Any], source: str) -> M:
    """`model` validated from `data`; every problem becomes one `ConfigError` naming `source`."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        lines = [f"{source}: invalid configuration ({e.error_count()} problem{'s' if e.error_count() > 1 else ''}):"]
        for err in e.errors(include_url=False):
            loc = _loc_text(err["loc"], data)
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown setting (check the spelling; see docs/configuration.md)"
            lines.append(f"  {loc}: {msg}" if loc else f"  {msg}")
        raise ConfigError("\n".join(lines)) from None


def _loc_text(loc: tuple[int | str, ...], data: Any) -> str:
    """`('classes', 1, 'rank')` -> `classes[1] (batch).rank`: the name makes list entries findable.
    A client key, the name of its own setting, is shown by its fingerprint: the message goes to
    logs and terminals."""
    out = ""
    node: Any = data
    after: int | str | None = None
    for part in loc:
        shown = fingerprint(part) if after == "api_keys" and isinstance(part, str) else part
        after = part
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"
        elif part == "[key]":
            out += " (as a key)"  # pydantic's marker: the mapping key itself is wrong
        else:
            out += f".{shown}" if out else str(shown)
            node = node.get(part) if isinstance(node, dict) else None
    return out
