"""A stored config's settings written back into the user's own YAML, keeping what the user wrote
around them (comments, key order, quoting, flow or block style); pure, text in and text out.

`tailguard config rollback --write` used to copy the stored file over the user's: the settings
were right, but every comment and every key written out at its default was gone. Here the stored
settings are merged into the user's document as ruamel.yaml reads it round trip (the one YAML
library that keeps comments; PyYAML drops them):

- a key both hold keeps its place and comment, and its value unless the value differs (a number
  equal in value, `10` for `10.0`, is left as written);
- a key only the user's file holds is removed (the stored config left it at its default), and
  the comment lines under it, which introduce the next key, move to that key;
- a key only the stored config holds is added at the end of its mapping;
- a list of named entries (`classes`, `backends`) is matched by `name`, so an entry that stays
  keeps its comments wherever it moved; any other list is replaced when it differs.

The caller checks the result: loaded, it must be the stored config (the same digest), or the
file is left alone (`rollback` says so and why).
"""

from __future__ import annotations

import io
from typing import Any


def rewritten(text: str, settings: dict[str, Any]) -> str:
    """`text` (a YAML mapping) with `settings` (a stored config as written) merged in."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError
    from ruamel.yaml.util import load_yaml_guess_indent

    yaml = YAML()  # round trip
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold a long line the user kept on one
    try:
        _, sequence, offset = load_yaml_guess_indent(text)
        yaml.indent(mapping=_mapping_indent(text), sequence=sequence, offset=offset)
        doc = yaml.load(text)
    except YAMLError as e:  # what PyYAML reads ruamel.yaml may not (a key given twice)
        raise ValueError(f"ruamel.yaml cannot read it: {str(e).splitlines()[0]}") from None
    if doc is None:
        doc = yaml.load("{}\n")
    if not hasattr(doc, "keys"):
        raise ValueError("the file's top level is not a mapping")
    _merge_map(doc, settings)
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue()


def _mapping_indent(text: str) -> int:
    """How far the file indents a mapping under its key (2 unless it shows another)."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for parent, child in zip(lines, lines[1:]):
        depth = len(parent) - len(parent.lstrip())
        inner = len(child) - len(child.lstrip())
        if parent.rstrip().endswith(":") and not child.lstrip().startswith("- ") and inner > depth:
            return inner - depth
    return 2


def _merge_map(node: Any, want: dict[str, Any]) -> None:
    for key in [k for k in node if k not in want]:
        _drop(node, key)
    for key, value in want.items():
        if key in node:
            node[key] = _merged(node[key], value)
        else:
            node[key] = value


def _drop(node: Any, key: Any) -> None:
    """Remove `key`; the comment lines after its own (those above the next key) stay, on that key."""
    keys = list(node)
    after = keys[keys.index(key) + 1] if keys.index(key) + 1 < len(keys) else None
    token = node.ca.items.get(key, [None, None, None, None])[2]
    rest = token.value.partition("\n")[2] if token is not None else ""
    del node[key]
    if after is None or not rest.strip():
        return
    lines = [line.strip() for line in rest.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in lines)
    node.yaml_set_comment_before_after_key(after, before=text, indent=node.lc.key(after)[1])


def _merged(have: Any, want: Any) -> Any:
    """`want`, reusing `have` (and what it carries: comments, style) where it can."""
    if isinstance(want, dict) and hasattr(have, "keys"):
        _merge_map(have, want)
        return have
    if isinstance(want, list) and isinstance(have, list):
        return _merged_list(have, want)
    return have if _same(have, want) else want


def _merged_list(have: list[Any], want: list[Any]) -> list[Any]:
    named = {_name(item): item for item in have if _name(item) is not None}
    if len(named) == len(have) and all(_name(w) is not None for w in want):
        kept = [_merged(named[_name(w)], w) if _name(w) in named else w for w in want]
        if [_name(k) for k in kept] == [_name(h) for h in have]:
            return have  # the same entries in the same order: merged in place, every comment kept
        have[:] = kept
        return have
    if len(have) == len(want) and all(_same(h, w) for h, w in zip(have, want)):
        return have
    have[:] = want
    return have


def _name(item: Any) -> str | None:
    name = item.get("name") if hasattr(item, "keys") else None
    return name if isinstance(name, str) else None


def _same(have: Any, want: Any) -> bool:
    """Equal as settings: `10` and `10.0` are, `true` and `1` are not."""
    if isinstance(have, bool) or isinstance(want, bool):
        return type(have) is type(want) and bool(have) == bool(want)
    if isinstance(have, (int, float)) and isinstance(want, (int, float)):
        return float(have) == float(want)
    return bool(have == want)
