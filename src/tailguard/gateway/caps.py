"""What a request may ask for: default, clamp or reject `max_tokens`, bound the prompt, and size
the job for shortest-job-first; pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tailguard.errors import BadRequest
from tailguard.gateway.config import ClassConfig, OutputEstimateConfig
from tailguard.wire.openai import ParsedRequest


@dataclass(slots=True, frozen=True)
class Capped:
    """The request as it will go upstream.

    `body` is the body to send: the client's own dict when `body_changed` is False (so the
    driver forwards the raw bytes it already has), or a shallow copy with the token limit set.
    """

    max_tokens: int | None  # the limit sent upstream (None: the engine's own default)
    est_tokens: int  # prompt tokens + n x max_tokens (or the class's output estimate): SJF job size
    body_changed: bool
    body: dict[str, Any]


def apply_caps(parsed: ParsedRequest, cls: ClassConfig, output_estimate_tokens: int) -> Capped:
    """Apply the class's prompt bound and token cap; raises `BadRequest` (400) on a violation."""
    if cls.max_prompt_tokens is not None and parsed.prompt_tokens > cls.max_prompt_tokens:
        param = "messages" if parsed.endpoint == "chat" else "prompt"
        raise BadRequest(
            f"The prompt is about {parsed.prompt_tokens} tokens, above the limit of {cls.max_prompt_tokens} "
            f"for class '{cls.name}'.",
            param=param, code="prompt_too_long",
        )
    asked = parsed.max_tokens
    body = parsed.body
    field = "max_tokens"
    if parsed.endpoint == "chat" and asked is not None:
        # A chat body may carry both limits (both validated) and engines differ in which wins:
        # the larger one is what the cap and the job size must assume.
        field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        other = body.get("max_tokens") if field == "max_completion_tokens" else None
        if other is not None and other > asked:
            asked, field = other, "max_tokens"
    cap = cls.max_tokens_cap
    if asked is None:
        # Without a limit the engine may generate up to the context length; the class default (or
        # its cap) keeps such a request inside the class's budget.
        fill = cls.default_max_tokens if cls.default_max_tokens is not None else cap
        if fill is None:
            return Capped(None, parsed.prompt_tokens + parsed.n * output_estimate_tokens, False, body)
        new = dict(body)
        new["max_tokens"] = fill
        return Capped(fill, parsed.prompt_tokens + parsed.n * fill, True, new)
    if cap is None or asked <= cap:
        return Capped(asked, parsed.prompt_tokens + parsed.n * asked, False, body)
    if cls.cap_mode == "reject":
        raise BadRequest(
            f"'{field}' is {asked}, above the cap of {cap} for class '{cls.name}'.",
            param=field, code="max_tokens_over_cap",
        )
    new = dict(body)
    for name in ("max_tokens", "max_completion_tokens") if parsed.endpoint == "chat" else ("max_tokens",):
        v = body.get(name)
        if v is not None and v > cap:
            new[name] = cap
    return Capped(cap, parsed.prompt_tokens + parsed.n * cap, True, new)


class OutputEstimator:
    """Per-class running average of real output length: the job size of requests without `max_tokens`.

        est = OutputEstimator(cfg.scheduler.output_estimate)
        capped = apply_caps(parsed, cls, est.estimate(cls.name))
        ...                                   # when the request ends, with its real output tokens:
        est.observe(cls.name, output_tokens)
    """

    def __init__(self, cfg: OutputEstimateConfig) -> None:
        self._initial = float(cfg.initial_tokens)
        self._weight = cfg.ewma_weight
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
