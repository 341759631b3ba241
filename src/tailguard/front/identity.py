"""Which agent program a request is a call of, and which call: from what it says, else from its
prompt continuing a recent one's; bounded, pure, no I/O.

An agent makes a chain of calls in one conversation, each prompt the last one plus its answer and
a tool's result; its user waits for the program, not for one call. A request names its program,
the first of these that it carries (the client's caller scopes it, so two callers' equal ids are
two programs):

1. `X-Tailguard-Program` or `X-Session-Id` (`wire.headers.session_header`);
2. OpenAI's `prompt_cache_key` (what Codex sets to its conversation);
3. the body's `user` (OpenAI's end-user id), or Anthropic's `metadata.user_id`, of which Claude
   Code's `..._session_<uuid>` (or JSON `{"session_id": ...}`) part is taken when it has one;
4. the session headers coding agents send (`wire.headers.agent_session`: Claude Code's
   `X-Claude-Code-Session-Id`, Codex's `session-id` / `session_id`, OpenCode's `x-opencode-session`;
   the order Dynamo's and CLIProxyAPI's routers read them in);
5. else, with `infer`, a prompt whose text starts with the whole text of a recent request's prompt
   followed by an answer (for a chat, `assistant:` right after it, as `ParsedRequest.prompt_text`
   renders the next turn) is that request's program's next call. The recent prompts are found by
   the chained block hashes the router already uses (`wire.prefix`): each is filed under the hash
   of its last full block, with its length and the hash of its whole text, so a new prompt looks
   up its own chain from its deepest block and checks the hash of its first `length` characters.
   A prompt that continues none starts a program of its own.

A program is known by a digest of its name (`Program.id`), never by the name itself: what the
front, the metrics and the access log carry. Only digests, lengths, counters and instants are
kept: at most `max_programs` programs and as many recent prompts, none longer than `ttl_s`.

    finder = ProgramFinder(ProgramParams())
    p = finder.find(parsed, caller=None, session=session_header(headers), agent=agent_session(headers), now=now)
    p.id, p.call, p.source            # ("9f2c...", 3, "x-session-id")
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tailguard.front.params import ProgramParams
from tailguard.wire.openai import ParsedRequest
from tailguard.wire.prefix import prefix_blocks

# The most recent prompts kept under one block hash (a shared system prompt's last block may end
# many programs' first prompts), and the checks one request may make: a bound on the work.
_PER_BLOCK = 8
_MAX_CHECKS = 8
# How a role-tagged prompt renders the assistant's turn (`ParsedRequest.prompt_text`).
_ANSWER = "assistant:"
_MAX_NAME_CHARS = 1024  # of a name, hashed: an id longer than this is cut (a header may be 8 KB)


@dataclass(frozen=True, slots=True)
class Program:
    """A request's program: `id` (a digest), this call's number in it (from 1), and what named
    it (a header's name, `prompt_cache_key`, `user`, `metadata.user_id`, or `inferred`)."""

    id: str
    call: int
    source: str


def default_digest(name: str) -> str:
    """A program's id: 16 hex digits of BLAKE2b (the gateway keys it with its install's key)."""
    return hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()


def named(body: Mapping[str, Any], session: tuple[str, str] | None,
          agent: tuple[str, str] | None) -> tuple[str, str] | None:
    """What names a request's program, in the order of the module docstring, as (source, name);
    None when nothing does. `session` and `agent` are the headers `wire.headers` read."""
    if session is not None:
        return session
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return "prompt_cache_key", key
    user = body.get("user")
    if isinstance(user, str) and user:
        return "user", user
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        uid = metadata.get("user_id")
        if isinstance(uid, str) and uid:
            return "metadata.user_id", _claude_session(uid)
    return agent


def _claude_session(user_id: str) -> str:
    """The session part of Claude Code's `metadata.user_id`: `user_<h>_account_<a>_session_<s>`,
    or a JSON object with `session_id`; else the whole value."""
    if user_id.startswith("{"):
        try:
            obj = json.loads(user_id)
        except ValueError:
            return user_id
        sid = obj.get("session_id") if isinstance(obj, dict) else None
        return sid if isinstance(sid, str) and sid else user_id
    _, mark, session = user_id.rpartition("_session_")
    return session if mark and session else user_id


@dataclass(slots=True)
class _Seen:
    """A recent prompt: its length, the hash of its whole text, its program, when it came."""

    length: int
    whole: int
    program: str
    at: float


class ProgramFinder:
    """Names each request's program and counts its calls (see the module docstring)."""

    def __init__(self, params: ProgramParams, digest: Callable[[str], str] = default_digest) -> None:
        self.params = params
        self._digest = digest
        self._calls: OrderedDict[str, tuple[int, float]] = OrderedDict()  # program -> (calls, last heard)
        self._prompts: OrderedDict[int, deque[_Seen]] = OrderedDict()  # last full block's hash -> recent prompts
        self._started = 0  # programs inferred to start here, for their ids

    def reconfigure(self, params: ProgramParams) -> None:
        self.params = params

    def find(self, parsed: ParsedRequest, caller: str | None, session: tuple[str, str] | None,
             agent: tuple[str, str] | None, now: float, prefix: Sequence[int] | None = None,
             text: str | None = None) -> Program | None:
        """`parsed`'s program and its call number; None when nothing names it and it is not
        inferred (`infer` off, or a route with no prompt to continue). `prefix` and `text`: its
        prompt's block hashes (`wire.prefix.prefix_blocks`) and text, if already made."""
        name = named(parsed.body, session, agent)
        if name is not None:
            source, value = name
            given = self._digest(f"{caller or ''}\n{value[:_MAX_NAME_CHARS]}")
            return Program(given, self._count(given, now), source)
        if not self.params.infer:
            return None
        if text is None:
            text = parsed.prompt_text()
        if not text:
            return None
        blocks = prefix_blocks(text) if prefix is None else prefix
        program = self._continued(text, blocks, parsed.endpoint != "completions", now)
        if program is None:  # it starts a program of its own
            self._started += 1
            program = self._digest(f"{caller or ''}\ninferred:{self._started}:{hash(text)}")
        self._file(text, blocks, program, now)
        return Program(program, self._count(program, now), "inferred")

    def _continued(self, text: str, blocks: Sequence[int], tagged: bool, now: float) -> str | None:
        """The program of the longest recent prompt `text` continues (with an answer after it,
        where the prompt is role-tagged), or None."""
        stale_before = now - self.params.ttl_s
        checks = 0
        for key in (*reversed(blocks), 0):
            for seen in self._prompts.get(key, ()):
                if seen.at < stale_before or seen.length >= len(text):
                    continue
                if tagged and not text.startswith(_ANSWER, seen.length):
                    continue
                checks += 1
                if hash(text[:seen.length]) == seen.whole:
                    return seen.program
                if checks >= _MAX_CHECKS:
                    return None
        return None

    def _file(self, text: str, blocks: Sequence[int], program: str, now: float) -> None:
        """Keep `text` as a recent prompt of `program`, under its last full block's hash."""
        key = blocks[-1] if blocks else 0  # a prompt shorter than a block: under the empty prefix
        prompts = self._prompts
        recent = prompts.get(key)
        if recent is None:
            recent = prompts[key] = deque(maxlen=_PER_BLOCK)
        else:
            prompts.move_to_end(key)
        recent.appendleft(_Seen(len(text), hash(text), program, now))
        self._trim(prompts, now, lambda d: d[0].at)

    def _count(self, program: str, now: float) -> int:
        """This call's number in `program` (1 for a program not heard from within `ttl_s`)."""
        calls = self._calls
        prev = calls.pop(program, None)
        n = 1 if prev is None or now - prev[1] > self.params.ttl_s else prev[0] + 1
        calls[program] = (n, now)
        self._trim(calls, now, lambda v: v[1])
        return n

    def _trim(self, table: OrderedDict[Any, Any], now: float, heard: Callable[[Any], float]) -> None:
        """Drop the least recently heard entries past `max_programs` or older than `ttl_s`."""
        limit, stale_before = max(1, self.params.max_programs), now - self.params.ttl_s
        while len(table) > limit or heard(next(iter(table.values()))) < stale_before:
            table.popitem(last=False)
