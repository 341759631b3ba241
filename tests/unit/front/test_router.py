"""Router: among the backends that serve the model in the class's pools (healthy, not ejected,
with room for the class), the one the policy picks: least load (tokens in flight over capacity),
prefix affinity within a load bound, p2c, round-robin."""

from __future__ import annotations

from tailguard.front.ejection import Ejector
from tailguard.front.params import BackendSpec, ClassSpec, EjectionParams, HealthParams, RoutingParams
from tailguard.front.queue import Pending
from tailguard.front.latency import Latency
from tailguard.front.router import NO_ROUTE, Route, Router
from tailguard.front.slots import BackendPool

CLASSES = [ClassSpec(name="interactive", rank=0), ClassSpec(name="batch", rank=1, max_share=0.5)]
SPECS = {c.name: c for c in CLASSES}


def pending(cls: str = "interactive", tokens: int = 10) -> Pending:
    return Pending("r", cls, 0 if cls == "interactive" else 1, tokens, 0.0, 30.0)


def make(*specs: tuple[str, int, float], **kw: object) -> BackendPool:
    backends = [BackendSpec(name=n, max_concurrency=c, weight=w, **kw) for n, c, w in specs]  # type: ignore[arg-type]
    return BackendPool(backends, CLASSES, HealthParams(unhealthy_after=1))


def router(policy: str = "least-tokens", ejection: EjectionParams | None = None, **kw: object) -> Router:
    return Router(RoutingParams(policy=policy, **kw), Ejector(ejection or EjectionParams()))  # type: ignore[arg-type]


def take(rt: Router, pool: BackendPool, cls: str = "interactive", route: Route = NO_ROUTE, tokens: int = 10,
         spec: ClassSpec | None = None) -> str | None:
    b = rt.choose(pool, spec or SPECS[cls], pending(cls, tokens), route, 0.0)
    if b is not None:
        pool.acquire(b, cls, tokens)
        rt.bound(b, route)
    return b


def test_equal_backends_take_turns() -> None:
    pool, rt = make(("a", 4, 1.0), ("b", 4, 1.0), ("c", 4, 1.0)), router()
    assert [take(rt, pool) for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]


def test_least_relative_load_wins() -> None:
    pool, rt = make(("small", 2, 1.0), ("big", 8, 1.0)), router()
    order = [take(rt, pool) for _ in range(10)]
    # Load = tokens in flight with the new request's / max_concurrency: each goes where it leaves the
    # lower load, so big takes 8 of 10, small 2, in proportion to their slots.
    assert order == ["big", "big", "big", "small", "big", "big", "big", "big", "small", "big"]
    assert take(rt, pool) is None


def test_load_counts_tokens_not_requests() -> None:
    pool, rt = make(("a", 4, 1.0), ("b", 4, 1.0)), router()
    assert take(rt, pool, tokens=8000) == "a"
    # b takes the next three small ones: 3 x 100 tokens is still less than a's one long job.
    assert [take(rt, pool, tokens=100) for _ in range(3)] == ["b", "b", "b"]


def test_weight_scales_capacity_in_the_comparison() -> None:
    pool, rt = make(("a", 8, 1.0), ("b", 8, 3.0)), router()
    assert [take(rt, pool) for _ in range(4)] == ["b", "b", "a", "b"]


def test_unhealthy_and_excluded_backends_are_skipped() -> None:
    pool, rt = make(("a", 4, 1.0), ("b", 4, 1.0)), router()
    pool.mark_failure("a")
    assert rt.choose(pool, SPECS["interactive"], pending(), NO_ROUTE, 0.0) == "b"
    assert rt.choose(pool, SPECS["interactive"], pending(), NO_ROUTE, 0.0, exclude=("b",)) is None
    pool.mark_success("a")
    assert rt.choose(pool, SPECS["interactive"], pending(), NO_ROUTE, 0.0, exclude=("b",)) == "a"


