"""A request's agent program, from each source in order, and inferred from a prompt that continues
a recent one's with its answer; call numbers; bounded memory. Plain values, no clock."""

from __future__ import annotations

from typing import Any

from tailguard.front.identity import ProgramFinder, named
from tailguard.front.params import ProgramParams
from tailguard.wire.headers import agent_session, session_header
from tailguard.wire.openai import Endpoint, ParsedRequest, validate_body

SYSTEM = "You are a coding agent. " * 40  # about 960 characters: several blocks, shared by every program


def chat(*turns: tuple[str, str], **fields: Any) -> ParsedRequest:
    messages = [{"role": "system", "content": SYSTEM}] + [{"role": r, "content": c} for r, c in turns]
    return validate_body({"model": "m", "messages": messages, **fields}, "chat")


def find(f: ProgramFinder, parsed: ParsedRequest, now: float = 0.0, headers: dict[str, str] | None = None,
         caller: str | None = None) -> tuple[str, int, str] | None:
    h = headers or {}
    p = f.find(parsed, caller, session_header(h), agent_session(h), now)
    return None if p is None else (p.id, p.call, p.source)


def test_each_source_in_order() -> None:
    body = {"prompt_cache_key": "pck", "user": "u", "metadata": {"user_id": "x"}}
    assert named(body, ("x-tailguard-program", "tg"), ("session-id", "codex")) == ("x-tailguard-program", "tg")
    assert named(body, None, ("session-id", "codex")) == ("prompt_cache_key", "pck")
    assert named({"user": "u", "metadata": {"user_id": "x"}}, None, None) == ("user", "u")
    assert named({"metadata": {"user_id": "x"}}, None, ("session-id", "codex")) == ("metadata.user_id", "x")
    assert named({}, None, ("session-id", "codex")) == ("session-id", "codex")
    assert named({"user": "", "prompt_cache_key": 3}, None, None) is None  # empty or not a string: nothing


def test_claude_codes_user_id_gives_its_session() -> None:
    legacy = "user_ab12_account_5f0e-77_session_9c1d-aa"
    assert named({"metadata": {"user_id": legacy}}, None, None) == ("metadata.user_id", "9c1d-aa")
    as_json = '{"device_id": "d", "account_uuid": "a", "session_id": "s-42"}'
    assert named({"metadata": {"user_id": as_json}}, None, None) == ("metadata.user_id", "s-42")
    assert named({"metadata": {"user_id": "{broken"}}, None, None) == ("metadata.user_id", "{broken")


def test_headers_read_ours_then_the_agents() -> None:
    assert session_header({"x-session-id": " s1 "}) == ("x-session-id", "s1")
    assert session_header({"X-Tailguard-Program": "p", "X-Session-Id": "s"}) == ("x-tailguard-program", "p")
    assert agent_session({"x-claude-code-session-id": "c", "session-id": "x"}) == ("x-claude-code-session-id", "c")
    assert agent_session({"session_id": "codex-old"}) == ("session_id", "codex-old")
    assert agent_session({"x-opencode-session": "o"}) == ("x-opencode-session", "o")
    assert session_header({"x-session-id": "  "}) is None and agent_session({}) is None


def test_a_named_program_counts_its_calls_and_is_scoped_to_its_caller() -> None:
    f = ProgramFinder(ProgramParams())
    first = find(f, chat(("user", "a")), 0.0, {"x-session-id": "s1"})
    second = find(f, chat(("user", "b")), 1.0, {"x-session-id": "s1"})
    assert first is not None and second is not None
    assert first[1:] == (1, "x-session-id") and second[0] == first[0] and second[1] == 2
    other_caller = find(f, chat(("user", "a")), 2.0, {"x-session-id": "s1"}, caller="team-b")
    assert other_caller is not None and other_caller[0] != first[0] and other_caller[1] == 1
    assert "s1" not in first[0]  # known by a digest only


def test_a_prompt_that_continues_a_recent_prompt_and_its_answer_is_the_same_programs_next_call() -> None:
    f = ProgramFinder(ProgramParams())
    task = ("user", "Fix the failing test in parser.py " * 5)
    a1 = find(f, chat(task), 0.0)
    b1 = find(f, chat(("user", "Write a haiku about queues " * 5)), 0.5)  # same system prompt, another task
    a2 = find(f, chat(task, ("assistant", "Let me read it."), ("tool", "def parse(): ..." * 30)), 2.0)
    a3 = find(f, chat(task, ("assistant", "Let me read it."), ("tool", "def parse(): ..." * 30),
                      ("assistant", "Found it."), ("tool", "ok")), 4.0)
    assert a1 is not None and b1 is not None and a2 is not None and a3 is not None
    assert a1[0] != b1[0]
    assert (a2[0], a2[1], a2[2]) == (a1[0], 2, "inferred") and (a3[0], a3[1]) == (a1[0], 3)


def test_no_answer_after_the_prompt_no_continuation() -> None:
    f = ProgramFinder(ProgramParams())
    a1 = find(f, chat(("user", "question")))
    # The same prompt with a second user message but no answer between: not this program's next call.
    again = find(f, chat(("user", "question"), ("user", "and another")), 1.0)
    same = find(f, chat(("user", "question")), 2.0)  # the same prompt again: a new program too
    assert a1 is not None and again is not None and same is not None
    assert len({a1[0], again[0], same[0]}) == 3


def test_a_completion_continues_by_text_alone() -> None:
    f = ProgramFinder(ProgramParams())

    def prompt(text: str, endpoint: Endpoint = "completions") -> ParsedRequest:
        return validate_body({"model": "m", "prompt": text}, endpoint)

    first = find(f, prompt("Once upon a time " * 30))
    nxt = find(f, prompt("Once upon a time " * 30 + "there was a queue."), 1.0)
    assert first is not None and nxt is not None and nxt[:2] == (first[0], 2)


def test_inference_forgets_after_the_ttl_and_can_be_off() -> None:
    f = ProgramFinder(ProgramParams(ttl_s=10.0))
    a1 = find(f, chat(("user", "task")), 0.0)
    late = find(f, chat(("user", "task"), ("assistant", "ok"), ("user", "more")), 11.0)
    assert a1 is not None and late is not None and late[0] != a1[0] and late[1] == 1
    off = ProgramFinder(ProgramParams(infer=False))
    assert find(off, chat(("user", "task"))) is None
    assert find(off, chat(("user", "task")), headers={"x-session-id": "s"}) is not None


def test_memory_is_bounded() -> None:
    f = ProgramFinder(ProgramParams(max_programs=50))
    for i in range(500):
        find(f, chat(("user", f"task {i} " * 40)), i * 0.01, {"x-session-id": f"s{i}"} if i % 2 else None)
    assert len(f._calls) <= 50 and len(f._prompts) <= 50
