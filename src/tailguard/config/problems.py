"""Validation problems as the `ConfigError` a person reads: one line per problem, located by
its setting path (`classes[1] (batch).rank`; a client key by its fingerprint and its name,
`auth.api_keys.key:2c27... (web-app).rpm_limt`), with unknown keys called unknown settings and
the nearest known one offered (`did you mean aging_s?`). Its own module, knowing no section,
because both a config file (`load_config`) and the command line (`GatewayConfig.quick`) validate
through it."""

from __future__ import annotations

import difflib
import inspect
from typing import Any, TypeVar, get_args, get_origin

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
                near = _nearest(model, err["loc"])
                hint = f"did you mean {near}? " if near else "check the spelling; "
                msg = f"unknown setting ({hint}see docs/configuration.md)"
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
            if shown != part and isinstance(node, dict) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"  # a key's fingerprint alone is hard to find in the file
    return out


def _nearest(model: type[BaseModel], loc: tuple[int | str, ...]) -> str | None:
    """The known setting nearest to an unknown one's name (a typo, a missing `_s`), or None."""
    fields = _fields_at(model, loc[:-1])
    name = loc[-1] if loc else None
    if not isinstance(name, str):
        return None
    found = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
    return found[0] if found else None


def _fields_at(model: type[BaseModel], path: tuple[int | str, ...]) -> list[str]:
    """The setting names of the section at `path` (a list index or a mapping key steps into the
    entry's section)."""
    ann: Any = model
    for part in path:
        if get_origin(ann) in (list, dict, tuple):
            ann = _model_in(ann)  # `part` is an entry's index or key
            continue
        section = _model_in(ann)
        field = section.model_fields.get(part) if section is not None and isinstance(part, str) else None
        if field is None:
            return []
        ann = field.annotation
    section = _model_in(ann)
    return list(section.model_fields) if section is not None else []


def _model_in(ann: Any) -> type[BaseModel] | None:
    """The section model an annotation holds: itself, or inside an Optional, a list or a dict."""
    if inspect.isclass(ann) and issubclass(ann, BaseModel):
        return ann
    for arg in get_args(ann):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
