"""Agent programs in the front, on plain numbers: the levels of attained service (PLAS), the book
of what each program received and where its last call went, the queue's order with aging, the
router's program affinity within its bound, and the whole front: a long program's call bounded
under a flood of new ones, siblings landing together."""

from __future__ import annotations

import pytest

from tailguard.front.ejection import Ejector
from tailguard.front.events import Arrive, Finished, Start
from tailguard.front.front import Front
from tailguard.front.params import (
    BackendSpec, ClassSpec, EjectionParams, FrontParams, HealthParams, ProgramParams, QueueParams, RoutingParams,
)
from tailguard.front.plas import level, order_key, overtakes
from tailguard.front.programs import ProgramBook
from tailguard.front.queue import Pending
from tailguard.front.ranked import RankedSjfScheduler
from tailguard.front.fairqueue import FairShareScheduler
from tailguard.front.router import Route, Router
from tailguard.front.slots import BackendPool
from tailguard.types import Outcome

CHAT = ClassSpec(name="interactive", rank=0, max_queue_wait_s=600.0)


# --- levels and the order key ------------------------------------------------------------------

def test_levels_double_from_one_quantum_and_stop_at_the_last() -> None:
    assert [level(s, 1000, 5) for s in (0, 999, 1000, 1999, 2000, 3999, 4000, 8000, 1e9)] == [
        0, 0, 1, 1, 2, 2, 3, 4, 4]
    assert level(1e9, 1000, 1) == 0  # one level: PLAS does nothing


def key(lvl: int, program_at: float, est: int) -> tuple[int, float, float]:
    return order_key(Pending("r", "interactive", 0, est, 0.0, 1.0, level=lvl, program_at=program_at))


def test_a_lower_level_goes_first_then_the_older_program_then_the_size_rule() -> None:
    assert overtakes(key(0, 9.0, 9000), key(1, 1.0, 100), 4.0)  # level first, whatever the size or age
    assert not overtakes(key(1, 1.0, 100), key(0, 9.0, 9000), 4.0)
    assert overtakes(key(1, 1.0, 9000), key(1, 2.0, 100), 4.0)  # above 0: its program started first
    assert overtakes(key(1, 1.0, 100), key(1, 1.0, 500), 4.0)  # one program: more than 4x smaller
    assert not overtakes(key(1, 1.0, 200), key(1, 1.0, 500), 4.0)  # no real gap: the oldest call
    assert key(0, 5.0, 100) == key(0, 7.0, 100)  # level 0 (no program, a new one): by size alone


# --- the book ---------------------------------------------------------------------------------

def test_service_adds_each_calls_tokens_and_halves_over_the_half_life() -> None:
    book = ProgramBook(ProgramParams(half_life_s=10.0, quantum_tokens=1000, levels=8))
    assert book.place("p", 0.0) == (0, 0.0)  # its first call: level 0, started now
    book.served("p", 3000, now=0.0)
    book.served("p", 1000, now=0.0)
    assert book.service("p", 0.0) == 4000 and book.level("p", 0.0) == 3
    assert book.service("p", 10.0) == pytest.approx(2000) and book.level("p", 10.0) == 2
    assert book.service("p", 40.0) == pytest.approx(250) and book.level("p", 40.0) == 0
    assert book.place("p", 40.0) == (0, 0.0) and book.place(None, 40.0) == (0, 40.0)
    assert book.service("other", 0.0) == 0 and book.level(None, 0.0) == 0
    assert ProgramBook(ProgramParams(plas=False)).level("p", 0.0) == 0


def test_home_is_the_last_calls_backend_for_the_ttl_from_its_end() -> None:
    book = ProgramBook(ProgramParams(affinity_ttl_s=30.0))
    book.bound("p", "a", now=0.0)
    assert book.home("p", 10.0) == "a"
    book.served("p", 500, now=20.0)  # the call ended: its KV is in a's cache from then
    assert book.home("p", 49.0) == "a" and book.home("p", 51.0) is None
    book.bound("p", "b", now=60.0)
    assert book.home("p", 60.0) == "b"
    book.forget_backend("b")
    assert book.home("p", 60.0) is None
    assert ProgramBook(ProgramParams(affinity=False)).home("p", 0.0) is None


