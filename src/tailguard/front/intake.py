"""The way into the front, for every driver: a request's class, whose it is, what it may ask for
(its output limit defaulted, clamped or refused; its prompt bounded), its job size for
shortest-job-first, and whether its generation can be suspended and continued; pure, no I/O.

The gateway (`gateway/http/proxy.py`) reads a request off HTTP, the discrete-event runs
(`sweep/virtual.py`, `benchmarks/seed_des.py`) draw one from a workload; both hand it here as an
`Asked`, so a simulated gateway refuses, caps and sizes exactly as the configured one does.

    intake = Intake(cfg.intake_params())
    asked = Asked.of(parsed, class_header(headers), api_key)
    cls = intake.classify(asked)                  # Refused: a class or service tier it does not know
    caller = intake.caller(asked.api_key)
    accepted = intake.accept(asked, cls, estimator.estimate(cls.name))  # Refused: over a bound
    accepted.slo                                  # its targets: its class's, its TTFT target tightened
    ...                                           # the request ended well, with its real output:
    estimator.observe(cls.name, output_tokens)

Classes, in order of precedence: the `X-Tailguard-Class` header, then OpenAI's `service_tier`,
then the route's own class (`route_classes`: the pooling routes'), then the caller's API key
default, then `default_class`. A name the client states explicitly and
the gateway does not know is a 400 (a silent fallback would hide a client bug behind slow answers).
A key that lists its `allowed_classes` gets a class it names outside them refused with a 403, or
lowered to its best allowed class when its key says `lower`; a default outside them is lowered
silently (the client named nothing). A key that lists its `allowed_models` gets any other model
refused with a 403 (LiteLLM's `models` on a virtual key).

A request may ask for a tighter TTFT target than its class's (`x-tailguard-ttft-slo-ms`): it is
raised to the tightest its class allows (`slo.min_ttft_s`) or its key's rights allow
(`min_ttft_slo_s`), whichever is tighter, and never looser than its class's own target; with
neither floor, a request may not tighten its class's target (the header changes nothing). A value
that is not a positive number of milliseconds is a 400.

Each refusal is a `Refused`, in the intake's own words (no HTTP here): the gateway answers it as a
403 when it is `forbidden`, else a 400 (`gateway.classes.answer`); a DES run counts it refused.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, get_args

from tailguard.errors import TailguardError
from tailguard.front.params import ClassSpec, IntakeParams, KeySpec, OutputEstimateParams, ServiceTier, Slo
from tailguard.wire.headers import CLASS_HEADER, TTFT_SLO_HEADER
from tailguard.wire.openai import CHUNKED, POOLING, Endpoint, ParsedRequest

SERVICE_TIERS: tuple[str, ...] = get_args(ServiceTier)
NO_CLASS = "none"  # the class of a request refused before it had one (a metrics label)

# Fields whose output a continuation could not reproduce: structured output restarts its
# grammar, tool calls are not plain text, several choices or echoed prompts are not one text.
_NOT_RESUMABLE = ("tools", "functions", "tool_choice", "response_format", "guided_json", "guided_regex",
                  "guided_choice", "guided_grammar", "structured_outputs", "logprobs", "top_logprobs", "echo",
                  "best_of", "suffix")


class KeyDigest(str):
    """A key known only by its SHA-256 digest, looked up as it is: the key that made a batch,
    recorded with the batch (never the key itself) so that its lines run as that key's requests."""


def key_id(api_key: str) -> str:
    """How a key is found: its SHA-256 hex digest. Keys are held and looked up only by digest, so
    no comparison ever runs over a secret's bytes (where an early mismatch would time out sooner
    on a closer guess); the lookup's timing tells only about a digest, which cannot be inverted."""
    if isinstance(api_key, KeyDigest):
        return str(api_key)
    return hashlib.sha256(api_key.encode("utf-8", "surrogateescape")).hexdigest()