def test_class_share_limits_the_choice() -> None:
    pool, rt = make(("a", 4, 1.0), ("b", 2, 1.0)), router()
    # batch may hold 2 slots of a and 1 of b.
    assert [take(rt, pool, "batch") for _ in range(4)] == ["a", "b", "a", None]
    # Both half full now: a, with twice the slots, has the lower load with one more; then b, then a.
    assert [take(rt, pool, "interactive") for _ in range(4)] == ["a", "b", "a", None]


def test_only_backends_serving_the_model_take_it() -> None:
    pool = BackendPool([BackendSpec("a", 4, models=("llama",)), BackendSpec("b", 4, models=("qwen",)),
                        BackendSpec("c", 4)], CLASSES)
    rt = router()
    llama = Route("llama")
    assert {take(rt, pool, route=llama) for _ in range(4)} == {"a"}  # known to serve it, before c (not known)
    assert take(rt, pool, route=llama) == "c"  # a is full: c, which may serve it, next
    pool.learn_models("c", ["mistral"])
    assert rt.choose(pool, SPECS["interactive"], pending(), Route("qwen"), 0.0) == "b"
    assert rt.choose(pool, SPECS["interactive"], pending(), Route("mistral"), 0.0) == "c"
    assert rt.choose(pool, SPECS["interactive"], pending(), Route("other"), 0.0) is None


def test_pools_are_tried_in_order() -> None:
    pool = BackendPool([BackendSpec("chat1", 1, pool="chat"), BackendSpec("shared1", 2, pool="shared"),
                        BackendSpec("bulk1", 2, pool="bulk")], CLASSES)
    rt = router()
    chat = ClassSpec(name="interactive", rank=0, pools=("chat", "shared"))
    order = [take(rt, pool, spec=chat) for _ in range(4)]
    assert order == ["chat1", "shared1", "shared1", None]  # never bulk


def test_prefix_affinity_returns_to_the_instance_that_holds_the_prefix() -> None:
    pool, rt = make(("a", 8, 1.0), ("b", 8, 1.0), ("c", 8, 1.0), ("d", 8, 1.0)), router("prefix-affinity")
    groups = {g: Route(None, tuple(range(g * 100, g * 100 + 20))) for g in range(4)}
    first = {g: take(rt, pool, route=groups[g]) for g in range(4)}
    assert sorted(first.values()) == ["a", "b", "c", "d"]  # idle: spread as least-tokens does
    # The same groups again, with a different last block each time: each finds its own instance.
    for g in range(4):
        r = Route(None, groups[g].prefix[:19] + (9999 + g,))
        assert take(rt, pool, route=r) == first[g]


def test_prefix_affinity_leaves_an_instance_loaded_past_the_bound() -> None:
    pool, rt = make(("a", 16, 1.0), ("b", 16, 1.0)), router("prefix-affinity", balance_factor=1.5, balance_slack=2.0)
    shared = Route(None, tuple(range(10)))
    where = [take(rt, pool, route=shared) for _ in range(8)]
    # a holds the prefix; it keeps it while its load <= 1.5 x b's + 2 requests' worth.
    assert where[0] == "a" and where[1:3] == ["a", "a"]
    assert "b" in where


def test_no_shared_prefix_routes_as_least_tokens() -> None:
    prompts = [Route(None, tuple(range(i * 50, i * 50 + 10))) for i in range(12)]
    sizes = [50 + 37 * i % 400 for i in range(12)]
    runs = []
    for policy in ("prefix-affinity", "least-tokens"):
        pool, rt = make(("a", 8, 1.0), ("b", 8, 1.0), ("c", 8, 1.0)), router(policy)
        runs.append([take(rt, pool, route=p, tokens=n) for p, n in zip(prompts, sizes)])
    assert runs[0] == runs[1]


