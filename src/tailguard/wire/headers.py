"""What the gateway reads from a request's HTTP headers: the caller's key, the class it names and
the agent program it says it belongs to; pure. Both servers (aiohttp's and the lean one) and the DES's gate, which replays the headers a
bench would send, read them here, so the intake in the front sees values, never headers."""

from __future__ import annotations

from collections.abc import Mapping

CLASS_HEADER = "X-Tailguard-Class"
PROGRAM_HEADER = "X-Tailguard-Program"
# A program (a session's calls) named by its client, ours first (`front.identity`).
SESSION_HEADERS = (PROGRAM_HEADER, "X-Session-Id")
# What coding agents send of their session on every call: Claude Code (since 2.1.86), Codex (its
# current hyphen form, then the older underscore one), OpenCode; the order Dynamo's router
# (ai-dynamo/dynamo#10875) and CLIProxyAPI (router-for-me/CLIProxyAPI#4452) read them in.
AGENT_SESSION_HEADERS = ("X-Claude-Code-Session-Id", "Session-Id", "Session_Id", "X-Opencode-Session")


def header(headers: Mapping[str, str], name: str) -> str | None:
    """`name`'s value; a plain dict (unlike aiohttp's headers) is searched in lower case too."""
    value = headers.get(name)
    return headers.get(name.lower()) if value is None else value


def bearer_key(headers: Mapping[str, str]) -> str | None:
    """The key of `Authorization: Bearer <key>`, or None."""
    auth = header(headers, "Authorization")
    if auth is None:
        return None
    scheme, _, token = auth.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def class_header(headers: Mapping[str, str]) -> str | None:
    """The class a request names in `X-Tailguard-Class`, as sent."""
    return header(headers, CLASS_HEADER)


def session_header(headers: Mapping[str, str]) -> tuple[str, str] | None:
    """The program a request names in `X-Tailguard-Program` or `X-Session-Id`, as (the header's
    name in lower case, its value); None without one."""
    return _first(headers, SESSION_HEADERS)


def agent_session(headers: Mapping[str, str]) -> tuple[str, str] | None:
    """The session a coding agent's own header names (`AGENT_SESSION_HEADERS`), as (the header's
    name in lower case, its value); None without one."""
    return _first(headers, AGENT_SESSION_HEADERS)


def _first(headers: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = header(headers, name)
        if value:
            value = value.strip()
            if value:
                return name.lower(), value
    return None
