"""The `backends` section of the gateway's config: `BackendConfig` (one upstream server: URL,
kind, slots, weight, key) with the checks of its name and URL. Its own module because what a
backend is stays apart from how the gateway treats backends (upstream.py)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tailguard.front import params as fp
from tailguard.front.adaptive import AdaptiveParams
from tailguard.config.base import _ADAPTIVE, _BACKEND, _Model

BackendKind = Literal["auto", "vllm", "llamacpp", "sglang", "tgi", "openai", "sim"]

class AdaptiveConfig(_Model):
    """`adaptive:` on a backend: its in-flight cap moves between `min` and `max` from its TTFT and
    ITL (`tailguard.front.adaptive`); `adaptive: true` is this with its defaults."""

    min: int = Field(default=_ADAPTIVE.min_cap, ge=1, description="The lowest the cap goes.")
    max: int = Field(default=_ADAPTIVE.max_cap, ge=1, description="The highest the cap goes.")
    initial: int | None = Field(
        default=_ADAPTIVE.initial, ge=1,
        description="Where the cap starts (unset: the backend's `max_concurrency`); it starts there again "
        "after a reload that changes `adaptive`.")
    smoothing: float = Field(
        default=_ADAPTIVE.smoothing, gt=0, le=1,
        description="The share of each new estimate the cap takes: lower moves slower and swings less.")
    tolerance: float = Field(
        default=_ADAPTIVE.tolerance, ge=1,
        description="How far the recent TTFT or ITL may rise over its long-term average before the cap falls.")

    @model_validator(mode="after")
    def _bounds_ok(self) -> AdaptiveConfig:
        if self.min > self.max:
            raise ValueError(f"adaptive min ({self.min}) is above max ({self.max})")
        return self

    def spec(self) -> AdaptiveParams:
        return AdaptiveParams(min_cap=self.min, max_cap=self.max, initial=self.initial, smoothing=self.smoothing,
                              tolerance=self.tolerance)


_BACKEND_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")


class BackendConfig(_Model):
    """One upstream OpenAI-compatible server."""

    name: str = Field(description="Backend name, shown in `X-Tailguard-Backend` and metrics labels.")
    url: str = Field(
        description="Base URL without `/v1`, e.g. `http://127.0.0.1:8000` (a trailing `/v1` is removed)."
    )
    kind: BackendKind = Field(
        default="auto",
        description="Server software. `auto` (the default) asks the server at start and whenever it comes "
        "back (vLLM's `/version`, llama.cpp's `/props`, TGI's `/info`, SGLang's `/get_server_info`, the "
        "simulator's `/health`), else `openai`. The kind decides the protection: on `vllm`, `llamacpp` "
        "and `sim` a running batch request can be suspended for a chat and continued; on the others "
        "`reserved_slots` are kept for the top class. `vllm` and `sglang` also get the class as their "
        "`priority`.",
    )
    reserved_slots: int | None = Field(
        default=_BACKEND.reserved_slots, ge=0,
        description="Slots only the top-ranked class (interactive) may take. Unset: none on a kind that "
        "can continue a generation (preemption protects chats there), else a quarter of "
        "`max_concurrency` (at least one), so a burst of long jobs cannot hold every slot.",
    )
    max_concurrency: int = Field(
        default=_BACKEND.max_concurrency, ge=1,
        description="Requests the gateway keeps in flight on this backend at once: the gateway-side twin of "
        "vLLM's `--max-num-seqs` (or llama.cpp's `-np`). Set it to the engine's batch size; more and the "
        "engine queues FCFS behind the gateway's back.",
    )
    weight: float = Field(
        default=_BACKEND.weight, gt=0,
        description="Relative capacity when routing: load is compared as in-flight / (max_concurrency * weight).",
    )
    adaptive: AdaptiveConfig | None = Field(
        default=None,
        description="Let the in-flight cap move between bounds from this backend's latency (TTFT from the "
        "request's start upstream, and ITL), starting at `max_concurrency`: `true`, or `{min: 2, max: 64}`. "
        "The cap in force is in `/health` and `tailguard_backend_concurrency_limit`.")
    api_key: str | None = Field(default=None, description="Sent upstream as `Authorization: Bearer <key>`.")
    model: str | None = Field(default=None, description="If set, replaces the request's `model` on the way upstream.")
    models: list[str] | None = Field(
        default=None, min_length=1,
        description="The models it serves: requests naming another model never go here. Unset: what its "
        "`/v1/models` lists (read with the health probes); until that is known, or if it lists nothing, any.",
    )
    pool: str = Field(
        default=_BACKEND.pool,
        description="The pool it belongs to. A class's `pools` says which pools its requests may use, tried "
        "in order: long jobs can be kept off the instances that serve chat.",
    )

    def spec(self, continues: bool = False) -> fp.BackendSpec:
        """The front's view; `continues` comes from the kind (named, or detected later)."""
        return fp.BackendSpec(name=self.name, max_concurrency=self.max_concurrency, weight=self.weight,
                              continues=continues, reserved_slots=self.reserved_slots,
                              models=tuple(self.models or ()), pool=self.pool,
                              adaptive=None if self.adaptive is None else self.adaptive.spec())

    @field_validator("adaptive", mode="before")
    @classmethod
    def _adaptive_flag(cls, v: object) -> object:
        """`adaptive: true` is the defaults, `false` none."""
        if v is True:
            return {}
        return None if v is False else v

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _BACKEND_NAME.match(v):
            raise ValueError(f"backend name {v!r} may only hold letters, digits, '_', '.', ':' and '-'")
        return v

    @field_validator("url")
    @classmethod
    def _url_ok(cls, v: str) -> str:
        v = v.strip()
        if not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError(f"url {v!r} must start with http:// or https://")
        v = v.rstrip("/")
        if v.endswith("/v1"):
            v = v[: -len("/v1")]
        if v.count("/") < 2 or not v.split("/", 3)[2]:
            raise ValueError(f"url {v!r} has no host")
        return v
