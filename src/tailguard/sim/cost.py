"""The simulated engine's step-time model and its limits (`EngineConfig`, `PRESETS`); pure, no I/O.

One engine step (one forward pass of a continuous batch) costs

    step_s = a + b * prefill_tokens + c * decode_seqs + d * kv_tokens_read

- `a` is the fixed cost of a forward pass (weights streamed from HBM once per step, kernel
  launches, scheduler and sampler overhead);
- `b` is the cost per prompt token computed in the step (prefill is compute-bound, linear in tokens);
- `c` is the cost per sequence decoding one token (sampling, per-sequence bookkeeping);
- `d` is the cost per KV-cache token the attention kernels read: each decoding sequence reads its
  whole context, and a prefill chunk reads the part of its prompt already cached. This is the term
  that makes decode steps slower as the batch and the contexts grow.

Sources: the linear form is BLIS's (the Blackbox Inference Simulator, github.com/inference-sim/
inference-sim), which fits beta0 + beta1 * (uncached prefill tokens) + beta2 * (decode tokens) to
measured vLLM step times; the KV-read term adds what its roofline mode and Vidur (Agrawal et al.,
MLSys 2024, operator-level profiles of vLLM-style engines) show: decode attention time grows with the
context read. The H100/A100 Llama-3-8B coefficients are the project's defaults from such fits; Vidur's
profiles agree with them within tens of percent. They model bf16 weights under vLLM's default limits:
a model of the engine's shape, not a measurement of any one machine.

Token counts come from `tailguard.wire.tokens`: one token per 4 bytes of UTF-8 text (rounded up) plus
a fixed 4 tokens per chat message, or the exact count when a request carries token ids. A real
tokenizer differs by model; the simulator needs a count that is deterministic and the same
everywhere in tailguard, not one that matches a particular vocabulary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from tailguard.errors import ConfigError
from tailguard.sim.gpu import A100_80GB, H100_80GB, GpuSpec

SchedulingPolicy = Literal["fcfs", "priority"]
OutputLength = Literal["exact", "uniform", "exponential"]

SCHEDULING_POLICIES: tuple[str, ...] = ("fcfs", "priority")
OUTPUT_LENGTHS: tuple[str, ...] = ("exact", "uniform", "exponential")


@dataclass(slots=True, frozen=True)
class CostModel:
    """Seconds per engine step as a linear function of the step's work (see the module docstring)."""

    a_s: float
    b_s_per_prefill_token: float
    c_s_per_decode_seq: float
    d_s_per_kv_token: float

    def step_time(self, prefill_tokens: float, decode_seqs: float, kv_tokens_read: float) -> float:
        """One step's seconds (counts may be time averages, as `sim.fit` gives them)."""
        return (
            self.a_s
            + self.b_s_per_prefill_token * prefill_tokens
            + self.c_s_per_decode_seq * decode_seqs
            + self.d_s_per_kv_token * kv_tokens_read
        )


