"""One streamed answer's text as output guards see it: a sliding window over what the engine
sent, and how much of it may go to the client; pure, no I/O.

The client's stream is held `hold` characters behind the engine. Each check reads the text not
yet released plus the last `hold` characters released (`view`), and after a check that passed,
text is released up to `hold` before the end (`target`), or past the end of a span found there
to redact. So any span up to `hold` characters long lies whole in some check's view before any
of it is released: a check that would find it whole always gets to (a longer one may be split,
its first part released unseen; `window_chars` is that bound). Redacted spans are kept as masks
and applied to each piece of text as it is released (`masked`): the label where the span begins,
the rest of it dropped, whichever events the span was spread over.

    w = Window(hold=64)
    start, end = w.add(" call 415-")           # where the piece lies in the choice's text
    at, text = w.view()                        # what a check reads
    w.found(at, spans)                         # spans a redacting check found in that view
    upto = w.target(w.received, final=False)   # release pieces that end before `upto`
    w.masked(start, end, " call 415-")         # the piece as it goes out
    w.release(upto)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tailguard.guards.patterns import Span, label

_TRIM = 4096  # released text kept beyond the window is cut in steps this large (amortized slicing)


@dataclass(slots=True)
class _Mask:
    start: int
    end: int
    kind: str
    said: bool = False  # its label went out


class Window:
    """One choice's text: received, released, and the spans to redact in what is not released."""

    __slots__ = ("hold", "text", "base", "received", "released", "masks")

    def __init__(self, hold: int) -> None:
        self.hold = hold
        self.text = ""  # the choice's text from `base` (an absolute offset) to `received`
        self.base = 0
        self.received = 0
        self.released = 0
        self.masks: list[_Mask] = []  # by start, not overlapping

    def add(self, piece: str) -> tuple[int, int]:
        """A piece of text arrived: where it lies, [start, end), in the choice's whole text."""
        start = self.received
        self.text += piece
        self.received += len(piece)
        return start, self.received

    def view(self, masked: bool = False) -> tuple[int, str]:
        """What a check reads, and where it begins: `hold` characters before the first one not
        released, to the end; `masked`: with the masks' labels in place of their spans (the
        positions then no longer match the text's)."""
        start = max(self.base, self.released - self.hold)
        text = self.text[start - self.base:]
        if not masked or not self.masks:
            return start, text
        out: list[str] = []
        pos = start
        for m in self.masks:
            if m.end <= start:
                continue
            a = max(m.start, start)
            out.append(text[pos - start:a - start])
            out.append(label(m.kind))
            pos = m.end
        out.append(text[pos - start:])
        return start, "".join(out)

    def found(self, at: int, spans: Sequence[Span]) -> None:
        """Spans a redacting check found in the view that began at `at`; joined to the masks
        (a span found again by a later view, or overlapping one, widens the mask)."""
        for s in spans:
            start, end = s.start + at, s.end + at
            if end <= self.released:
                continue  # (released already: a span no longer than `hold` never is)
            merged = _Mask(start, end, s.kind)
            kept: list[_Mask] = []
            for m in self.masks:
                if m.end <= merged.start or m.start >= merged.end:
                    kept.append(m)
                else:
                    merged = _Mask(min(m.start, merged.start), max(m.end, merged.end),
                                   m.kind if m.start <= merged.start else merged.kind, m.said)
            kept.append(merged)
            kept.sort(key=lambda m: m.start)
            self.masks = kept

    def target(self, checked: int, final: bool) -> int:
        """How far text may be released once the checks have read up to `checked`: `hold`
        before it (all of it once the answer is complete), moved past a mask that straddles
        that point."""
        t = checked if final else checked - self.hold
        for m in self.masks:
            if m.start < t < m.end:
                t = m.end
        return max(t, self.released)

    def masked(self, start: int, end: int, piece: str) -> str:
        """The piece at [start, end) as it goes out, each mask applied: its label where the first
        of it goes out, the rest of it dropped."""
        out: list[str] = []
        pos = start
        for m in self.masks:
            if m.end <= start or m.start >= end:
                continue
            a, b = max(m.start, start), min(m.end, end)
            out.append(piece[pos - start:a - start])
            if not m.said:
                out.append(label(m.kind))
                m.said = True
            pos = b
        if not out:
            return piece
        out.append(piece[pos - start:])
        return "".join(out)

    def release(self, upto: int) -> None:
        """Text before `upto` went out: it stays in the window only as the next views' context."""
        self.released = max(self.released, upto)
        self.masks = [m for m in self.masks if m.end > self.released]
        keep_from = self.released - self.hold
        if keep_from - self.base >= _TRIM:
            self.text = self.text[keep_from - self.base:]
            self.base = keep_from
