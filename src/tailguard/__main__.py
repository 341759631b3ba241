"""`python -m tailguard` and the `tailguard` command.

`pip install tailguard` is the client alone; the command line (gateway, simulator, bench) needs
`tailguard[full]`. Without it, the command says so in one line instead of a traceback.
"""

from __future__ import annotations

import sys

# The import names of the `full` extra's packages (pyproject.toml): a missing one means the light install.
FULL_ONLY = frozenset({"aiohttp", "uvloop", "orjson", "pydantic", "yaml", "prometheus_client", "typer", "click",
                       "rich", "numpy", "matplotlib", "jinja2"})


def main() -> None:
    try:
        from tailguard.cli import main as run

        run()  # a verb imports its heavy parts when it runs: those may be missing too
    except ModuleNotFoundError as e:
        if e.name not in FULL_ONLY:
            raise
        sys.exit(f"tailguard: the command line needs the full install (no module {e.name!r}): "
                 "pip install 'tailguard[full]'")


if __name__ == "__main__":
    main()
