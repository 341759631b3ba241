"""Guards by stage and action, their order, and what a failing or hanging check does (on_error)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from tailguard.clock import monotonic
from tailguard.errors import ContentBlocked, GuardUnavailable
from tailguard.guards.check import Finding, PatternCheck
from tailguard.guards.guard import Guard, GuardSet
from tailguard.guards.moderation import CheckFailed
from tailguard.guards.patterns import Finder
from tailguard.wire.openai import chat_chunk, completion_chunk

PII = Finder.of(["email", "card"])


class Stats:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def observe(self, guard: str, stage: str, seconds: float, verdict: str) -> None:
        assert 0 <= seconds < 5
        self.seen.append((guard, stage, verdict))


class Judged:
    """A check of the test's own that says what it is told to, and remembers what it read."""

    step_chars = 1

    def __init__(self, flagged: bool = True, fail: bool = False, hang: bool = False) -> None:
        self.flagged, self.fail, self.hang = flagged, fail, hang
        self.read: list[list[str]] = []

    def inline(self, texts: Sequence[str]) -> Finding | None:
        return None

    async def run(self, texts: Sequence[str]) -> Finding:
        self.read.append(list(texts))
        if self.hang:
            await asyncio.Event().wait()
        if self.fail:
            raise CheckFailed("answered 500")
        return Finding(self.flagged, ("violence",) if self.flagged else ())


def guard(name: str, stage: str, action: str, check: Any, on_error: str = "closed", timeout_s: float = 1.0,
          **kw: Any) -> Guard:
    return Guard(name, stage, action, on_error, timeout_s, 32, check, **kw)


def chat(*texts: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": t} for t in texts]}


# --- input ----------------------------------------------------------------------------------

async def test_input_block() -> None:
    stats = Stats()
    gs = GuardSet([guard("pii", "input", "block", PatternCheck(PII))], stats)
    verdicts: list[str] = []
    with pytest.raises(ContentBlocked) as e:
        await gs.screen_input(chat("hi", "my card is 4111 1111 1111 1111"), "interactive", "m", verdicts)
    assert (e.value.status, e.value.code) == (400, "content_policy_violation")
    assert "'pii' (card)" in e.value.message and "4111" not in e.value.message
    assert verdicts == ["pii:block"] and stats.seen == [("pii", "input", "block")]


async def test_input_redact_copies_the_body() -> None:
    gs = GuardSet([guard("pii", "input", "redact", PatternCheck(PII))], Stats())
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "mail a@b.org"},
                                                                  {"type": "image_url", "image_url": {"url": "x@y.org"}}]}]}
    before = orjson.dumps(body)
    out = await gs.screen_input(body, "interactive", "m", [])
    assert out is not None and out["messages"][0]["content"][0]["text"] == "mail [EMAIL]"
    assert out["messages"][0]["content"][1] == body["messages"][0]["content"][1]  # not text: untouched
    assert orjson.dumps(body) == before


async def test_input_flag_goes_on() -> None:
    verdicts: list[str] = []
    gs = GuardSet([guard("mod", "input", "flag", Judged())], Stats())
    assert await gs.screen_input(chat("hello"), "interactive", "m", verdicts) is None
    assert verdicts == ["mod:flag"]


async def test_a_clean_input_passes_and_is_counted() -> None:
    stats = Stats()
    gs = GuardSet([guard("pii", "input", "block", PatternCheck(PII))], stats)
    verdicts: list[str] = []
    assert await gs.screen_input(chat("nothing here"), "interactive", "m", verdicts) is None
    assert verdicts == [] and stats.seen == [("pii", "input", "pass")]


async def test_redaction_comes_before_the_guards_after_it() -> None:
    """A moderation service listed after a personal-data redaction never reads the address."""
    mod = Judged(flagged=False)
    gs = GuardSet([guard("pii", "input", "redact", PatternCheck(PII)), guard("mod", "input", "block", mod)], Stats())
    await gs.screen_input(chat("I am a@b.org"), "interactive", "m", [])
    assert mod.read == [["I am [EMAIL]"]]


async def test_classes_and_models_select_the_guards() -> None:
    gs = GuardSet([guard("only-batch", "input", "block", Judged(), classes=frozenset({"batch"})),
                   guard("only-m2", "input", "block", Judged(), models=frozenset({"m2"}))], Stats())
    assert await gs.screen_input(chat("x"), "interactive", "m", []) is None
    with pytest.raises(ContentBlocked, match="only-batch"):
        await gs.screen_input(chat("x"), "batch", "m", [])
    with pytest.raises(ContentBlocked, match="only-m2"):
        await gs.screen_input(chat("x"), "interactive", "m2", [])