# The field that holds each route's prompt, named in a refusal.
_PROMPT_PARAMS: dict[str, str] = {"chat": "messages", "messages": "messages", "responses": "input",
                                  "embeddings": "input"}


class Refused(TailguardError):
    """The intake turned a request away: what it asked is wrong (a class or tier the gateway does
    not know, a bound passed, a header that is no number), or (`forbidden`) its key may not have
    it (a class, a model). `param` names the field or header, `code` the refusal."""

    def __init__(self, message: str, *, param: str, code: str, forbidden: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.forbidden = forbidden

    def __repr__(self) -> str:
        return f"Refused(code={self.code!r}, forbidden={self.forbidden}, message={self.message!r})"

@dataclass(frozen=True, slots=True)
class Asked:
    """What a request asks for, as its driver read it. `body` is its validated JSON body
    (`wire.openai`): the `service_tier`, the token limits and what makes it resumable are read
    from it, and a capped copy of it goes upstream. `max_tokens` is its output limit as
    `wire.openai` reads it (for chat, `max_completion_tokens` when given)."""

    endpoint: Endpoint
    body: dict[str, Any]
    prompt_tokens: int
    max_tokens: int | None
    n: int = 1  # choices: each is a generation of its own
    class_header: str | None = None  # `X-Tailguard-Class` as sent
    api_key: str | None = None
    ttft_slo_ms: str | None = None  # `x-tailguard-ttft-slo-ms` as sent

    @classmethod
    def of(cls, parsed: ParsedRequest, class_header: str | None, api_key: str | None,
           ttft_slo_ms: str | None = None) -> Asked:
        return cls(parsed.endpoint, parsed.body, parsed.prompt_tokens, parsed.max_tokens, parsed.n,
                   class_header, api_key, ttft_slo_ms)


@dataclass(frozen=True, slots=True)
class Accepted:
    """The request as it goes upstream and into the front.

    `body` is the body to send: the client's own dict when `body_changed` is False (so the
    driver forwards the raw bytes it already has), or a shallow copy with the token limit set.
    """

    max_tokens: int | None  # the limit sent upstream (None: the engine's own default)
    est_tokens: int  # prompt tokens + n x max_tokens (or the class's output estimate): SJF job size
    body_changed: bool
    body: dict[str, Any]
    resumable: bool  # its generation can be suspended and continued from its text
    model: str | None = None  # the model it names, an alias resolved (None: none named, any backend)
    slo: Slo | None = None  # its targets: its class's, its TTFT tightened by `x-tailguard-ttft-slo-ms`

    @property
    def ttft_slo_s(self) -> float | None:
        """Its TTFT target (None: none)."""
        return None if self.slo is None else self.slo.ttft_s
    own_priority: bool = False  # its `priority` field is its own (its key may set it): an engine gets it as sent


class Intake:
    """The configured classes and keys, and the rules a request passes on its way in (see the
    module docstring)."""

    def __init__(self, params: IntakeParams) -> None:
        self.params = params
        self._by_name: dict[str, ClassSpec] = {c.name: c for c in params.classes}
        # Stable order: by rank, then as configured, so "the lowest rank" is well defined.
        ordered = sorted(params.classes, key=lambda c: c.rank)
        self._known = ", ".join(c.name for c in ordered)
        self._default = self._by_name[params.default_class]
        self._tiers = self._tier_map(ordered)
        self._key_defaults: dict[str, ClassSpec | None] = {
            key: (self._by_name[k.default_class] if k.default_class is not None else None)
            for key, k in params.keys.items()
        }
        # Each restricted key's allowed classes, and its best (lowest-rank) one.
        self._allowed: dict[str, tuple[frozenset[str], ClassSpec]] = {
            key: (frozenset(k.allowed_classes), min((self._by_name[n] for n in k.allowed_classes), key=_rank))
            for key, k in params.keys.items() if k.allowed_classes
        }

    def _tier_map(self, ordered: Sequence[ClassSpec]) -> dict[str, ClassSpec | None]:
        first, last = ordered[0], ordered[-1]
        interactive = self._by_name.get("interactive")
        tiers: dict[str, ClassSpec | None] = {
            "priority": interactive or first,
            "scale": interactive or first,
            "default": interactive or self._default,
            "flex": self._by_name.get("batch") or last,
            "auto": None,
        }
        for tier, name in self.params.service_tier_map.items():
            tiers[tier] = self._by_name[name]
        return tiers

    def tier_class(self, tier: str) -> ClassSpec | None:
        """The class `service_tier` `tier` puts a request in; None for `auto` or an unknown tier."""
        return self._tiers.get(tier)

    def key(self, api_key: str | None) -> KeySpec | None:
        """What a presented key may do; None when it is not a configured key (or there is none)."""
        return self.params.keys.get(key_id(api_key)) if api_key is not None and self.params.keys else None

    def caller(self, api_key: str | None) -> str | None:
        """Whose request it is: its key's name (metering, limits); None without a known key."""
        k = self.key(api_key)
        return k.caller if k is not None else None

    def classify(self, asked: Asked) -> ClassSpec:
        """The request's class; `Refused` for an unknown header class or service tier, and
        (`forbidden`) for a class its key may not use (unless the key lowers it)."""
        named = self._asked_class(asked)
        digest = key_id(asked.api_key) if asked.api_key is not None and self._allowed else None
        allowed = self._allowed.get(digest) if digest is not None else None
        if named is None:
            cls = self._key_default(asked)
            return cls if allowed is None or cls.name in allowed[0] else allowed[1]
        if allowed is None or named.name in allowed[0]:
            return named
        k = self.params.keys[digest] if digest is not None else None
        if k is not None and k.lower:
            return allowed[1]
        raise Refused(f"This API key may not use class '{named.name}'; it may use: "
                        f"{', '.join(sorted(allowed[0]))}.", param=CLASS_HEADER, code="class_not_allowed",
                      forbidden=True)

    def allow_model(self, asked: Asked) -> None:
        """`Refused` (`forbidden`) when the request's key lists its models and this one is not among
        them (not forbidden when it names none: which model it may use is for the request to say)."""
        k = self.key(asked.api_key)
        if k is None or k.allowed_models is None:
            return
        model = asked.body.get("model")
        if not isinstance(model, str):
            raise Refused("'model' is required: this API key may use only the models it lists.", param="model",
                             code="missing_required_parameter")
        if model not in k.allowed_models:
            raise Refused(f"This API key may not use model {model[:64]!r}.", param="model", code="model_not_allowed",
                          forbidden=True)

    def _key_default(self, asked: Asked) -> ClassSpec:
        """A class the client did not name: its route's own (the pooling routes'), its key's
        default, or the gateway's."""
        by_route = self.params.route_classes.get(asked.endpoint)
        if by_route is not None:
            return self._by_name[by_route]
        if asked.api_key is not None and self._key_defaults:
            by_key = self._key_defaults.get(key_id(asked.api_key))
            if by_key is not None:
                return by_key
        return self._default

    def _asked_class(self, asked: Asked) -> ClassSpec | None:
        """The class the request names itself (header, then `service_tier`), or None."""
        if asked.class_header is not None:
            return self._named(asked.class_header.strip())
        tier = asked.body.get("service_tier")
        if tier is not None:
            if not isinstance(tier, str) or tier not in self._tiers:
                raise Refused(
                    f"'service_tier' must be one of {', '.join(SERVICE_TIERS)}; got {tier!r}.",
                    param="service_tier", code="invalid_value",
                )
            return self._tiers[tier]
        return None

    def _named(self, name: str) -> ClassSpec:
        cls = self._by_name.get(name)
        if cls is None:
            shown = name if len(name) <= 64 else name[:64] + "..."  # a header may hold 8 KB: named, not echoed
            raise Refused(
                f"Unknown request class {shown!r} in header {CLASS_HEADER}; known classes: {self._known}.",
                param=CLASS_HEADER, code="unknown_class",
            )
        return cls

    def accept(self, asked: Asked, cls: ClassSpec, output_estimate_tokens: int) -> Accepted:
        """Apply `cls`'s prompt bound and output cap, size the job (`output_estimate_tokens`
        per choice when it has no limit) and resolve the model's alias; `Refused` on a
        violation, and (`forbidden`) for a model its key may not use.

        A `priority` field is the class's to set (the gateway writes it for engines that have a
        priority queue, `Kind.priority_for`): a client's own is dropped unless its key may set it
        (`set_priority`), so a batch-only key cannot jump an engine's queue with `priority: -100`
        on any kind of backend."""
        self.allow_model(asked)
        ttft_slo_s = self._ttft_target(asked, cls) if asked.ttft_slo_ms is not None else None
        body = asked.body
        own = "priority" in body and self._sets_priority(asked.api_key)
        changed = "priority" in body and not own
        if changed:
            body = {f: v for f, v in body.items() if f != "priority"}
        model = body.get("model")
        model = model if isinstance(model, str) else None
        target = self.params.aliases.get(model) if model is not None else None
        if target is not None:
            body = {**body, "model": target}  # sent upstream as the served name
            changed = True
        if not changed and not own:  # the usual request: nothing to replace
            accepted = self._capped(asked, cls, output_estimate_tokens, model)
        else:
            capped = self._capped(replace(asked, body=body), cls, output_estimate_tokens,
                                  model if target is None else target)
            accepted = replace(capped, body_changed=capped.body_changed or changed, own_priority=own)
        slo = cls.slo if ttft_slo_s is None else replace(cls.slo or Slo(), ttft_s=ttft_slo_s)
        return accepted if slo is None else replace(accepted, slo=slo)

    def _sets_priority(self, api_key: str | None) -> bool:
        k = self.key(api_key)
        return k is not None and k.set_priority

    def _ttft_target(self, asked: Asked, cls: ClassSpec) -> float | None:
        """The request's own TTFT target from `x-tailguard-ttft-slo-ms` (see the module docstring),
        or None when it keeps its class's; `Refused` for a value that is not a positive number."""
        raw = asked.ttft_slo_ms
        assert raw is not None
        try:
            asked_s = float(raw.strip()) / 1000.0
        except ValueError:
            asked_s = math.nan
        if not (asked_s > 0.0 and math.isfinite(asked_s)):
            shown = raw if len(raw) <= 32 else raw[:32] + "..."
            raise Refused(f"Header {TTFT_SLO_HEADER} must be a positive number of milliseconds; got {shown!r}.",
                             param=TTFT_SLO_HEADER, code="invalid_ttft_slo")
        slo = cls.slo
        key = self.key(asked.api_key)
        floors = [f for f in (slo.min_ttft_s if slo is not None else None,
                              key.min_ttft_slo_s if key is not None else None) if f is not None]
        if not floors:
            return None
        own = max(asked_s, min(floors))
        target = slo.ttft_s if slo is not None else None
        return own if target is None or own < target else None

    def _capped(self, asked: Asked, cls: ClassSpec, output_estimate_tokens: int, model: str | None) -> Accepted:
        _bound_prompt(asked, cls)
        if asked.endpoint in POOLING:  # generates nothing: the job is its input
            return _accepted(asked, None, asked.body, 0, model)
        asked_limit, field = _asked_limit(asked)
        cap = cls.max_tokens_cap
        if asked_limit is None:
            # Without a limit the engine may generate up to the context length; the class default (or
            # its cap) keeps such a request inside the class's budget.
            fill = cls.default_max_tokens if cls.default_max_tokens is not None else cap
            if fill is None:
                return _accepted(asked, None, asked.body, output_estimate_tokens, model)
            return _accepted(asked, fill, {**asked.body, field: fill}, fill, model)
        if cap is None or asked_limit <= cap:
            return _accepted(asked, asked_limit, asked.body, asked_limit, model)
        if cls.cap_mode == "reject":
            raise Refused(
                f"'{field}' is {asked_limit}, above the cap of {cap} for class '{cls.name}'.",
                param=field, code="max_tokens_over_cap",
            )
        clamped = dict(asked.body)
        for name in ("max_tokens", "max_completion_tokens") if asked.endpoint == "chat" else (field,):
            v = asked.body.get(name)
            if v is not None and v > cap:
                clamped[name] = cap
        return _accepted(asked, cap, clamped, cap, model)


def _rank(cls: ClassSpec) -> int:
    return cls.rank


def _bound_prompt(asked: Asked, cls: ClassSpec) -> None:
    if cls.max_prompt_tokens is not None and asked.prompt_tokens > cls.max_prompt_tokens:
        raise Refused(
            f"The prompt is about {asked.prompt_tokens} tokens, above the limit of {cls.max_prompt_tokens} "
            f"for class '{cls.name}'.",
            param=_PROMPT_PARAMS.get(asked.endpoint, "prompt"), code="prompt_too_long",
        )


def _asked_limit(asked: Asked) -> tuple[int | None, str]:
    """The output limit the request asks for and the field that says it. A chat body may carry
    both limits (both validated) and engines differ in which wins: the larger one is what the cap
    and the job size must assume."""
    limit, body = asked.max_tokens, asked.body
    if asked.endpoint == "responses":
        return limit, "max_output_tokens"
    if asked.endpoint != "chat" or limit is None:
        return limit, "max_tokens"
    if body.get("max_completion_tokens") is None:
        return limit, "max_tokens"
    other = body.get("max_tokens")
    if other is not None and other > limit:
        return other, "max_tokens"
    return limit, "max_completion_tokens"


def _accepted(asked: Asked, max_tokens: int | None, body: dict[str, Any], per_choice_tokens: int,
              model: str | None) -> Accepted:
    """The job is the prompt plus `per_choice_tokens` for each choice (each is a generation)."""
    return Accepted(max_tokens, asked.prompt_tokens + asked.n * per_choice_tokens, body is not asked.body, body,
                    resumable(body, asked.endpoint), model)


def resumable(body: Mapping[str, Any], endpoint: Endpoint) -> bool:
    """True if the generation of `body` can be suspended and continued from its text (chat and
    completions only: a Responses or Messages stream's typed events are not continued yet)."""
    if endpoint not in CHUNKED:
        return False
    for key in _NOT_RESUMABLE:
        v = body.get(key)
        if v is not None and v is not False:
            return False
    n = body.get("n")
    if n is not None and n != 1:
        return False
    if endpoint == "completions":
        return isinstance(body.get("prompt"), str)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    if body.get("continue_final_message"):
        last = messages[-1]
        # The client continues its own assistant message: we can extend it only if it is text.
        return isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), str)
    return True


class OutputEstimator:
    """Per-class running average of real output length: the job size of requests without a limit.
    One per driver (a gateway, a simulated run), kept across reloads.

        est = OutputEstimator(cfg.scheduler.output_estimate.params())
        accepted = intake.accept(asked, cls, est.estimate(cls.name))
        ...                                   # when the request has ended well, with its real output:
        est.observe(cls.name, output_tokens)
    """

    def __init__(self, params: OutputEstimateParams) -> None:
        self._initial = float(params.initial_tokens)
        self._weight = params.ewma_weight
        self._mean: dict[str, float] = {}

    def estimate(self, cls: str) -> int:
        return max(1, round(self._mean.get(cls, self._initial)))

    def observe(self, cls: str, output_tokens: int) -> None:
        """Feed one finished request's output length (only requests that ran to their end)."""
        if output_tokens < 0:
            raise ValueError(f"output_tokens must be >= 0, got {output_tokens}")
        prev = self._mean.get(cls)
        if prev is None:
            self._mean[cls] = float(output_tokens)
        else:
            self._mean[cls] = prev + self._weight * (output_tokens - prev)
