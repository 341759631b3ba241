"""The configured guards of a gateway, and a request's input screened by them.

A guard is a check (`guards.check`) with a stage, the classes and models it applies to, what a
finding does (`block`, `redact`, `flag`) and what a failure does (`on_error`). Each check is
measured and bounded (`Guard.judge`: `timeout_s`; its seconds and its verdict go to `Stats`,
the gateway's metrics), and a failure is logged once per guard and kind.

The stages follow LiteLLM's guardrail hooks: `input` is its `pre_call` (before the request is
queued: a blocked request never reaches an engine, never holds a slot, is never charged), and
`output` its `post_call`, which here also covers a stream as it goes (`guards.output`), where
LiteLLM's Presidio masking holds a streamed answer whole and sends it in one chunk at the end.

    guards = GuardSet.of(cfg, Moderation(), stats)      # None when no guard is configured
    body, screen = await guards.screen(body, "chat", "interactive", "llama", True, verdicts)
    # body: the request's body redacted (None: unchanged); screen: its answer's (None: no output guard)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tailguard.clock import monotonic
from tailguard.config import GatewayConfig, GuardConfig
from tailguard.errors import ContentBlocked, GuardUnavailable
from tailguard.guards.check import BLOCK, ERROR_CLOSED, ERROR_OPEN, FLAG, PASS, REDACT, Check, Finding, PatternCheck
from tailguard.guards.moderation import Moderation, ModerationCheck
from tailguard.guards.output import OutputScreen
from tailguard.guards.patterns import Finder, redact
from tailguard.guards.texts import leaves, replaced

log = logging.getLogger("tailguard.gateway")

OUTPUT_ROUTES = frozenset({"chat", "completions"})  # the answers an output guard reads (OpenAI's chunk shapes)


class Stats(Protocol):
    """Where each check's time and verdict go (the gateway's metrics)."""

    def observe(self, guard: str, stage: str, seconds: float, verdict: str) -> None: ...


@dataclass(slots=True)
class Guard:
    name: str
    stage: str
    action: str
    on_error: str
    timeout_s: float
    window_chars: int
    check: Check
    classes: frozenset[str] | None = None
    models: frozenset[str] | None = None

    def applies(self, cls: str, model: str | None) -> bool:
        return ((self.classes is None or cls in self.classes)
                and (self.models is None or model in self.models))

    @property
    def holds(self) -> bool:
        """A stream is held behind the engine for it: it may stop or change what goes out."""
        return self.action != FLAG

    async def judge(self, texts: Sequence[str], stats: Stats, verdicts: list[str]) -> Finding | None:
        """The check's finding on `texts`, measured and bounded; None when it failed and the guard
        fails open; `GuardUnavailable` when it fails closed. Its verdict is counted, and added to
        `verdicts` unless it passed."""
        started = monotonic()
        try:
            finding = self.check.inline(texts)
            if finding is None:
                async with asyncio.timeout(self.timeout_s):
                    finding = await self.check.run(texts)
        except Exception as e:  # a check's failure of any kind is the guard's on_error (never a cancel)
            verdict = ERROR_OPEN if self.on_error == "open" else ERROR_CLOSED
            self._failed(e)
            self._count(stats, started, verdict, verdicts)
            if verdict == ERROR_CLOSED:
                raise GuardUnavailable(self.name) from None
            return None
        self._count(stats, started, self.action if finding.flagged else PASS, verdicts)
        return finding

    def _count(self, stats: Stats, started: float, verdict: str, verdicts: list[str]) -> None:
        stats.observe(self.name, self.stage, monotonic() - started, verdict)
        if verdict != PASS:
            verdicts.append(f"{self.name}:{verdict}")

    def _failed(self, e: Exception) -> None:
        kind = "timeout" if isinstance(e, TimeoutError) else type(e).__name__
        key = (self.name, kind)
        if key not in _SAID:
            _SAID.add(key)
            why = f"no answer within {self.timeout_s:g} s" if kind == "timeout" else f"{kind}: {e}"
            log.warning("guard %s (%s) failed: %s; it fails %s (said once per kind; "
                        "tailguard_guard_checks_total counts each)", self.name, self.stage, why, self.on_error)


_SAID: set[tuple[str, str]] = set()


def _check(g: GuardConfig, cfg: GatewayConfig, moderation: Moderation) -> Check:
    if g.check == "personal_data":
        return PatternCheck(cfg.redaction.finder(g.kinds))
    if g.check == "patterns":
        return PatternCheck(Finder.denying(g.name, g.patterns))
    assert g.url is not None
    return ModerationCheck(moderation, g.url, api_key=g.api_key, model=g.model, categories=g.categories,
                           window_chars=g.window_chars)


class GuardSet:
    """A config's guards, in order; which apply to a request is worked out once per class,
    model and stage."""

    def __init__(self, guards: Sequence[Guard], stats: Stats, max_event_bytes: int = 1 << 20) -> None:
        self.guards = tuple(guards)
        self.stats = stats
        self._max_event_bytes = max_event_bytes
        self._applying: dict[tuple[str, str, str | None], tuple[Guard, ...]] = {}

    @classmethod
    def of(cls, cfg: GatewayConfig, moderation: Moderation, stats: Stats) -> GuardSet | None:
        if not cfg.guards:
            return None
        guards = [Guard(g.name, g.stage, g.action, g.on_error, g.timeout_s, g.window_chars, _check(g, cfg, moderation),
                        None if g.classes is None else frozenset(g.classes),
                        None if g.models is None else frozenset(g.models))
                  for g in cfg.guards]
        return cls(guards, stats, cfg.limits.max_event_bytes)

    def applying(self, stage: str, cls: str, model: str | None) -> tuple[Guard, ...]:
        key = (stage, cls, model)
        found = self._applying.get(key)
        if found is None:
            if len(self._applying) > 4096:  # models are the clients' words: keep the cache bounded
                self._applying.clear()
            found = self._applying[key] = tuple(g for g in self.guards if g.stage == stage and g.applies(cls, model))
        return found

    async def screen(self, body: dict[str, Any], endpoint: str, cls: str, model: str | None, stream: bool,
                     verdicts: list[str]) -> tuple[dict[str, Any] | None, OutputScreen | None]:
        """A request as it arrives: its input screened (`screen_input`), and the screen its answer
        will pass (`output`)."""
        return (await self.screen_input(body, cls, model, verdicts),
                self.output(endpoint, cls, model, stream=stream, verdicts=verdicts))

    async def screen_input(self, body: dict[str, Any], cls: str, model: str | None,
                           verdicts: list[str]) -> dict[str, Any] | None:
        """Run the input guards that apply on the request's texts, in order: raises
        `ContentBlocked` (a block) or `GuardUnavailable` (a failure, closed); returns the body
        with what was redacted replaced, or None when nothing was."""
        guards = self.applying("input", cls, model)
        if not guards:
            return None
        found = leaves(body)
        if not found:
            return None
        texts = [t for _, t in found]
        changed = False
        for g in guards:
            finding = await g.judge(texts, self.stats, verdicts)
            if finding is None or not finding.flagged:
                continue
            if g.action == BLOCK:
                raise ContentBlocked(g.name, finding.categories)
            if g.action == REDACT and finding.spans:
                texts = [redact(t, spans) for t, spans in zip(texts, finding.spans)]
                changed = True
        if not changed:
            return None
        return replaced(body, {path: t for (path, old), t in zip(found, texts) if t != old})

    def output(self, endpoint: str, cls: str, model: str | None, *, stream: bool,
               verdicts: list[str]) -> OutputScreen | None:
        """The output screen of one request, or None when no output guard applies (or its route's
        answers are not OpenAI's chunks: Responses and Messages are not screened)."""
        if endpoint not in OUTPUT_ROUTES:
            return None
        guards = self.applying("output", cls, model)
        if not guards:
            return None
        return OutputScreen(guards, self.stats, verdicts, chat=endpoint == "chat", stream=stream,
                            max_event_bytes=self._max_event_bytes)