def test_round_robin_and_p2c() -> None:
    pool, rt = make(("a", 8, 1.0), ("b", 8, 1.0), ("c", 8, 1.0)), router("round-robin")
    assert [take(rt, pool, tokens=1000 if i == 0 else 1) for i in range(6)] == ["a", "b", "c", "a", "b", "c"]
    runs = []
    for _ in range(2):  # seeded: the same calls, the same choices
        pool, rt = make(("a", 8, 1.0), ("b", 8, 1.0), ("c", 8, 1.0)), router("p2c", seed=7)
        runs.append([take(rt, pool) for _ in range(12)])
    assert runs[0] == runs[1] and set(runs[0]) == {"a", "b", "c"}


def test_engine_reported_work_counts_while_fresh() -> None:
    pool, rt = make(("a", 4, 1.0), ("b", 4, 1.0)), router(engine_load_ttl_s=10.0)
    pool.engine_load("a", 6, now=0.0)  # six requests of other clients wait in a's engine
    assert rt.choose(pool, SPECS["interactive"], pending(), NO_ROUTE, 5.0) == "b"
    take(rt, pool)  # b
    # Stale: a's reading is ignored, and a has nothing in flight of ours.
    assert rt.choose(pool, SPECS["interactive"], pending(), NO_ROUTE, 11.0) == "a"


def test_ejected_backends_are_skipped_until_too_many_are_out() -> None:
    ej = Ejector(EjectionParams(consecutive_failures=1, max_ejected_share=1.0, panic_threshold=0.5))
    rt = Router(RoutingParams(policy="least-tokens"), ej)
    pool = make(("a", 4, 1.0), ("b", 4, 1.0), ("c", 4, 1.0), ("d", 4, 1.0))
    names = ["a", "b", "c", "d"]
    ej.failed("a", 0.0, names)
    assert {take(rt, pool) for _ in range(3)} == {"b", "c", "d"}
    ej.failed("b", 0.0, names)
    ej.failed("c", 0.0, names)
    # Three of four out: fewer than half the healthy left, so ejections are ignored (panic).
    assert rt.choose(pool, SPECS["interactive"], pending(), NO_ROUTE, 0.0) == "a"


def test_a_backend_known_to_serve_the_model_is_preferred_to_one_not_yet_known() -> None:
    pool = BackendPool([BackendSpec("a", 4), BackendSpec("b", 4)], CLASSES)
    rt = router()
    pool.learn_models("b", ["qwen"])
    assert {take(rt, pool, route=Route("qwen")) for _ in range(3)} == {"b"}
    assert take(rt, pool, route=Route("llama")) == "a"  # nobody known serves it: a might


def test_a_model_nobody_serves_goes_nowhere_in_a_fleet_of_one_model_as_in_one_of_several() -> None:
    one = BackendPool([BackendSpec("a", 4, models=("llama",)), BackendSpec("b", 4, models=("llama",))], CLASSES)
    assert router().serving(one, SPECS["interactive"], Route("gpt-4o")) == []
    assert router().choose(one, SPECS["interactive"], pending(), Route("gpt-4o"), 0.0) is None
    two = BackendPool([BackendSpec("a", 4, models=("llama",)), BackendSpec("b", 4, models=("qwen",))], CLASSES)
    assert router().serving(two, SPECS["interactive"], Route("gpt-4o")) == []


def test_a_backend_that_serves_slower_gets_less_work() -> None:
    pool, rt = make(("fast1", 4, 1.0), ("fast2", 4, 1.0), ("slow", 4, 1.0)), router()
    for name, seconds in (("fast1", 1.0), ("fast2", 1.3), ("slow", 5.0)):
        for _ in range(3):
            pool.served_in(name, seconds, 100, now=0.0)
    order = [take(rt, pool, tokens=100) for _ in range(10)]
    # The slow one's capacity counts about a fourth (1.3 / 5: fast2 is the median): it takes a
    # request once the fast ones hold about 4x its load; fast1 and fast2, within 2x, share alike.
    assert order[:6] == ["fast1", "fast2"] * 3 and order.count("slow") == 2


