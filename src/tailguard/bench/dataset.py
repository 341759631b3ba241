"""Prompt datasets that stand in for synthetic prompts: JSONL of OpenAI request bodies, and the
ShareGPT conversation format. Pure: parses text; `load_dataset` reads the one file it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal

import orjson

from tailguard.errors import BadRequest, ConfigError
from tailguard.wire.openai import validate_body
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS, text_tokens

Endpoint = Literal["chat", "completions"]
DatasetFormat = Literal["openai", "sharegpt"]


@dataclass(slots=True, frozen=True)
class DatasetPrompt:
    """One prompt from a dataset: an OpenAI body to send (model, stream and limits are set later)."""

    endpoint: Endpoint
    body: dict[str, Any]
    prompt_tokens: int
    max_tokens: int | None


def json_objects(lines: Iterable[str], where: str, what: str,
                 error: type[ConfigError] = ConfigError) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSON-lines file; a line that is not
    JSON, or not an object, is `error` naming the line (`what`: what a line should be)."""
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise error(f"{where}:{i}: not JSON ({e})") from None
        if not isinstance(obj, dict):
            raise error(f"{where}:{i}: each line is {what}, not {type(obj).__name__}")
        yield i, obj


def parse_openai_jsonl(text: str, where: str = "dataset") -> list[DatasetPrompt]:
    out: list[DatasetPrompt] = []
    for i, body in json_objects(text.splitlines(), where, "an OpenAI request body (a JSON object)"):
        endpoint: Endpoint = "chat" if "messages" in body else "completions"
        try:
            parsed = validate_body(body, endpoint)
        except BadRequest as e:
            raise ConfigError(f"{where}:{i}: {e.message}") from None
        out.append(DatasetPrompt(endpoint, body, parsed.prompt_tokens, parsed.max_tokens))
    if not out:
        raise ConfigError(f"{where}: no requests in the file")
    return out


def parse_sharegpt(text: str, where: str = "dataset") -> list[DatasetPrompt]:
    """First human turn as the prompt; the first reply's estimated length as max_tokens (what
    vllm bench does with ShareGPT)."""
    stripped = text.lstrip()
    try:
        rows = orjson.loads(text) if stripped.startswith("[") else [orjson.loads(x) for x in text.splitlines() if x.strip()]
    except orjson.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON or JSONL: {e}") from None
    out: list[DatasetPrompt] = []
    for row in rows:
        turns = row.get("conversations") if isinstance(row, dict) else None
        if not isinstance(turns, list):
            continue
        prompt = next((t.get("value") for t in turns if isinstance(t, dict) and t.get("from") in ("human", "user")), None)
        reply = next((t.get("value") for t in turns if isinstance(t, dict) and t.get("from") in ("gpt", "assistant")), None)
        if not isinstance(prompt, str) or not prompt:
            continue
        body = {"messages": [{"role": "user", "content": prompt}]}
        max_tokens = max(1, text_tokens(reply)) if isinstance(reply, str) and reply else None
        out.append(DatasetPrompt("chat", body, CHAT_MESSAGE_OVERHEAD_TOKENS + text_tokens(prompt), max_tokens))
    if not out:
        raise ConfigError(f"{where}: no ShareGPT conversations with a human turn")
    return out


def load_dataset(path: str | Path, fmt: DatasetFormat, base: Path | None = None) -> list[DatasetPrompt]:
    """A dataset file; a relative `path` is taken from `base` (the workload file's folder)."""
    p = Path(path)
    if not p.is_absolute() and base is not None:
        p = base / p
    if not p.is_file():
        raise ConfigError(f"dataset {p} not found")
    text = p.read_text()
    return parse_openai_jsonl(text, str(p)) if fmt == "openai" else parse_sharegpt(text, str(p))