@pytest.mark.parametrize("check", [Judged(fail=True), Judged(hang=True)], ids=["failing", "hanging"])
async def test_on_error_open_goes_on_within_the_timeout(check: Judged) -> None:
    stats = Stats()
    gs = GuardSet([guard("mod", "input", "block", check, on_error="open", timeout_s=0.05)], stats)
    verdicts: list[str] = []
    started = monotonic()
    async with asyncio.timeout(5):
        assert await gs.screen_input(chat("x"), "interactive", "m", verdicts) is None
    assert monotonic() - started < 1.0
    assert verdicts == ["mod:error_open"] and stats.seen == [("mod", "input", "error_open")]


@pytest.mark.parametrize("check", [Judged(fail=True), Judged(hang=True)], ids=["failing", "hanging"])
async def test_on_error_closed_refuses_within_the_timeout(check: Judged) -> None:
    gs = GuardSet([guard("mod", "input", "block", check, on_error="closed", timeout_s=0.05)], Stats())
    verdicts: list[str] = []
    async with asyncio.timeout(5):
        with pytest.raises(GuardUnavailable) as e:
            await gs.screen_input(chat("x"), "interactive", "m", verdicts)
    assert (e.value.status, e.value.code, e.value.retry_after_s) == (503, "guard_unavailable", 1.0)
    assert verdicts == ["mod:error_closed"]


# --- output, whole --------------------------------------------------------------------------

def answer(text: str) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


@pytest.mark.parametrize("action,expect,reason,finish", [
    ("block", "", "content_filter", "content_filter"),
    ("redact", "write to [EMAIL]", None, "stop"),
    ("flag", "write to a@b.org", None, "stop"),
])
async def test_whole_answer_by_action(action: str, expect: str, reason: str | None, finish: str) -> None:
    verdicts: list[str] = []
    gs = GuardSet([guard("pii", "output", action, PatternCheck(PII))], Stats())
    screen = gs.output("chat", "interactive", "m", stream=False, verdicts=verdicts)
    assert screen is not None
    out = await screen.whole(answer("write to a@b.org"))
    assert out["choices"][0]["message"]["content"] == expect
    assert out["choices"][0]["finish_reason"] == finish
    assert screen.reason == reason and verdicts == [f"pii:{action}"]


@pytest.mark.parametrize("on_error,withheld", [("open", False), ("closed", True)])
async def test_whole_answer_on_error(on_error: str, withheld: bool) -> None:
    gs = GuardSet([guard("mod", "output", "block", Judged(hang=True), on_error=on_error, timeout_s=0.05)], Stats())
    screen = gs.output("completions", "interactive", "m", stream=False, verdicts=[])
    assert screen is not None
    body = {"choices": [{"index": 0, "text": "fine", "finish_reason": "length"}]}
    out = await screen.whole(body)
    assert out["choices"][0]["text"] == ("" if withheld else "fine")
    assert screen.reason == ("content_filter" if withheld else None)


def test_output_guards_read_openai_shapes_only() -> None:
    gs = GuardSet([guard("pii", "output", "block", PatternCheck(PII))], Stats())
    assert gs.output("messages", "interactive", "m", stream=True, verdicts=[]) is None
    assert gs.output("chat", "interactive", "m", stream=True, verdicts=[]) is not None
    assert GuardSet([guard("pii", "input", "block", PatternCheck(PII))], Stats()).output(
        "chat", "interactive", "m", stream=True, verdicts=[]) is None


# --- output, a stream -----------------------------------------------------------------------

def sse(*chunks: bytes) -> list[bytes]:
    return [b"data: " + c + b"\n\n" for c in chunks]


def texts_of(data: bytes) -> tuple[str, list[str | None], list[Any]]:
    """The text, finish reasons and errors in the events the client got."""
    text, reasons, errors = [], [], []
    for block in data.split(b"\n\n"):
        if not block.startswith(b"data: ") or block == b"data: [DONE]":
            continue
        obj = orjson.loads(block[6:])
        if "error" in obj:
            errors.append(obj["error"])
            continue
        for c in obj["choices"]:
            text.append(c.get("delta", {}).get("content") or c.get("text") or "")
            reasons.append(c.get("finish_reason"))
    return "".join(text), reasons, errors


async def run_stream(gs: GuardSet, events: list[bytes], endpoint: str = "chat") -> tuple[bytes, Any, list[bytes]]:
    screen = gs.output(endpoint, "interactive", "m", stream=True, verdicts=[])
    assert screen is not None
    sent: list[bytes] = []
    for k, ev in enumerate(events):
        out, ended = await screen.feed(ev, k == len(events) - 1)
        sent.append(out)
        if ended:
            break
    return b"".join(sent), screen, sent


