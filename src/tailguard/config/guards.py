"""The gateway's config sections for content guards (`guards:`) and for the personal data
redacted wherever text is kept (`redaction:`); pure, no I/O (docs/security.md, "Guards").

    guards:
      - {name: pii, stage: input, check: personal_data, action: redact}
      - {name: moderation, stage: output, check: moderation, url: http://guard:8000/v1/moderations}
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tailguard.config.base import _Model
from tailguard.guards.patterns import CHECKS, KINDS, Finder

Stage = Literal["input", "output"]
Action = Literal["block", "redact", "flag"]
CheckKind = Literal["personal_data", "patterns", "moderation"]


class NationalIdConfig(_Model):
    """One national id format: its shape and, where it has one, its check digit."""

    pattern: str = Field(description="A Python regex matching the id as it is written (separators included).")
    check: str | None = Field(
        default=None, description=f"Its check digit, read on its letters and digits: one of {', '.join(sorted(CHECKS))}; "
        "unset: the shape alone.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a regex: {e}") from None
        return v

    @field_validator("check")
    @classmethod
    def _known_check(cls, v: str | None) -> str | None:
        if v is not None and v not in CHECKS:
            raise ValueError(f"unknown check {v!r} (known: {', '.join(sorted(CHECKS))})")
        return v


class RedactionConfig(_Model):
    """The personal data found by the `personal_data` guard and redacted wherever the gateway
    keeps text: the access log's prompt and completion (`log_prompts`), the audit trail's
    retained text (`audit.retain_text`), and engines' error messages relayed to a client."""

    kinds: list[str] = Field(
        default_factory=lambda: list(KINDS),
        description="What is personal data: `email`, `phone`, `card` (Luhn), `iban` (mod 97), `national_id` (every "
        "entry of the national id table: us_ssn, uk_nino, ca_sin, es_dni, fr_nir, br_cpf, in_aadhaar, and "
        "`national_ids`). An empty list redacts nothing.")
    national_ids: dict[str, NationalIdConfig] = Field(
        default_factory=dict,
        description="National id formats added to the built-in table (or replacing an entry of the same name), e.g. "
        "`{employee_no: {pattern: 'EMP-\\\\d{6}'}}`; redacted as `[EMPLOYEE_NO]`.")

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, v: list[str]) -> list[str]:
        for kind in v:
            if kind not in KINDS:
                raise ValueError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
        return v

    def finder(self, kinds: list[str] | None = None) -> Finder:
        """What finds `kinds` (default: this section's) with this section's national ids."""
        table = {name: (n.pattern, n.check) for name, n in self.national_ids.items()}
        return Finder.of(self.kinds if kinds is None else kinds, table)


class GuardConfig(_Model):
    """One guard: a check run on a request's text before it is queued (`input`) or on its answer
    (`output`), and what a finding does."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$",
                      description="Its name: in the metrics' `guard` label, the access log, the audit trail and a "
                      "blocked request's error message.")
    stage: Stage = Field(description="`input`: the request's text, before it is queued (a block is a 400 "
                         "`content_policy_violation` in the route's error shape, never sent to an engine, never charged). "
                         "`output`: the answer of `/v1/chat/completions` and `/v1/completions`, whole for a non-stream "
                         "request, over a sliding window for a stream.")
    check: CheckKind = Field(
        description="`personal_data` (the kinds of `redaction:`, or `kinds`), `patterns` (the regexes of `patterns`), "
        "or `moderation`: the operator's service over OpenAI's moderation shape (`POST url` with `{input, model}`, "
        "answering `results[].flagged` and `categories`), e.g. Llama Guard behind vLLM.")
    action: Action = Field(default="block", description="On a finding: `block` (input: 400; output: the answer is "
                           "withheld, `finish_reason: content_filter`), `redact` (the found text replaced by its kind, "
                           "`[EMAIL]`: not for `moderation`, which does not say where), or `flag` (recorded: metric, "
                           "access log, audit trail; the request goes on).")
    classes: list[str] | None = Field(default=None, description="The classes it applies to (unset: every class).")
    models: list[str] | None = Field(default=None, description="The models it applies to, as requests name them after "
                                     "aliases are resolved (unset: every model).")
    on_error: Literal["open", "closed"] = Field(
        default="closed", description="When the check fails or takes longer than `timeout_s`: `closed` (input: 503 "
        "`guard_unavailable` with Retry-After; output: withheld as a block) or `open` (as if it passed; counted). "
        "Envoy's ext_proc is closed by default too (`failure_mode_allow: false`).")
    timeout_s: float = Field(default=1.0, gt=0, le=60, description="Longest wait for one check (Envoy ext_proc's "
                             "`message_timeout` is 0.2 s; a classifier on a GPU needs more for a long prompt).")
    kinds: list[str] | None = Field(default=None, description="`personal_data`: the kinds it finds (unset: "
                                    "`redaction.kinds`).")
    patterns: list[str] = Field(default_factory=list, description="`patterns`: Python regexes a text must not match "
                                "(`(?i)` for any case), found as the guard's name (`[NAME]` when redacted).")
    url: str | None = Field(default=None, description="`moderation`: the service's URL, e.g. "
                            "`http://127.0.0.1:8001/v1/moderations`.")
    api_key: str | None = Field(default=None, description="`moderation`: sent as `Authorization: Bearer` (shown "
                                "fingerprinted).")
    model: str | None = Field(default=None, description="`moderation`: the `model` field sent, when the service wants one.")
    categories: list[str] | None = Field(
        default=None, description="`moderation`: only these categories count (e.g. `[violence, self-harm]`); unset: the "
        "service's own `flagged`.")
    window_chars: int = Field(
        default=256, ge=16, le=65536,
        description="Streamed output: each check reads the text not yet sent plus the last `window_chars` characters "
        "sent, and a stream is held this far behind the engine while a guard that blocks or redacts applies, so "
        "nothing this long is sent before it is checked. A moderation check runs every `window_chars / 2` new "
        "characters; a pattern check on every chunk.")

    @model_validator(mode="after")
    def _fits_its_check(self) -> GuardConfig:
        if self.check == "patterns":
            if not self.patterns:
                raise ValueError(f"guard {self.name!r}: check `patterns` needs `patterns`")
            for rx in self.patterns:
                try:
                    re.compile(rx)
                except re.error as e:
                    raise ValueError(f"guard {self.name!r}: pattern {rx!r} is not a regex: {e}") from None
        if self.check == "moderation":
            if not self.url or not self.url.startswith(("http://", "https://")):
                raise ValueError(f"guard {self.name!r}: check `moderation` needs an http:// or https:// `url`")
            if self.action == "redact":
                raise ValueError(f"guard {self.name!r}: a moderation service does not say where in the text it "
                                 "found something, so it cannot `redact`: use `block` or `flag`")
        for kind in self.kinds or ():
            if kind not in KINDS:
                raise ValueError(f"guard {self.name!r}: unknown kind {kind!r} (known: {', '.join(KINDS)})")
        return self
