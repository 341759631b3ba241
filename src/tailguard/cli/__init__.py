"""The `tailguard` command: one module per verb, each registering itself on the typer app.

Verb modules import their heavy parts inside the command function, so `tailguard --help`
stays fast and importing one verb does not pull in the others.
"""

from __future__ import annotations

import importlib

import typer

VERB_MODULES: tuple[str, ...] = ("bench", "demo", "serve", "sim")

app = typer.Typer(
    name="tailguard",
    help="Fix the tail latency of self-hosted LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    for name in VERB_MODULES:
        importlib.import_module(f"tailguard.cli.{name}").register(app)


@app.callback()
def _root() -> None:
    """tailguard: a priority gateway, an honest load generator and an engine simulator."""


def main() -> None:
    _register()
    app()
