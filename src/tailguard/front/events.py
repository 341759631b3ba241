"""What goes into the front and what comes out of it: typed events and decisions; pure.

A driver tells the front what happened as one of the events below, through the front's one
chokepoint (`Front.handle(event, now)`), and carries out the decisions it gets back. Events and
decisions are plain frozen values, so a driver's whole conversation with the front can be
written down and replayed (`tailguard serve --record`, `tailguard replay`), and a wrong event is a
`WrongEvent` that names the event and the state it met, never a silent no-op (h11's shape:
python-hyper/h11, `h11/_state.py`).

A decision says everything its driver needs to carry it out and to count it: a `Start` says what
kind of start it is (`StartMode`: a first run, a retry, a continuation after a suspension, a
migration after a failure mid-answer, a hedge) and, for a retry or a migration, the failure it
follows; a failed attempt the front will not try again is a `GiveUp` that says why; a hedge's
loser is dropped by a `Drop` that names the winner too. So no driver works policy out again.

    events in                                       decisions out
    Arrive(id, cls, est_tokens, model=, prefix=) -> Start | Reject (refused on arrival)
    Opened(id)    (its upstream is open)         -> Suspend of a victim, Start of the waiter
    Generated(id, tokens)  (preemptible only)    -> nothing: what a preemption weighs
    Failed(id, kind, delivered=, answered=)      -> Start(retry | migrate), Wait, GiveUp, Ejected
    FirstContent(id, backend)                    -> Drop of a hedge's other attempt (a hedge's failed one too)
    Finished(id, outcome, tokens=)  (once)       -> Start of whoever gets the slot, HealthChanged
    Probed(backend, ok, busy=), KindLearned      -> HealthChanged, Start
    Observed(backend, ttft_s=, itl_s=)           -> Start when an adaptive cap grew
    Served(backend, models), Loaded(backend, n)  -> Start (what it serves, the engine's own load)
    Tick()  (at `next_wakeup()`)                 -> Reject(QUEUE_TIMEOUT | LATE), Readmitted, Start(hedge), Start
    Close()                                      -> Reject(SHUTTING_DOWN) for every queued request
    Reconfigure(params)  (a live reload)         -> Start, Retired
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import enum
import typing

from tailguard.errors import TailguardError
from tailguard.front.params import FrontParams
from tailguard.types import FailureKind, Outcome, RejectReason

# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SharedVerdict:
    """What the replicas' shared state (Redis) said of a request's caller before it arrived
    (`gateway.shared.limits`): let in (`reason` None), or refused over all replicas by the limit
    `reason` names (`limit` and `used` then, for its words), or `SHARED_STATE_UNAVAILABLE` (Redis
    is away and `state.on_unavailable` is `closed`). The front refuses what it refuses, so the
    recording holds it and a replay or the DES reproduces it."""

    reason: RejectReason | None = None
    retry_after_s: float = 0.0
    limit: int | None = None
    used: int | None = None


@dataclass(frozen=True, slots=True)
class Arrive:
    """A request of class `cls` and job size `est_tokens` (prompt + output estimate) arrives.
    `resumable`: its output can be continued from its text, so it may be suspended if its class
    is preemptible; `max_tokens`: its output budget (what a preemption weighs); `caller`: whose
    request it is (an API key's name), refused while over its limits (`front.limits`); `model`:
    the model it names (after aliases; None: any backend may serve it); `prefix`: its prompt's
    chained block hashes, for prefix-affine routing (`front.prefix`); `pin`: the backend that holds
    its state (a Responses API follow-up goes where its `previous_response_id` was made), the only
    one that may take it while that backend is in the fleet; `body_bytes`: its body's size, held
    against `QueueParams.max_queued_body_bytes` until it first starts; `shared`: the verdict of the
    replicas' shared limits on its caller (None: not asked); `program`: the agent program it is a
    call of (`front.identity`: a session's calls known as one; None: none), which orders it by what
    that program has received (`front.plas`) and routes it where the program's last call went;
    `prompt_tokens`: its prompt's size (None: `est_tokens` less `max_tokens`), what its first token
    costs (`front.latency`); `ttft_slo_s`: the TTFT target it is held to, its class's or tighter as
    the intake allowed (`x-tailguard-ttft-slo-ms`; None: its class's)."""

    id: str
    cls: str
    est_tokens: int
    resumable: bool = False
    max_tokens: int | None = None
    caller: str | None = None
    model: str | None = None
    prefix: tuple[int, ...] = ()
    pin: str | None = None
    body_bytes: int = 0
    shared: SharedVerdict | None = None
    program: str | None = None
    prompt_tokens: int | None = None
    ttft_slo_s: float | None = None

    @property
    def prompt(self) -> int:
        """Its prompt tokens, as given or as its size less its output limit."""
        if self.prompt_tokens is not None:
            return self.prompt_tokens
        return max(0, self.est_tokens - (self.max_tokens or 0))


@dataclass(frozen=True, slots=True)
class Opened:
    """A running request's upstream is open: a `Suspend` of it can take effect at once."""

    id: str


@dataclass(frozen=True, slots=True)
class Generated:
    """A running preemptible request has generated `tokens` so far, over all its runs. The front
    keeps the latest count to weigh which request to suspend; it decides nothing on it."""

    id: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Failed:
    """An attempt failed as `kind`. `delivered`: some of its answer already reached the consumer
    (it can never be retried); `answered`: the engine sent its response head (it accepted the
    request, so a deadline after that is not a hung server). The front decides from these whether
    it goes again (a `Start`), waits for a backend (`Wait`) or ends (`GiveUp`, then the driver's
    `Finished`). `backend`: which attempt
    failed when the request is hedged (two attempts at once; None: its only one). A hedged
    request's attempt that fails while the other runs leads to nothing: the other goes on."""

    id: str
    kind: FailureKind
    delivered: bool = False
    answered: bool = False
    backend: str | None = None


@dataclass(frozen=True, slots=True)
class FirstContent:
    """Request `id`'s first generated content came, from `backend`: its TTFT is a sample of its
    class's, and if it was hedged, that attempt wins."""

    id: str
    backend: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The request ended with `outcome`, having used `tokens` (prompt and generated, charged to
    its caller): the one event that ends a request the front did not reject itself."""

    id: str
    outcome: Outcome
    tokens: int = 0


@dataclass(frozen=True, slots=True)
class Probed:
    """A health probe of `backend` succeeded or failed. `busy`: it failed by not answering in
    time while the backend was sending bytes to requests in flight (counted neither way)."""

    backend: str
    ok: bool
    busy: bool = False


@dataclass(frozen=True, slots=True)
class Observed:
    """A request on `backend` showed these latencies: `ttft_s` from its `Start` to its first
    content (so the gateway's queue wait is never in it), `itl_s` its mean gap between content
    chunks. Either may be None (no content, one chunk). What an adaptive cap learns from
    (`front.adaptive`); keyed by backend, like `Probed`, so a late sample is never a wrong event."""

    backend: str
    ttft_s: float | None = None
    itl_s: float | None = None


@dataclass(frozen=True, slots=True)
class KindLearned:
    """The backend's kind is known: whether it can continue a generation (its requests may then
    be suspended, and it keeps no reserved slots)."""

    backend: str
    continues: bool


@dataclass(frozen=True, slots=True)
class Served:
    """The models `backend` lists at its /v1/models (None: it could not be read, so any model
    may go there unless its config names its models)."""

    backend: str
    models: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class Loaded:
    """The engine behind `backend` reports `queued` requests running and waiting (its own
    metrics page): work the router weighs beside the gateway's own, while the reading is fresh."""

    backend: str
    queued: int


@dataclass(frozen=True, slots=True)
class Allotted:
    """This gateway may have at most `slots` requests on `backend` now: its part of the
    backend's `max_concurrency`, which several replicas share (the gateway's slot leases in
    Redis, `gateway.shared.slots`); None: the whole cap again. A cap lowered below what is in
    flight cancels nothing; one that grew lets the queue in."""

    backend: str
    slots: int | None


@dataclass(frozen=True, slots=True)
class ServedElsewhere:
    """Other replicas gave each caller this much fair-share service (virtual counter units)
    since the last exchange (`gateway.shared.fair`): the counters of `scheduler.fair_share`
    count every replica's service, not only this one's."""

    service: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class LocalShare:
    """The replicas' shared state is unavailable and `state.on_unavailable` is `local`: each
    caller's limits are kept here at 1/`replicas` of themselves; None: whole again (Redis is back,
    and checks them over all replicas first)."""

    replicas: int | None


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (the driver's timer at `next_wakeup()`): queue bounds are checked."""


@dataclass(frozen=True, slots=True)
class Close:
    """Shutting down: refuse new requests, drop every queued or suspended one."""


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """A live reload: new parameters for the same classes, every request kept."""

    params: FrontParams


Event = (Arrive | Opened | Generated | Failed | FirstContent | Finished | Probed | Observed | KindLearned | Served
         | Loaded | Tick | Close | Reconfigure | Allotted | ServedElsewhere | LocalShare)

# --- decisions ------------------------------------------------------------------------------


class StartMode(enum.StrEnum):
    """What a `Start` is, so its driver knows what to send without working it out again."""

    FRESH = "fresh"  # the request's first run
    RETRY = "retry"  # the failed attempt's body again, from its start, on a fresh connection
    CONTINUE = "continue"  # a suspended request's continuation from its text so far
    MIGRATE = "migrate"  # the continuation after its backend failed mid-answer
    HEDGE = "hedge"  # a second attempt beside the one it runs: no content came within its class's hedge delay

    @property
    def continues(self) -> bool:
        """The driver sends the continuation of what was generated so far."""
        return self is StartMode.CONTINUE or self is StartMode.MIGRATE


@dataclass(frozen=True, slots=True)
class Start:
    """Send request `id` to `backend` as `mode` says. A retry or a migration names the failure it
    follows (`after`) and the backend that failed (`failed_on`): what its counters are labelled
    by. A hedge's first attempt to stream content wins (`FirstContent`)."""

    id: str
    backend: str
    mode: StartMode = StartMode.FRESH
    after: FailureKind | None = None
    failed_on: str | None = None


@dataclass(frozen=True, slots=True)
class Wait:
    """Request `id`'s attempt failed and no backend that may take its retry or continuation is
    free now: it waits in the queue, holding no slot, its client kept; a `Start` (mode `retry` if
    none of the answer went out yet, else `migrate`) follows when one is, or a `Reject` past its
    wait bound."""

    id: str


@dataclass(frozen=True, slots=True)
class Suspend:
    """Stop request `id` on `backend` now (close its upstream so the engine frees its slot and
    KV); it waits in the queue for its continuation, its client connection kept open."""

    id: str
    backend: str


@dataclass(frozen=True, slots=True)
class Reject:
    """Request `id` is refused (on arrival) or dropped (expired, shut down); it has left the
    front. `retry_after_s` is what to tell the client; for a caller's limit, `limit` and `used`
    are the limit and its use then, and `shared` says it was over all replicas (what the one
    wording of each refusal says: `gateway.rejection`)."""

    id: str
    reason: RejectReason
    retry_after_s: float
    limit: int | None = None
    used: int | None = None
    shared: bool = False


@dataclass(frozen=True, slots=True)
class HealthChanged:
    backend: str
    healthy: bool


class GiveUpReason(enum.StrEnum):
    """Why the front does not try a failed attempt again."""

    NOT_RETRYABLE = "not_retryable"  # the failure allows no retry (the engine answered, or a deadline of its own)
    NOT_CONTINUABLE = "not_continuable"  # the answer is under way and cannot be continued from its text
    ATTEMPTS = "attempts"  # `retries.max_attempts` reached
    MIGRATIONS = "migrations"  # `retries.max_migrations` reached
    BUDGET = "budget"  # the retry budget is spent
    NO_BACKEND = "no_backend"  # no backend it has not failed on could ever take it

    @property
    def denied(self) -> bool:
        """A retry or a migration the failure allowed was denied by a bound
        (`tailguard_retries_denied_total`)."""
        return self is not GiveUpReason.NOT_RETRYABLE and self is not GiveUpReason.NOT_CONTINUABLE


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Request `id`'s attempt on `backend` failed as `kind` and the front will not try it again
    (`reason`): the driver ends it (an error to its consumer, or an error event on a stream under
    way) and tells `Finished`. Until then it keeps its slot and may only be finished."""

    id: str
    reason: GiveUpReason
    kind: FailureKind
    backend: str


@dataclass(frozen=True, slots=True)
class Drop:
    """Request `id`'s hedge is over: its attempt on `winner` is the request's attempt from now
    on, and the one on `loser` stops now. `failed`: the loser failed (its `Failed`) while the
    winner ran; else the winner streamed content first."""

    id: str
    loser: str
    winner: str
    failed: bool = False


@dataclass(frozen=True, slots=True)
class Ejected:
    """`backend` failed `failures` attempts in a row (the last as `kind`) and takes no request
    for `for_s` (`front.ejection`): the `times`-th time."""

    backend: str
    for_s: float
    failures: int
    kind: FailureKind
    times: int


@dataclass(frozen=True, slots=True)
class Readmitted:
    """`backend`'s ejection is over: it takes requests again."""

    backend: str


@dataclass(frozen=True, slots=True)
class Retired:
    """A backend a reload removed has no request left and has left the front: the driver may
    forget it (its probes, metrics, connections)."""

    backend: str


Decision = Start | Wait | Suspend | Reject | GiveUp | Drop | HealthChanged | Ejected | Readmitted | Retired


class ProtocolError(TailguardError):
    """A driver broke the front's protocol: a bug in the driver, named; the front is left exactly
    as it was before the call (every check runs before anything changes)."""


class WrongEvent(ProtocolError):
    """An event the front's state does not allow (a request ended twice, a failure of a request
    that is not running, an unknown class, a hedge's attempt it does not run): named with the
    event and the state it met."""

    def __init__(self, event: Event, state: str) -> None:
        super().__init__(f"{event!r}: {state}")
        self.event = event
        self.state = state


class NotAnEvent(ProtocolError):
    """Something that is not one of the front's events was handed in (a decision, say)."""

    def __init__(self, thing: object) -> None:
        what = "a decision" if isinstance(thing, DECISION_TYPES) else f"a {type(thing).__name__}"
        super().__init__(f"{thing!r} is {what}, not an event of the front's "
                         f"({', '.join(t.__name__ for t in EVENT_TYPES)})")
        self.thing = thing


class ClockWentBack(ProtocolError):
    """A `now` earlier than the last one the front was told: its clock is one monotonic clock."""

    def __init__(self, now: float, last: float) -> None:
        super().__init__(f"now {now!r} is before the last instant the front was told ({last!r})")
        self.now = now
        self.last = last


class FrontBroken(TailguardError):
    """A handler of the front failed with an error nobody expected, so the front may be half
    changed: it refuses every later call with this, naming the first failure (h11's ERROR
    state). A gateway whose front broke answers 500 and says so in /health; restart it."""

    def __init__(self, cause: BaseException, event: object) -> None:
        super().__init__(f"the front failed while handling {event!r} ({type(cause).__name__}: {cause}) and "
                         "refuses every later call")
        self.cause = cause


EVENT_TYPES: tuple[type, ...] = typing.get_args(Event)
DECISION_TYPES: tuple[type, ...] = typing.get_args(Decision)