def test_the_book_is_bounded_by_count_and_by_silence() -> None:
    book = ProgramBook(ProgramParams(max_programs=3, ttl_s=100.0))
    for i, name in enumerate("abcd"):
        book.served(name, 10_000, now=float(i))
    assert len(book) == 3 and book.service("a", 3.0) == 0  # the least recently heard from went
    book.served("b", 1, now=3.5)  # b is heard from again: c is now the oldest
    book.served("e", 1, now=5.0)
    assert book.service("c", 5.0) == 0 and book.service("b", 5.0) > 0
    book.served("f", 1, now=104.5)  # d and b have been silent for 100 s
    assert len(book) == 2 and book.service("d", 104.5) == 0


# --- the queue's order ------------------------------------------------------------------------

def call(req_id: str, est: int, at: float, lvl: int = 0, caller: str | None = None,
         program_at: float = 0.0) -> Pending:
    return Pending(req_id, "interactive", 0, est, at, at + 600.0, caller, None, lvl, program_at)


def drain(s: RankedSjfScheduler, now: float) -> list[str]:
    out = []
    while (p := s.pop(now)) is not None:
        out.append(p.id)
    return out


def test_new_programs_go_first_then_the_programs_under_way_oldest_first() -> None:
    s = RankedSjfScheduler(QueueParams(aging_s=10.0), [CHAT])
    s.push(call("young-agent", 8_000, 0.0, lvl=1, program_at=0.0), 0.0)
    s.push(call("old-agent", 30_000, 0.1, lvl=1, program_at=-100.0), 0.1)
    s.push(call("new-big", 6_000, 0.2), 0.2)
    s.push(call("new-small", 1_000, 0.3), 0.3)
    assert drain(s, 1.0) == ["new-small", "new-big", "old-agent", "young-agent"]


def test_pure_plas_over_more_levels_orders_by_what_each_program_received() -> None:
    s = RankedSjfScheduler(QueueParams(aging_s=10.0), [CHAT])
    s.push(call("agent-20th", 30_000, 0.0, lvl=5, program_at=-90.0), 0.0)
    s.push(call("agent-3rd", 8_000, 0.1, lvl=2, program_at=-5.0), 0.1)
    s.push(call("new", 6_000, 0.2), 0.2)
    assert drain(s, 1.0) == ["new", "agent-3rd", "agent-20th"]


def test_without_programs_the_order_is_shortest_first_as_before() -> None:
    s = RankedSjfScheduler(QueueParams(aging_s=10.0), [CHAT])
    for i, est in enumerate((500, 5000, 100, 400)):
        s.push(call(f"r{i}", est, i * 0.1), i * 0.1)
    # r0 is oldest; r2 is more than 4x smaller: it goes, then r0 (r3 is no real gap), then r3, r1.
    assert drain(s, 1.0) == ["r2", "r0", "r3", "r1"]


def test_aging_lets_a_long_programs_call_through_whatever_its_level() -> None:
    s = RankedSjfScheduler(QueueParams(aging_s=10.0), [CHAT])
    s.push(call("agent", 30_000, 0.0, lvl=7), 0.0)
    s.push(call("new", 500, 9.0), 9.0)
    assert s.pop(9.5).id == "new"  # type: ignore[union-attr]
    s.push(call("newer", 500, 10.5), 10.5)
    assert s.pop(11.0).id == "agent"  # type: ignore[union-attr]  # it has waited its aging bound


