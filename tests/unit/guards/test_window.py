"""The sliding window: what a check reads, how far text may go out, and masks across pieces."""

from __future__ import annotations

from tailguard.guards.patterns import Finder, Span
from tailguard.guards.window import Window

EMAILS = Finder.of(["email"])


def _stream(pieces: list[str], hold: int, finder: Finder = EMAILS) -> tuple[str, list[str]]:
    """Each piece added, checked (the view), released as far as the target; the text that went
    out, and what each check read."""
    w = Window(hold)
    placed = []
    views = []
    out = []
    for k, piece in enumerate(pieces):
        placed.append((*w.add(piece), piece))
        final = k == len(pieces) - 1
        at, text = w.view()
        views.append(text)
        w.found(at, finder.find(text))
        upto = w.target(w.received, final)
        while placed and placed[0][1] <= upto:
            start, end, p = placed.pop(0)
            out.append(w.masked(start, end, p))
            w.release(end)
    return "".join(out), views


def test_a_span_split_over_pieces_is_masked_whole() -> None:
    out, _ = _stream(["write to ja", "ne.doe@exa", "mple.com to", "day, thanks"], hold=32)
    assert out == "write to [EMAIL] today, thanks"


def test_a_span_longer_than_the_window_is_never_seen_whole() -> None:
    """The window's bound: with a hold of 4 characters, no check ever reads the 20-character
    address whole, so it goes out as it came (`window_chars` must exceed what is to be found)."""
    out, views = _stream(list("write to jane.doe@example.com now"), hold=4)
    assert out == "write to jane.doe@example.com now"
    assert max(map(len, views)) < len("jane.doe@example.com")
    assert _stream(list("write to jane.doe@example.com now"), hold=24)[0] == "write to [EMAIL] now"


def test_views_overlap_by_the_hold() -> None:
    w = Window(hold=5)
    w.add("0123456789")
    w.release(8)
    assert w.view() == (3, "3456789")
    w.add("abc")
    assert w.view() == (3, "3456789abc")


def test_target_holds_back_and_moves_past_a_straddling_mask() -> None:
    w = Window(hold=5)
    w.add("x" * 20)
    assert w.target(20, final=False) == 15
    assert w.target(12, final=False) == 7  # a guard that has read less holds release further back
    w.found(0, [Span(13, 18, "email")])
    assert w.target(20, final=False) == 18
    assert w.target(20, final=True) == 20


def test_masked_view_shows_labels() -> None:
    w = Window(hold=100)
    w.add("mail a@b.org now")
    w.found(0, EMAILS.find("mail a@b.org now"))
    assert w.view(masked=True) == (0, "mail [EMAIL] now")
    assert w.view() == (0, "mail a@b.org now")


def test_overlapping_finds_widen_one_mask_and_its_label_goes_out_once() -> None:
    w = Window(hold=100)
    w.add("abcdefghij")
    w.found(0, [Span(2, 5, "x")])
    w.found(0, [Span(4, 8, "x")])
    assert w.masked(0, 6, "abcdef") == "ab[X]"
    assert w.masked(6, 10, "ghij") == "ij"


def test_released_text_is_trimmed_to_the_window() -> None:
    w = Window(hold=10)
    for _ in range(1000):
        w.add("y" * 50)
        w.release(w.received)
    assert len(w.text) < 4096 + 60
    assert w.view() == (w.received - 10, "y" * 10)
