"""The `tailguard` command: one module per verb, each registering itself on the typer app.

Verb modules import their heavy parts inside the command function, so `tailguard --help`
stays fast and importing one verb does not pull in the others. Help is click's plain layout
(`rich_markup_mode=None`): rich's boxed panels cut option names at 80 columns and show a flag as
`<bool>`, as if it took a value; the plain one wraps the help text and keeps every name whole.
"""

from __future__ import annotations

import importlib

from typing import Optional

import typer

VERB_MODULES: tuple[str, ...] = ("audit", "batch", "bench", "config", "demo", "doctor", "replay", "serve", "sim", "sweep", "top")

app = typer.Typer(
    name="tailguard",
    help="Fix the tail latency of self-hosted LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _register() -> None:
    for name in VERB_MODULES:
        importlib.import_module(f"tailguard.cli.{name}").register(app)


def _version(show: bool) -> None:
    if show:
        from tailguard import __version__

        typer.echo(f"tailguard {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True,
                                           help="Print the version and exit."),
) -> None:
    """tailguard: a priority gateway, an honest load generator and an engine simulator."""


def listen_error(host: str, port: int, e: OSError, option: str = "--port") -> str:
    """One line for a port that cannot be had, and what to do: asyncio's message repeats the
    address, keep its cause."""
    cause = str(e.strerror or e).rsplit(": ", 1)[-1]
    return f"cannot listen on {host}:{port}: {cause}; choose another with {option} (0 picks a free one)"


def main() -> None:
    _register()
    app()
