"""`tailguard batch submit FILE | status ID | results ID | retry ID | cancel ID`: a thin client of
a gateway's Batches API (the openai SDK against `--url`), with a progress bar while it waits.
Nothing here runs a batch: the gateway does, and keeps going when this command stops."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types import Batch

FINAL = ("completed", "failed", "expired", "cancelled")
POLL_S = 1.0

batch_app = typer.Typer(help="Submit and follow batch jobs on a gateway (OpenAI's Batches API).", no_args_is_help=True,
                        rich_markup_mode=None)

_URL = typer.Option(os.environ.get("TAILGUARD_URL", "http://127.0.0.1:8080"), "--url",
                    help="The gateway's base URL (env TAILGUARD_URL).")
_KEY = typer.Option(None, "--api-key", help="API key (env OPENAI_API_KEY; none if the gateway needs none).")


def _client(url: str, api_key: str | None) -> OpenAI:
    from openai import OpenAI

    return OpenAI(base_url=url.rstrip("/") + "/v1", api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
                  max_retries=3)


def _say(b: Batch) -> None:
    counts = b.request_counts
    done = f"{counts.completed} completed, {counts.failed} failed of {counts.total}" if counts else "no lines yet"
    typer.echo(f"{b.id}  {b.status}  {done}")
    for err in (b.errors.data or []) if b.errors else []:
        typer.echo(f"  line {err.line}: {err.code}: {err.message}", err=True)
    if b.output_file_id or b.error_file_id:
        typer.echo(f"  output {b.output_file_id or '-'}  errors {b.error_file_id or '-'}")


def _follow(client: OpenAI, batch_id: str) -> Batch:
    """Poll until the batch ends, with a progress bar of its lines."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  transient=True) as bar:
        task = bar.add_task(batch_id, total=None)
        while True:
            b = client.batches.retrieve(batch_id)
            c = b.request_counts
            if c is not None and c.total:
                bar.update(task, total=c.total, completed=c.completed + c.failed, description=f"{batch_id} {b.status}")
            if b.status in FINAL:
                return b
            time.sleep(POLL_S)


def _answered(command: Callable[..., None]) -> Callable[..., None]:
    """The gateway's refusal (its OpenAI error message) as one line and exit status 1, not a traceback."""
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        import openai

        try:
            command(*args, **kwargs)
        except openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            typer.echo(f"error: {e.status_code}: {body.get('message') or e.message}", err=True)
            raise typer.Exit(1) from None
        except openai.APIConnectionError as e:
            typer.echo(f"error: cannot reach the gateway: {e}", err=True)
            raise typer.Exit(1) from None
    return run


def _ended(b: Batch) -> None:
    _say(b)
    if b.status != "completed":
        raise typer.Exit(1)


@batch_app.command("submit")
@_answered
def submit(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="Input JSONL, OpenAI's batch format."),
           endpoint: str = typer.Option("/v1/chat/completions", help="/v1/chat/completions or /v1/completions."),
           window: str = typer.Option("24h", "--window", help="completion_window."),
           wait: bool = typer.Option(False, "--wait", help="Follow it to its end with a progress bar."),
           url: str = _URL, api_key: Optional[str] = _KEY) -> None:
    """Upload FILE and start a batch of it; prints the batch's id."""
    client = _client(url, api_key)
    with file.open("rb") as f:
        uploaded = client.files.create(file=(file.name, f), purpose="batch")
    b = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint,  # type: ignore[arg-type]
                              completion_window=window)  # type: ignore[arg-type]
    typer.echo(b.id)
    if wait:
        _ended(_follow(client, b.id))


@batch_app.command("status")
@_answered
def status(batch_id: str, watch: bool = typer.Option(False, "--watch", help="Follow it to its end."),
           url: str = _URL, api_key: Optional[str] = _KEY) -> None:
    """The batch's status and counts (with --watch, a progress bar until it ends)."""
    client = _client(url, api_key)
    _say(_follow(client, batch_id) if watch else client.batches.retrieve(batch_id))


@batch_app.command("results")
@_answered
def results(batch_id: str, errors: bool = typer.Option(False, "--errors", help="The error file instead."),
            output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write here instead of stdout."),
            url: str = _URL, api_key: Optional[str] = _KEY) -> None:
    """The batch's output file (or error file), as JSONL."""
    client = _client(url, api_key)
    b = client.batches.retrieve(batch_id)
    file_id = b.error_file_id if errors else b.output_file_id
    if file_id is None:
        typer.echo(f"{batch_id} ({b.status}) has no {'error' if errors else 'output'} file", err=True)
        raise typer.Exit(1)
    data = client.files.content(file_id).content
    if output is None:
        sys.stdout.buffer.write(data)
    else:
        output.write_bytes(data)


@batch_app.command("retry")
@_answered
def retry(batch_id: str, window: Optional[str] = typer.Option(None, "--window", help="A new completion_window."),
          wait: bool = typer.Option(False, "--wait", help="Follow the new batch to its end."),
          url: str = _URL, api_key: Optional[str] = _KEY) -> None:
    """A new batch of exactly the lines of BATCH_ID that failed, expired or were cancelled; prints its id."""
    from openai.types import Batch

    client = _client(url, api_key)
    body: dict[str, Any] = {} if window is None else {"completion_window": window}
    b = client.post(f"/batches/{batch_id}/retry", body=body, cast_to=Batch)
    typer.echo(b.id)
    if wait:
        _ended(_follow(client, b.id))


@batch_app.command("cancel")
@_answered
def cancel(batch_id: str, url: str = _URL, api_key: Optional[str] = _KEY) -> None:
    """Cancel the batch: lines not yet run end as batch_cancelled; what finished is kept."""
    _say(_client(url, api_key).batches.cancel(batch_id))


def register(app: typer.Typer) -> None:
    app.add_typer(batch_app, name="batch")