def test_fair_share_orders_callers_first_then_programs_within_a_caller() -> None:
    s = FairShareScheduler(QueueParams(fair_share=True, fair_credit=0.0), [CHAT])
    s.vtc.counters.update({"heavy": 50_000.0, "light": 0.0})
    s.push(call("light-agent", 20_000, 0.0, lvl=4, caller="light"), 0.0)
    s.push(call("light-new", 2_000, 0.1, caller="light"), 0.1)
    s.push(call("heavy-new", 100, 0.2, caller="heavy"), 0.2)
    assert s.pop(1.0).id == "light-new"  # type: ignore[union-attr]
    assert s.pop(1.0).id == "light-agent"  # type: ignore[union-attr]  # light is still below heavy


# --- routing ---------------------------------------------------------------------------------

def pool(*names: str, slots: int = 4) -> BackendPool:
    return BackendPool([BackendSpec(n, max_concurrency=slots) for n in names], [CHAT], HealthParams())


def test_a_programs_call_goes_home_while_homes_load_is_within_the_bound() -> None:
    book = ProgramBook(ProgramParams())
    rt = Router(RoutingParams(policy="least-tokens", balance_factor=1.5, balance_slack=0.0), Ejector(EjectionParams()),
                programs=book)
    slots = pool("a", "b")
    book.bound("p", "a", 0.0)
    route = Route(program="p")
    slots.acquire("a", "interactive", 1000)
    slots.acquire("b", "interactive", 1000)
    assert rt.choose(slots, CHAT, call("x", 1000, 0.0), route, 1.0) == "a"  # equal loads: home
    slots.acquire("a", "interactive", 1000)  # a: 3000 with this call, b: 2000 -> 1.5x, within
    assert rt.choose(slots, CHAT, call("x", 1000, 0.0), route, 1.0) == "a"
    slots.acquire("a", "interactive", 1000)  # a: 4000 against 2000: past the bound
    assert rt.choose(slots, CHAT, call("x", 1000, 0.0), route, 1.0) == "b"
    assert rt.choose(slots, CHAT, call("x", 1000, 0.0), Route(program="other"), 1.0) == "b"


def test_round_robin_keeps_no_program_affinity() -> None:
    book = ProgramBook(ProgramParams())
    rt = Router(RoutingParams(policy="round-robin"), Ejector(EjectionParams()), programs=book)
    slots = pool("a", "b")
    book.bound("p", "a", 0.0)
    picks = []
    for _ in range(2):
        b = rt.choose(slots, CHAT, call("x", 10, 0.0), Route(program="p"), 0.0)
        assert b is not None
        rt.bound(b, Route(program="p"))
        picks.append(b)
    assert picks == ["a", "b"]


# --- the front -------------------------------------------------------------------------------

def front(*backends: BackendSpec, programs: ProgramParams = ProgramParams(), aging_s: float = 10.0) -> Front:
    return Front(FrontParams(classes=[CHAT], backends=list(backends) or [BackendSpec("a", max_concurrency=1)],
                             queue=QueueParams(aging_s=aging_s), programs=programs))


def arrive(f: Front, rid: str, est: int, now: float, program: str | None = None) -> list[object]:
    return list(f.handle(Arrive(rid, "interactive", est, max_tokens=100, program=program), now))


def test_a_new_programs_first_call_is_not_stuck_behind_a_long_agents_twentieth() -> None:
    f = front(programs=ProgramParams(quantum_tokens=1000))
    # The agent has had 19 calls of growing context: 19 x ~10,000 tokens.
    t = 0.0
    for i in range(19):
        assert arrive(f, f"agent-{i}", 10_000, t, "agent") == [Start(f"agent-{i}", "a")]
        t += 1.0
        f.handle(Finished(f"agent-{i}", Outcome.SUCCESS, tokens=10_000), t)
    arrive(f, "blocker", 100, t)  # holds the one slot
    arrive(f, "agent-19", 12_000, t + 0.1, "agent")
    arrive(f, "new-1", 12_000, t + 0.2, "new")  # as large: only its program's service differs
    assert list(f.handle(Finished("blocker", Outcome.SUCCESS, 100), t + 1.0)) == [Start("new-1", "a")]
    # With PLAS off, the older of two calls of one size goes first.
    g = front(programs=ProgramParams(plas=False, quantum_tokens=1000))
    for i in range(3):
        arrive(g, f"agent-{i}", 10_000, float(i), "agent")
        g.handle(Finished(f"agent-{i}", Outcome.SUCCESS, tokens=10_000), i + 0.5)
    arrive(g, "blocker", 100, 3.0)
    arrive(g, "agent-3", 12_000, 3.1, "agent")
    arrive(g, "new-1", 12_000, 3.2, "new")
    assert list(g.handle(Finished("blocker", Outcome.SUCCESS, 100), 4.0)) == [Start("agent-3", "a")]


