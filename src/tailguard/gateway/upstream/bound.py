"""What one answer may carry, from what its request asked: how many content events and tokens, and
how many bytes of stream; pure, no I/O.

A backend is trusted to stop at the request's `max_tokens`; one that does not (a bug, a hostile
server, an engine that ignores the field) would otherwise stream until the total deadline and
charge its caller for all of it (an endless stream relayed 166 MB in 30 s for `max_tokens: 5`,
and metered 1,092,462 tokens). So each answer is held to two bounds, as Envoy holds a body to
`max_request_bytes` and nginx to `proxy_max_temp_file_size`, but derived per request:

- **tokens**: `n x (max_tokens + limits.max_tokens_margin)` content events (an event carries at
  least one token; engines that count a stop token, a tool call's last delta or a reasoning
  boundary differently get the margin), and the engine's own usage count checked against the
  same. Past it the answer is cut (`Tally.content`) and its caller is charged `n x max_tokens`
  at most: what its limits reserved.
- **bytes**: `limits.max_preamble_bytes + 2 x the request's bytes + limits.answer_bytes_per_token
  x the tokens above` (the request's bytes twice: `echo`, and a Responses stream's last event
  repeating its instructions), counted by the readers as they read (`Tally.read`), so an answer
  of huge events that each count once is bounded too. A content event of at most
  `answer_bytes_per_token` bytes that the relay's step passes on alone (the usual chunk, and the
  C step's only one) is held by the event bound instead, so the hot path counts no bytes: what a
  stream may carry is then at most that bound plus `answer_bytes_per_token` an event. A
  non-stream answer is also held whole: `limits.max_answer_bytes` caps it, and every byte counts.

A request without `max_tokens` (its class sets none and it asks none) has no token bound: the
engine's own context limit applies, and for a stream the total deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailguard.config import LimitsConfig

UNBOUNDED = 1 << 62


@dataclass(slots=True)
class AnswerBound:
    """The bounds of one answer (see the module docstring); made once per request, and treated
    as a value (not frozen: a frozen dataclass's `__init__` costs a request several microseconds).

        bound = AnswerBound.of(max_tokens=5, n=1, request_bytes=len(raw), limits=cfg.limits)
        bound.events       # content events before the answer is cut (UNBOUNDED without max_tokens)
        bound.charged      # the most its caller is charged for
        bound.byte_limit(stream=True)
    """

    max_tokens: int | None = None
    n: int = 1
    margin: int = 0
    events: int = UNBOUNDED
    charged: int = UNBOUNDED
    stream_bytes: int = UNBOUNDED
    answer_bytes: int = UNBOUNDED  # a non-stream answer, held whole
    event_bytes: int = UNBOUNDED  # a lone content event of at most this many is held by `events` alone

    @classmethod
    def of(cls, max_tokens: int | None, n: int, request_bytes: int, limits: LimitsConfig) -> AnswerBound:
        if max_tokens is None:
            return cls(answer_bytes=limits.max_answer_bytes)
        per_token = limits.answer_bytes_per_token
        events = n * (max_tokens + limits.max_tokens_margin)
        stream = limits.max_preamble_bytes + 2 * request_bytes + events * per_token
        return cls(max_tokens, n, limits.max_tokens_margin, events, n * max_tokens, stream,
                   min(stream, limits.max_answer_bytes), per_token)

    def byte_limit(self, stream: bool) -> int:
        return self.stream_bytes if stream else self.answer_bytes

    def why_bytes(self, stream: bool) -> str:
        """What a body past `byte_limit(stream)` is told: the bound and the settings it comes from."""
        limit = self.byte_limit(stream)
        if self.max_tokens is None or limit < self.stream_bytes:
            return f"over {limit} bytes for one non-stream answer (limits.max_answer_bytes)"
        return (f"over {limit} bytes for an answer of max_tokens {self.max_tokens}{self._times_n()} "
                "(limits.max_preamble_bytes + limits.answer_bytes_per_token a token)")

    def why_tokens(self, seen: int, what: str) -> str:
        """What an answer past its token bound is told (`what`: content events, or the engine's count)."""
        return (f"{seen} {what}, past max_tokens {self.max_tokens}{self._times_n()} "
                f"(with limits.max_tokens_margin {self.margin})")

    def _times_n(self) -> str:
        return f" x n {self.n}" if self.n != 1 else ""
