"""docs/configuration.md's table of the default classes says what the code does (it once gave
interactive a 30 s queue wait where the code and the field's own row say 10)."""

from __future__ import annotations

from pathlib import Path

from tailguard.config import GatewayConfig

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _cell(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:g}" if isinstance(value, float) and value != 1.0 else str(value)


def test_the_defaults_table_is_the_codes() -> None:
    lines = DOCS.read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| class | rank |"))
    columns = [c.strip() for c in lines[head].strip("|").split("|")]
    rows = {}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = dict(zip(columns[1:], cells[1:]))
    defaults = GatewayConfig.model_validate({"backends": [{"name": "b", "url": "http://127.0.0.1:1"}]}).classes
    assert set(rows) == {c.name for c in defaults}
    for c in defaults:
        for field, shown in rows[c.name].items():
            assert shown == _cell(getattr(c, field)), (c.name, field)