def test_a_slow_reading_needs_samples_and_is_forgotten_when_stale() -> None:
    pool, rt = make(("a", 4, 1.0), ("b", 4, 1.0)), router(slow_ttl_s=60.0, slow_min_samples=3)
    pool.served_in("a", 1.0, 100, now=0.0)
    pool.served_in("b", 9.0, 100, now=0.0)  # once: not enough to judge
    assert [rt.choose(pool, SPECS["interactive"], pending(), NO_ROUTE, 1.0)] == ["a"]  # the tie: a (never bound)
    for _ in range(2):
        pool.served_in("a", 1.0, 100, now=0.0)
        pool.served_in("b", 9.0, 100, now=0.0)
    pool.acquire("a", "interactive", 10)
    assert rt.choose(pool, SPECS["interactive"], pending(), NO_ROUTE, 1.0) == "a"  # b is slow now
    assert rt.choose(pool, SPECS["interactive"], pending(), NO_ROUTE, 61.0) == "b"  # stale: b is tried again


def test_a_name_nobody_lists_may_go_only_where_the_models_are_not_known() -> None:
    pool = BackendPool([BackendSpec("unknown", 4), BackendSpec("listed", 4, models=("llama",))], CLASSES)
    assert {s.name for s in router().serving(pool, SPECS["interactive"], Route("m"))} == {"unknown"}


def test_a_backend_whose_probes_went_stale_counts_as_saturated() -> None:
    """`a` is idle and `b` runs a request, but `a`'s probes stopped answering 40 s ago: the next
    request goes to `b`; `a` takes one only when no other backend may."""
    pool, rt = make(("a", 4, 1.0), ("b", 4, 1.0)), router(stale_after_s=30.0)
    pool.probed("a", now=0.0)
    pool.probed("b", now=39.0)
    pool.acquire("b", "interactive", 10)
    assert rt.stale(pool["a"], 40.0) and not rt.stale(pool["b"], 40.0)
    assert rt.choose(pool, SPECS["interactive"], pending(), NO_ROUTE, 40.0) == "b"
    for _ in range(3):
        pool.acquire("b", "interactive", 10)
    assert rt.choose(pool, SPECS["interactive"], pending(), NO_ROUTE, 40.0) == "a"  # b is full: a after all
    assert not rt.stale(pool["a"], 25.0)  # within the bound it is not


def test_predicted_ttft_routes_by_the_fit_with_prefix_hits_priced_in() -> None:
    """Two backends whose fits say a prefill token costs 50 us and a running request 20 ms: a
    4,000-token prompt whose first 3,000 tokens `b`'s cache holds goes to `b` though `b` runs two
    requests more (predicted 0.10 s there against 0.21 s on `a`); with nothing cached, to `a`."""
    latency = Latency()
    for backend in ("a", "b"):
        for i in range(40):
            latency.observe(backend, (100.0 * i, float(i % 5), 0.0, 0.0), 0.01 + 50e-6 * 100 * i + 0.02 * (i % 5))
    pool = make(("a", 8, 1.0), ("b", 8, 1.0))
    rt = Router(RoutingParams(policy="predicted-ttft"), Ejector(EjectionParams()), latency)
    for _ in range(2):
        pool.acquire("b", "interactive", 10)
    blocks = tuple(range(1, 64))  # 63 blocks of 64 tokens: 4,032 tokens
    rt.bound("b", Route(prefix=blocks[:47]))  # b served the first 3,008 tokens
    cached = Route(prefix=blocks, prompt_tokens=4000)
    assert rt.choose(pool, SPECS["interactive"], pending(), cached, 0.0) == "b"
    assert rt.choose(pool, SPECS["interactive"], pending(), Route(prefix=(900, 901), prompt_tokens=4000), 0.0) == "a"
