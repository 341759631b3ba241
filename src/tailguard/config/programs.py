"""The `programs` section of the gateway's config: agent programs, a session's calls known as one
(how they are named, the order by what each has received, where each is kept, how much is
remembered); it becomes the front's `ProgramParams` (docs/agents.md)."""

from __future__ import annotations

from pydantic import Field

from tailguard.front import params as fp
from tailguard.config.base import _Model

_PROGRAMS = fp.ProgramParams()


class ProgramsConfig(_Model):
    """Agent programs (docs/agents.md)."""

    plas: bool = Field(
        default=_PROGRAMS.plas,
        description="Order a rank's calls (a caller's, with `scheduler.fair_share`) by their program's attained "
        "service: programs below `quantum_tokens` first (new programs, and every request that names none), "
        "then the programs under way, the oldest first; shortest job first within level 0. Off: as without programs.",
    )
    quantum_tokens: int = Field(
        default=_PROGRAMS.quantum_tokens, ge=1,
        description="Tokens (prompt and generated, over its calls) a program receives before it leaves level 0; "
        "each level above covers twice the last.",
    )
    levels: int = Field(
        default=_PROGRAMS.levels, ge=1, le=32,
        description="Levels of attained service. 2: new programs, then the rest by age. More: least attained "
        "service across levels (Autellix's PLAS), the oldest program first within each.",
    )
    half_life_s: float = Field(
        default=_PROGRAMS.half_life_s, ge=0,
        description="A program's attained service halves over this long, so one back after a long idle gap starts "
        "nearly afresh (0: it never decays).",
    )
    affinity: bool = Field(
        default=_PROGRAMS.affinity,
        description="A program's call goes to the backend its last call went to (its KV is in that cache) while "
        "that backend is within the routing balance bound (`routing.balance_factor`, `balance_slack`); siblings "
        "that arrive together land together. Not with `routing.policy: round-robin`.",
    )
    affinity_ttl_s: float = Field(
        default=_PROGRAMS.affinity_ttl_s, gt=0,
        description="How long after its last call ended a program is still kept where that call ran.",
    )
    infer: bool = Field(
        default=_PROGRAMS.infer,
        description="A request that names no program (no session header, `prompt_cache_key`, `user` or "
        "`metadata.user_id`, no agent session header) whose prompt continues a recent request's prompt and "
        "answer is that request's program's next call; off: such a request has no program.",
    )
    max_programs: int = Field(
        default=_PROGRAMS.max_programs, ge=1,
        description="Programs (and recent prompts, for inference) remembered at most, the least recently heard "
        "from dropped first: ids, counters and instants only, a few hundred bytes each.",
    )
    ttl_s: float = Field(
        default=_PROGRAMS.ttl_s, gt=0,
        description="A program not heard from for this long is forgotten (its next call starts it afresh).",
    )

    def params(self) -> fp.ProgramParams:
        return fp.ProgramParams(plas=self.plas, quantum_tokens=self.quantum_tokens, levels=self.levels,
                                half_life_s=self.half_life_s, affinity=self.affinity,
                                affinity_ttl_s=self.affinity_ttl_s, infer=self.infer,
                                max_programs=self.max_programs, ttl_s=self.ttl_s)
