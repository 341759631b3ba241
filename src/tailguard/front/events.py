"""What goes into the front and what comes out of it: typed events and decisions; pure.

A driver tells the front what happened as one of the events below, through the front's one
chokepoint (`Front.handle(event, now)`), and carries out the decisions it gets back. Events and
decisions are plain frozen values, so a driver's whole conversation with the front can be
written down and replayed (`tailguard serve --record`, `tailguard replay`), and a wrong event is a
`WrongEvent` that names the event and the state it met, never a silent no-op (h11's shape:
python-hyper/h11, `h11/_state.py`).

    events in                                       decisions out
    Arrive(id, cls, est_tokens, model=, prefix=) -> Start | Reject (refused on arrival)
    Opened(id)    (its upstream is open)         -> Suspend of a victim, Start of the waiter
    Generated(id, tokens)  (preemptible only)    -> nothing: what a preemption weighs
    Failed(id, kind, delivered=, answered=)      -> Start again (a retry; resumed: a migration), Wait, Ejected
    FirstContent(id, backend)                    -> Drop of a hedge's other attempt
    Finished(id, outcome, tokens=)  (once)       -> Start of whoever gets the slot, HealthChanged
    Probed(backend, ok, busy=), KindLearned      -> HealthChanged, Start
    Observed(backend, ttft_s=, itl_s=)           -> Start when an adaptive cap grew
    Served(backend, models), Loaded(backend, n)  -> Start (what it serves, the engine's own load)
    Tick()  (at `next_wakeup()`)                 -> Reject(QUEUE_TIMEOUT), Readmitted, Hedge, Start
    Close()                                      -> Reject(SHUTTING_DOWN) for every queued request
    Reconfigure(params)  (a live reload)         -> Start, Retired
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tailguard.errors import TailguardError
from tailguard.front.params import FrontParams
from tailguard.types import FailureKind, Outcome, RejectReason

# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrive:
    """A request of class `cls` and job size `est_tokens` (prompt + output estimate) arrives.
    `resumable`: its output can be continued from its text, so it may be suspended if its class
    is preemptible; `max_tokens`: its output budget (what a preemption weighs); `caller`: whose
    request it is (an API key's name), refused while over its limits (`front.limits`); `model`:
    the model it names (after aliases; None: any backend may serve it); `prefix`: its prompt's
    chained block hashes, for prefix-affine routing (`front.prefix`); `pin`: the backend that holds
    its state (a Responses API follow-up goes where its `previous_response_id` was made), the only
    one that may take it while that backend is in the fleet."""

    id: str
    cls: str
    est_tokens: int
    resumable: bool = False
    max_tokens: int | None = None
    caller: str | None = None
    model: str | None = None
    prefix: tuple[int, ...] = ()
    pin: str | None = None


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
    it goes again (a `Start`) or the driver ends it with `Finished`. `backend`: which attempt
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
         | Loaded | Tick | Close | Reconfigure | Allotted | ServedElsewhere)

# --- decisions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """Send request `id` to `backend`: its first run, a retry, or (`resumed`) its continuation."""

    id: str
    backend: str
    resumed: bool = False


@dataclass(frozen=True, slots=True)
class Wait:
    """Request `id`'s attempt failed and no backend that may take its retry or continuation is
    free now: it waits in the queue, holding no slot, its client kept; a `Start(resumed=True)`
    follows when one is (or a `Reject` past its wait bound). The driver retries it from the start
    if none of the answer went out yet, else continues it from its text."""

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
    front. `retry_after_s` is what to tell the client."""

    id: str
    reason: RejectReason
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class HealthChanged:
    backend: str
    healthy: bool


@dataclass(frozen=True, slots=True)
class Hedge:
    """Send request `id` to `backend` too, beside the attempt it runs: no content came within
    its class's hedge delay. The first attempt to stream content wins (`FirstContent`)."""

    id: str
    backend: str


@dataclass(frozen=True, slots=True)
class Drop:
    """Stop request `id`'s attempt on `backend` now: the other attempt of its hedge won."""

    id: str
    backend: str


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


Decision = Start | Wait | Suspend | Reject | Hedge | Drop | HealthChanged | Ejected | Readmitted | Retired


class WrongEvent(TailguardError):
    """An event the front's state does not allow (a request ended twice, a failure of a request
    that is not running, an unknown class): a driver bug, named with the event and the state it
    met. The front is left as it was before the event."""

    def __init__(self, event: Event, state: str) -> None:
        super().__init__(f"{event!r}: {state}")
        self.event = event
        self.state = state