@dataclass(slots=True, frozen=True)
class EngineConfig:
    """Limits of the simulated engine, named after vLLM's own flags where one exists.

        EngineConfig.from_preset("h100-llama8b", max_num_seqs=8, scheduling_policy="priority")

    `output_length` picks how many tokens a request generates: "exact" is vLLM with
    `ignore_eos` (always `max_tokens`, finish_reason "length"); "uniform" draws 1..max_tokens;
    "exponential" draws with mean `output_mean_ratio * max_tokens`, capped at `max_tokens`.
    A request stopped before `max_tokens` finishes with reason "stop". Draws use `seed`.
    """

    cost: CostModel
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    kv_cache_tokens: int = 440_000
    block_size: int = 16
    enable_prefix_caching: bool = False
    scheduling_policy: SchedulingPolicy = "fcfs"
    output_length: OutputLength = "exact"
    output_mean_ratio: float = 0.5
    seed: int = 0
    gpu: GpuSpec | None = None  # the card it models, for its DCGM gauges (`sim.gpu`); None: no GPU (cpu-tiny)

    def __post_init__(self) -> None:
        problems = self._problems()
        if problems:
            raise ConfigError("invalid engine config: " + "; ".join(problems))

    def _problems(self) -> list[str]:
        p: list[str] = []
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_cache_tokens", "block_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                p.append(f"{name} must be a positive integer, got {v!r}")
        if p:
            return p
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM refuses this too: every running sequence must fit one decode token per step.
            p.append(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs ({self.max_num_seqs})"
            )
        if self.num_kv_blocks * self.block_size < self.max_model_len:
            # vLLM refuses to start when one full-length sequence cannot fit in the KV cache.
            p.append(
                f"kv_cache_tokens ({self.kv_cache_tokens}) must hold at least one max_model_len "
                f"({self.max_model_len}) sequence"
            )
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            p.append(f"scheduling_policy must be one of {list(SCHEDULING_POLICIES)}, got {self.scheduling_policy!r}")
        if self.output_length not in OUTPUT_LENGTHS:
            p.append(f"output_length must be one of {list(OUTPUT_LENGTHS)}, got {self.output_length!r}")
        if not 0.0 < self.output_mean_ratio <= 1.0:
            p.append(f"output_mean_ratio must be in (0, 1], got {self.output_mean_ratio!r}")
        c = self.cost
        if min(c.a_s, c.b_s_per_prefill_token, c.c_s_per_decode_seq, c.d_s_per_kv_token) < 0 or c.a_s <= 0:
            p.append("cost coefficients must be >= 0, with a_s > 0 so every step takes time")
        return p

    def slowed(self, factor: float) -> EngineConfig:
        """The same engine with every step `factor` times as long: a slower card, or one that
        shares its GPU (a fleet's slow host). Its metrics still say what it does, in simulated
        seconds; `time_scale` is what stretches the wall clock."""
        if not factor > 0:
            raise ConfigError(f"a slowdown must be > 0, got {factor!r}")
        c = self.cost
        return dataclasses.replace(self, cost=CostModel(
            c.a_s * factor, c.b_s_per_prefill_token * factor, c.c_s_per_decode_seq * factor,
            c.d_s_per_kv_token * factor))

    @property
    def num_kv_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> EngineConfig:
        """A preset with some fields replaced; `None` values are ignored (unset CLI flags)."""
        try:
            base = PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown engine preset {name!r}; known presets: {', '.join(sorted(PRESETS))}") from None
        changes = {k: v for k, v in overrides.items() if v is not None}
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"unknown engine config field(s) {unknown}")
        return dataclasses.replace(base, **changes)


H100_LLAMA8B = CostModel(a_s=6e-3, b_s_per_prefill_token=17e-6, c_s_per_decode_seq=5e-6, d_s_per_kv_token=0.075e-6)
A100_LLAMA8B = CostModel(a_s=16e-3, b_s_per_prefill_token=48e-6, c_s_per_decode_seq=18e-6, d_s_per_kv_token=0.125e-6)
# A ~30M-parameter model on a few CPU cores (the order of what llama.cpp serves on these CI machines:
# a few hundred tokens/s for one stream, prefill ~20k tokens/s). Illustrative, for demos and tests.
CPU_TINY = CostModel(a_s=3e-3, b_s_per_prefill_token=50e-6, c_s_per_decode_seq=0.5e-3, d_s_per_kv_token=0.02e-6)

# KV capacity: Llama-3-8B keeps 128 KiB of KV per token (32 layers x 8 KV heads x 128 dims x K,V x
# 2 bytes); an 80 GB card at vLLM's gpu_memory_utilization 0.9 leaves about 55 GB after weights and
# activations, i.e. about 27,500 blocks of 16 tokens, which is what vLLM logs for this model.
PRESETS: dict[str, EngineConfig] = {
    "h100-llama8b": EngineConfig(
        cost=H100_LLAMA8B, max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192, kv_cache_tokens=440_000,
        gpu=H100_80GB,
    ),
    "a100-llama8b": EngineConfig(
        cost=A100_LLAMA8B, max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192, kv_cache_tokens=440_000,
        gpu=A100_80GB,
    ),
    "cpu-tiny": EngineConfig(
        cost=CPU_TINY, max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=4096, kv_cache_tokens=32_768
    ),
}