def test_sibling_calls_that_arrive_together_land_on_one_backend() -> None:
    """A step's parallel tool calls (or best-of-n) arrive together, before any of them ended: the
    first one sent makes the backend its program's home, so the others follow it there while
    that backend is within the balance bound; a call of no program goes by load alone."""
    f = front(BackendSpec("a", max_concurrency=4), BackendSpec("b", max_concurrency=4))
    first = arrive(f, "s1", 1000, 0.0, "p")
    assert len(first) == 1 and isinstance(first[0], Start)
    home = first[0].backend
    assert arrive(f, "s2", 1000, 0.0, "p") == [Start("s2", home)]
    assert arrive(f, "s3", 1000, 0.0, "p") == [Start("s3", home)]
    other = "b" if home == "a" else "a"
    assert arrive(f, "x", 1000, 0.0) == [Start("x", other)]  # no program: the less loaded
    off = front(BackendSpec("a", max_concurrency=4), BackendSpec("b", max_concurrency=4),
                programs=ProgramParams(affinity=False))
    picks = {e.backend for rid in ("s1", "s2") for e in arrive(off, rid, 1000, 0.0, "p") if isinstance(e, Start)}
    assert picks == {"a", "b"}  # without affinity, siblings spread by load


def test_a_long_programs_wait_is_bounded_under_a_flood_of_new_ones() -> None:
    """One slot, each call holds it 1 s; a new program's first call arrives every 0.5 s (twice
    what the slot serves), so new programs alone would keep it busy for ever. The long program's
    call, at the highest level, still starts within its aging bound (plus the call running as it
    ages), after the new programs that came before it aged."""
    aging_s = 10.0
    f = front(programs=ProgramParams(quantum_tokens=1000), aging_s=aging_s)
    f.handle(Arrive("agent-0", "interactive", 1000, program="agent"), 0.0)
    f.handle(Finished("agent-0", Outcome.SUCCESS, tokens=500_000), 0.5)  # a long program's history
    arrivals = [(1.0 + 0.5 * i, f"new-{i}", 1000, f"new-{i}") for i in range(60)]
    arrivals.insert(2, (1.6, "agent-1", 30_000, "agent"))
    started = one_slot(f, arrivals, service_s=1.0)
    wait = started["agent-1"] - 1.6
    assert wait <= aging_s + 1.0 + 1e-9
    assert started["agent-1"] > started["new-5"]  # new programs went first while it was young


def one_slot(f: Front, arrivals: list[tuple[float, str, int, str]], service_s: float) -> dict[str, float]:
    """Drive `f` (one backend, one slot) with `arrivals` (at, id, size, program); each call holds
    the slot `service_s`. Returns when each started."""
    started: dict[str, float] = {}
    running: str | None = None
    ends_at = 0.0

    def apply(decisions: object, now: float) -> None:
        nonlocal running, ends_at
        for d in decisions:  # type: ignore[attr-defined]
            assert isinstance(d, Start) and running is None
            started[d.id], running, ends_at = now, d.id, now + service_s

    for at, rid, est, program in arrivals:
        while running is not None and ends_at <= at:
            done, running = running, None
            apply(f.handle(Finished(done, Outcome.SUCCESS, est), ends_at), ends_at)
        apply(f.handle(Arrive(rid, "interactive", est, program=program), at), at)
    while running is not None:
        done, running = running, None
        apply(f.handle(Finished(done, Outcome.SUCCESS, 1000), ends_at), ends_at)
    return started
