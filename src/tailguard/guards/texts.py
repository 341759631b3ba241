"""Where the text is in a request body and in an answer: what a guard reads, and what redaction
rewrites; pure, no I/O.

A request's text is every string under its text-bearing fields (`messages`, `prompt`, `input`,
`system`, `instructions`, and within them `content`, `text`, `output`), whatever the route: chat's
messages and their content parts, a completion's prompt (a string or a list of them), the
Responses API's input items, Anthropic's system and content blocks, an embedding's inputs.
Anything else (a model name, an image URL, a tool's schema, token ids) is not text a person wrote.
LiteLLM's guardrails read the same fields ("LiteLLM extracts text ... from any request").

    found = leaves(body)                        # [(path, text), ...]
    body2 = replaced(body, {path: "new text"})  # a copy; `body` is unchanged
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Path = tuple[str | int, ...]

_TOP = ("system", "instructions", "messages", "prompt", "input")  # in the order a model reads them
_INNER = ("content", "text", "output", "input")  # (a tuple: the order texts are read in is fixed)
_MAX_DEPTH = 8  # message > content list > block > content list > block ... (a tool result's blocks)


def leaves(body: Mapping[str, Any]) -> list[tuple[Path, str]]:
    """Every text of a request body, with the path that reaches it."""
    out: list[tuple[Path, str]] = []
    for key in _TOP:
        if key in body:
            _walk(body[key], (key,), out, 0)
    return out


def _walk(node: Any, path: Path, out: list[tuple[Path, str]], depth: int) -> None:
    if isinstance(node, str):
        if node:
            out.append((path, node))
    elif depth >= _MAX_DEPTH:
        return
    elif isinstance(node, list):
        for i, item in enumerate(node):
            _walk(item, (*path, i), out, depth + 1)
    elif isinstance(node, dict):
        for key in _INNER:
            if key in node:
                _walk(node[key], (*path, key), out, depth + 1)


def replaced(body: dict[str, Any], texts: Mapping[Path, str]) -> dict[str, Any]:
    """A copy of `body` with the text at each path replaced; what no path reaches is shared."""
    out = dict(body)
    for path, text in texts.items():
        _put(out, path, text)
    return out


def _put(root: dict[str, Any], path: Path, text: str) -> None:
    node: Any = root
    for i, key in enumerate(path):
        if i == len(path) - 1:
            node[key] = text
            return
        child = node[key]
        child = list(child) if isinstance(child, list) else dict(child)  # copied on the way down
        node[key] = child
        node = child


# --- answers --------------------------------------------------------------------------------------

def answer_texts(answer: Mapping[str, Any]) -> list[tuple[int, str]]:
    """A non-stream answer's texts by choice index: chat's `message.content`, a completion's `text`."""
    out: list[tuple[int, str]] = []
    for n, choice in enumerate(_choices(answer)):
        text = _choice_text(choice)
        if text:
            out.append((_index(choice, n), text))
    return out


def set_answer_text(answer: dict[str, Any], index: int, text: str, finish_reason: str | None = None) -> None:
    """Replace one choice's text (and its finish reason, when given) in place."""
    for n, choice in enumerate(_choices(answer)):
        if _index(choice, n) != index:
            continue
        message = choice.get("message")
        if isinstance(message, dict):
            message["content"] = text
        else:
            choice["text"] = text
        if finish_reason is not None:
            choice["finish_reason"] = finish_reason


def chunk_texts(chunk: Mapping[str, Any]) -> list[tuple[int, str]]:
    """A stream chunk's texts by choice index: chat's `delta.content`, a completion's `text`."""
    out: list[tuple[int, str]] = []
    for n, choice in enumerate(_choices(chunk)):
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(text, str) and text:
            out.append((_index(choice, n), text))
    return out


def set_chunk_text(chunk: dict[str, Any], index: int, text: str) -> None:
    for n, choice in enumerate(_choices(chunk)):
        if _index(choice, n) == index:
            delta = choice.get("delta")
            if isinstance(delta, dict):
                delta["content"] = text
            else:
                choice["text"] = text


def _choices(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    choices = obj.get("choices")
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


def _choice_text(choice: Mapping[str, Any]) -> str | None:
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return text if isinstance(text, str) else None


def _index(choice: Mapping[str, Any], n: int) -> int:
    i = choice.get("index")
    return i if isinstance(i, int) and not isinstance(i, bool) else n