def chat_stream(*pieces: str) -> list[bytes]:
    return sse(chat_chunk("c1", "m", 1, role="assistant"),
               *(chat_chunk("c1", "m", 1, content=p) for p in pieces),
               chat_chunk("c1", "m", 1, finish_reason="stop")) + [b"data: [DONE]\n\n"]


async def test_stream_redacts_a_span_split_over_chunks() -> None:
    gs = GuardSet([guard("pii", "output", "redact", PatternCheck(PII))], Stats())
    out, screen, sent = await run_stream(gs, chat_stream("write to ja", "ne.doe@exa", "mple.com to", "day, please"))
    text, reasons, errors = texts_of(out)
    assert text == "write to [EMAIL] today, please"
    assert reasons[-1] == "stop" and not errors and screen.reason is None
    assert out.endswith(b"data: [DONE]\n\n")


async def test_stream_holds_text_the_window_behind() -> None:
    """With a window of 32 characters, a chunk goes out once 32 more have come after it."""
    gs = GuardSet([guard("pii", "output", "redact", PatternCheck(PII))], Stats())
    out, _, sent = await run_stream(gs, chat_stream(*["0123456789"] * 8))
    assert texts_of(sent[0]) == ("", [None], [])  # the role chunk, at once
    assert [len(texts_of(s)[0]) for s in sent[1:9]] == [0, 0, 0, 0, 10, 10, 10, 10]
    assert texts_of(out)[0] == "0123456789" * 8


async def test_stream_block_ends_with_content_filter_and_an_error() -> None:
    gs = GuardSet([guard("deny", "output", "block", PatternCheck(Finder.denying("deny", ["secret plan"])))], Stats())
    out, screen, sent = await run_stream(gs, chat_stream(*["a" * 10] * 4, " the secret", " plan is", " more"))
    text, reasons, errors = texts_of(out)
    assert text == "a" * 10  # what was 32 characters behind; the rest, held, was dropped
    assert reasons[-1] == "content_filter" and errors[0]["code"] == "content_filter"
    assert screen.reason == "content_filter" and len(sent) == 7  # it ended with " plan is"
    assert await screen.feed(b"data: [DONE]\n\n", True) == (b"", True)


async def test_stream_flag_holds_nothing() -> None:
    verdicts: list[str] = []
    gs = GuardSet([guard("pii", "output", "flag", PatternCheck(PII))], Stats())
    screen = gs.output("completions", "interactive", "m", stream=True, verdicts=verdicts)
    assert screen is not None
    first = b"data: " + completion_chunk("c1", "m", 1, text="mail a@b.org") + b"\n\n"
    out, ended = await screen.feed(first, False)
    assert out == first and not ended and verdicts == ["pii:flag"]


@pytest.mark.parametrize("on_error,withheld", [("open", False), ("closed", True)])
async def test_stream_on_error(on_error: str, withheld: bool) -> None:
    gs = GuardSet([guard("mod", "output", "block", Judged(fail=True), on_error=on_error)], Stats())
    out, screen, _ = await run_stream(gs, chat_stream("hello", " there"))
    text, reasons, _ = texts_of(out)
    assert (reasons[-1] == "content_filter") is withheld
    assert text == ("" if withheld else "hello there")


async def test_stream_moderation_runs_every_half_window() -> None:
    mod = Judged(flagged=False)
    mod.step_chars = 16
    gs = GuardSet([guard("mod", "output", "block", mod)], Stats())
    out, _, _ = await run_stream(gs, chat_stream(*["0123456789"] * 6))
    # At 20, 40 and 60 characters (each waits for 16 new ones); at the end nothing new was left.
    assert [len(r[0]) for r in mod.read] == [20, 40, 60]
    assert texts_of(out)[0] == "0123456789" * 6


async def test_a_stream_holds_a_bounded_number_of_bytes() -> None:
    """Events without text behind a held chunk (a backend's comments, say) are not held without
    bound: past the bound, what came is checked as if the answer ended there, and released."""
    gs = GuardSet([guard("pii", "output", "redact", PatternCheck(PII))], Stats(), max_event_bytes=1024)
    screen = gs.output("chat", "interactive", "m", stream=True, verdicts=[])
    assert screen is not None
    out, _ = await screen.feed(b"data: " + chat_chunk("c1", "m", 1, content="mail a@b.org") + b"\n\n", False)
    assert out == b""  # held: 32 characters behind
    filler = b"data: " + chat_chunk("c1", "m", 1, role="assistant") + b"\n\n"
    sent = []
    for _ in range(20_000):
        out, ended = await screen.feed(filler, False)
        sent.append(out)
        assert not ended
    assert texts_of(b"".join(sent))[0] == "mail [EMAIL]"
    assert screen._held_bytes <= 1 << 20
