"""Output guards on one request's answer: the whole answer of a non-stream request, and a stream
as it goes, over a sliding window (`guards.window`), for OpenAI's chat and completion shapes.

A stream's events are held in order; each choice's text goes into its window. A guard checks
when enough new text has come for it (a pattern check: every chunk; a moderation service: every
`window_chars / 2` characters) and at the end. Events are released, in order, once every guard
that blocks or redacts has checked their text with `window_chars` of lookahead; an event whose
text holds redacted spans is sent rewritten. A block (or a guard failing closed) ends the stream
at once: the events held are dropped, and the client gets a chunk with `finish_reason:
content_filter`, then an error event (OpenAI's SDKs raise it), as OpenAI ends a filtered answer;
the relay closes the engine's stream, so nothing more is generated. Held text is what a stream
guard costs the client: up to `window_chars` characters later than without it.

Azure OpenAI's content filter works the same way on streams (text checked in chunks before it
is released); LiteLLM's Presidio output masking instead holds the whole stream and sends it as
one chunk at the end, and skips the Responses API's events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from tailguard.errors import APIError, GuardUnavailable
from tailguard.guards.check import BLOCK, REDACT, Finding
from tailguard.guards.patterns import redact
from tailguard.guards.texts import answer_texts, chunk_texts, set_answer_text, set_chunk_text
from tailguard.guards.window import Window
from tailguard.wire.framing import OPENAI
from tailguard.wire.sse import DONE, SSEDecoder, SSEEvent, encode_event

if TYPE_CHECKING:
    from tailguard.guards.guard import Guard, Stats

CONTENT_FILTER = "content_filter"


@dataclass(slots=True)
class _Held:
    raw: bytes
    obj: dict[str, Any] | None
    pieces: list[tuple[int, int, int, str]] = field(default_factory=list)  # (choice, start, end, text)


class OutputScreen:
    """One request's output guards (see the module docstring). `reason` is `content_filter`
    once the answer was withheld."""

    def __init__(self, guards: Sequence[Guard], stats: Stats, verdicts: list[str], *, chat: bool, stream: bool,
                 max_event_bytes: int = 1 << 20) -> None:
        self.guards = tuple(guards)
        self.stats, self.verdicts, self.chat = stats, verdicts, chat
        self.reason: str | None = None
        self._holding = tuple(i for i, g in enumerate(self.guards) if g.holds)  # their indexes
        self._hold = max((self.guards[i].window_chars for i in self._holding), default=0)
        self._dec = SSEDecoder(max_event_bytes) if stream else None
        self._held: deque[_Held] = deque()
        self._held_bytes = 0
        self._max_held = max(max_event_bytes, 1 << 20)
        self._windows: dict[int, Window] = {}
        self._checked: dict[tuple[int, int], int] = {}  # (guard, choice) -> how far it has read
        self._last: dict[str, Any] | None = None  # the latest chunk: the filter chunk's id, model, created

    # --- a whole answer --------------------------------------------------------------------

    async def whole(self, answer: dict[str, Any]) -> dict[str, Any]:
        """The non-stream answer as it goes out: as it was, redacted, or withheld (each choice's
        text emptied, `finish_reason: content_filter`)."""
        found = answer_texts(answer)
        if not found:
            return answer
        texts = [t for _, t in found]
        for g in self.guards:
            finding = await self._judge(g, texts)
            if finding is None:
                for index, _ in found:
                    set_answer_text(answer, index, "", CONTENT_FILTER)
                return answer
            if finding.flagged and g.action == REDACT and finding.spans:
                texts = [redact(t, spans) for t, spans in zip(texts, finding.spans)]
        for (index, old), text in zip(found, texts):
            if text != old:
                set_answer_text(answer, index, text)
        return answer

    async def _judge(self, g: Guard, texts: Sequence[str]) -> Finding | None:
        """The guard's finding; None when the answer is to be withheld (a block, or a failure
        that fails closed). A failure that fails open is a clean finding."""
        try:
            finding = await g.judge(texts, self.stats, self.verdicts)
        except GuardUnavailable:
            self.reason = CONTENT_FILTER
            return None
        if finding is not None and finding.flagged and g.action == BLOCK:
            self.reason = CONTENT_FILTER
            return None
        return finding if finding is not None else Finding(False)

    # --- a stream ---------------------------------------------------------------------------

    async def feed(self, data: bytes, last: bool) -> tuple[bytes, bool]:
        """Whole events from the engine in; what goes to the client now out, and whether that
        ends the stream (the answer's end, or a block)."""
        if self.reason is not None:
            return b"", True
        assert self._dec is not None
        events = self._dec.feed(data)
        if last:
            events += self._dec.flush()
        for ev in events:
            self._take(ev)
        # Bytes held past the bound (a backend sending events without text behind a held one):
        # everything so far is checked as if the answer ended here, and released.
        flush = last or self._held_bytes > self._max_held
        if not await self._check(flush):
            return self._withheld(), True
        return self._release(flush), last

    def _take(self, ev: SSEEvent) -> None:
        obj: Any = None
        if ev.data != DONE:
            try:
                obj = orjson.loads(ev.data)
            except orjson.JSONDecodeError:
                obj = None
        held = _Held(ev.raw, obj if isinstance(obj, dict) else None)
        if held.obj is not None:
            self._last = held.obj
            for index, text in chunk_texts(held.obj):
                w = self._windows.get(index)
                if w is None:
                    w = self._windows[index] = Window(self._hold)
                start, end = w.add(text)
                held.pieces.append((index, start, end, text))
        self._held.append(held)
        self._held_bytes += len(ev.raw)

    async def _check(self, final: bool) -> bool:
        """Every guard due (or all, at the end) reads its view of each choice; False when the
        answer is to be withheld."""
        for gi, g in enumerate(self.guards):
            due = [(i, w) for i, w in self._windows.items()
                   if w.received - self._checked.get((gi, i), 0) >= (1 if final else g.check.step_chars)]
            if not due:
                continue
            # A guard that redacts reads the text as it came (its spans are positions in it); the
            # others read it as it will go out, so a moderation service never sees what was redacted.
            views = [w.view(masked=g.action != REDACT) for _, w in due]
            finding = await self._judge(g, [text for _, text in views])
            if finding is None:
                return False
            if finding.flagged and g.action == REDACT:
                for (_, w), (at, _), spans in zip(due, views, finding.spans):
                    w.found(at, spans)
            for i, w in due:
                self._checked[(gi, i)] = w.received
        return True

    def _release(self, final: bool) -> bytes:
        """The held events whose text every holding guard has read far enough, in order."""
        targets = {i: w.target(self._read_by_all(i, w), final) for i, w in self._windows.items()}
        out: list[bytes] = []
        sent: dict[int, int] = {}
        while self._held:
            ev = self._held[0]
            if not final and any(end > targets[i] for i, _, end, _ in ev.pieces):
                break
            self._held.popleft()
            self._held_bytes -= len(ev.raw)
            out.append(self._out(ev))
            for i, _, end, _ in ev.pieces:
                sent[i] = end
        for i, end in sent.items():
            self._windows[i].release(end)
        return b"".join(out)

    def _read_by_all(self, index: int, w: Window) -> int:
        if not self._holding:
            return w.received
        return min(self._checked.get((gi, index), 0) for gi in self._holding)

    def _out(self, ev: _Held) -> bytes:
        """An event as it goes out: its own bytes, or rewritten where a redacted span falls."""
        if ev.obj is None or not ev.pieces:
            return ev.raw
        changed = False
        for index, start, end, text in ev.pieces:
            shown = self._windows[index].masked(start, end, text)
            if shown != text:
                set_chunk_text(ev.obj, index, shown)
                changed = True
        return encode_event(orjson.dumps(ev.obj)) if changed else ev.raw

    def _withheld(self) -> bytes:
        """The end of a withheld stream: each choice finished by the content filter, then the error."""
        self._held.clear()
        last = self._last or {}
        indexes = sorted(self._windows) or [0]
        choices: list[dict[str, Any]]
        if self.chat:
            choices = [{"index": i, "delta": {}, "logprobs": None, "finish_reason": CONTENT_FILTER} for i in indexes]
            kind = "chat.completion.chunk"
        else:
            choices = [{"index": i, "text": "", "logprobs": None, "finish_reason": CONTENT_FILTER} for i in indexes]
            kind = "text_completion"
        chunk = {"id": last.get("id", ""), "object": kind, "created": last.get("created", 0),
                 "model": last.get("model", ""), "choices": choices}
        err = APIError("The answer was withheld by the gateway's content guard.", status=400,
                       type="invalid_request_error", code=CONTENT_FILTER)
        return encode_event(orjson.dumps(chunk)) + OPENAI.error_event(err)

