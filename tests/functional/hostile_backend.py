"""A hostile backend in a process of its own: `python -m tests.functional.hostile_backend CASE`
listens on a free loopback port, prints it, and answers every POST (CASE `post-*`) or every GET
(CASE `get-*`) as the case says, the other requests with a small 200. Out of the gateway's
process, so a flood costs the gateway's event loop nothing but what the gateway itself does with it.

The `post-*` cases answer in the shape of the route asked (chat, completions, Responses,
Messages): an endless stream of content (a flood, or one event a millisecond), a usage count that lies,
events of half a MiB each, or a 200 that is not what was asked (gzip'd JSON to a stream request).
"""

from __future__ import annotations

import asyncio
import gzip
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import orjson

from tests.functional.raw_servers import SSE_HEAD, TOK_EVENT, chunk, read_request

MODELS_OK = b'{"object":"list","data":[]}'
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Flood = Callable[[asyncio.StreamWriter, str], Awaitable[None]]
_END = b"0\r\n\r\n"


def _event(name: str | None, obj: dict[str, object]) -> bytes:
    head = b"" if name is None else b"event: " + name.encode() + b"\n"
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def content_event(path: str, text: str = " tok") -> bytes:
    """One content event of the route at `path`, as an engine sends it."""
    if path.endswith("/chat/completions"):
        return TOK_EVENT if text == " tok" else _event(None, {
            "id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
    if path.endswith("/completions"):
        return _event(None, {"id": "x", "object": "text_completion", "created": 1, "model": "m",
                             "choices": [{"index": 0, "text": text, "finish_reason": None}]})
    if path.endswith("/responses"):
        return _event("response.output_text.delta", {"type": "response.output_text.delta", "item_id": "m",
                                                      "output_index": 0, "content_index": 0, "delta": text})
    return _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": text}})


def usage_end(path: str, output_tokens: int) -> bytes:
    """The route's last events, saying `output_tokens` were generated."""
    if path.endswith("/completions"):  # chat's and completions' usage chunk, then [DONE]
        return _event(None, {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                             "usage": {"prompt_tokens": 3, "completion_tokens": output_tokens,
                                       "total_tokens": 3 + output_tokens}}) + b"data: [DONE]\n\n"
    if path.endswith("/responses"):
        return _event("response.completed", {"type": "response.completed", "response": {
            "id": "resp_x", "object": "response", "status": "completed", "output": [],
            "usage": {"input_tokens": 3, "output_tokens": output_tokens, "total_tokens": 3 + output_tokens}}})
    return (_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                     "usage": {"output_tokens": output_tokens}})
            + _event("message_stop", {"type": "message_stop"}))


async def _forever(w: asyncio.StreamWriter, piece: bytes) -> None:
    while True:
        w.write(piece)
        await w.drain()


async def endless_content(w: asyncio.StreamWriter, path: str) -> None:
    w.write(SSE_HEAD)
    await _forever(w, chunk(content_event(path) * 400))


async def endless_trickle(w: asyncio.StreamWriter, path: str) -> None:
    """Content events one at a time, a millisecond apart, for ever: read one by one, as an engine's."""
    w.write(SSE_HEAD)
    piece = chunk(content_event(path))
    while True:
        w.write(piece)
        await w.drain()
        await asyncio.sleep(0.001)


async def endless_big_events(w: asyncio.StreamWriter, path: str) -> None:
    """Content events of half a MiB of text each: few events, many bytes."""
    w.write(SSE_HEAD)
    await _forever(w, chunk(content_event(path, "x" * (512 * 1024))))


async def lying_usage(w: asyncio.StreamWriter, path: str) -> None:
    """Three content events, then a usage that says a million tokens were generated."""
    body = content_event(path) * 3 + usage_end(path, 1_000_000)
    w.write(SSE_HEAD + chunk(body) + _END)


async def gzip_json(w: asyncio.StreamWriter, path: str) -> None:
    """A 200 of JSON, gzip'd (a MiB of zeros), whatever was asked."""
    body = gzip.compress(b"\0" * (1 << 20))
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body))


async def endless_json(w: asyncio.StreamWriter, path: str) -> None:
    """A JSON answer that never ends (a whole answer's route)."""
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunk(b'{"object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"'))
    await _forever(w, chunk(b"tok " * 16384))


async def endless_comments(w: asyncio.StreamWriter, path: str) -> None:
    w.write(SSE_HEAD)
    await _forever(w, chunk(b": keep-alive\n\n" * 4000))


async def endless_header(w: asyncio.StreamWriter, path: str) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Endless: ")
    await _forever(w, b"a" * 65536)


async def endless_event(w: asyncio.StreamWriter, path: str) -> None:
    w.write(SSE_HEAD + chunk(b"data: {"))
    await _forever(w, chunk(b"x" * 65536))


async def endless_event_after_content(w: asyncio.StreamWriter, path: str) -> None:
    w.write(SSE_HEAD + chunk(TOK_EVENT) + chunk(b"data: {"))
    await _forever(w, chunk(b"x" * 65536))


async def endless_body(w: asyncio.StreamWriter, path: str) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunk(b'{"object":"list","data":['))
    await _forever(w, chunk(b'{"id":"m","object":"model"},' * 2000))


CASES: dict[str, tuple[str, Flood]] = {
    "post-content": ("POST", endless_content), "post-trickle": ("POST", endless_trickle),
    "post-big-events": ("POST", endless_big_events),
    "post-lying-usage": ("POST", lying_usage), "post-gzip-json": ("POST", gzip_json),
    "post-endless-json": ("POST", endless_json), "post-comments": ("POST", endless_comments),
    "post-header": ("POST", endless_header), "post-event": ("POST", endless_event),
    "post-event-after-content": ("POST", endless_event_after_content), "get-body": ("GET", endless_body),
}


@asynccontextmanager
async def hostile(case: str) -> AsyncIterator[str]:
    """The hostile backend `case` in a process of its own; yields its URL, and kills it at the end."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.functional.hostile_backend", case,
                                                stdout=asyncio.subprocess.PIPE, cwd=ROOT)
    try:
        assert proc.stdout is not None
        port = int(await proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        await proc.wait()


def rss() -> int:
    """This process's resident memory, in bytes (a gateway run in the test's process)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def main(case: str) -> None:
    method, flood = CASES[case]

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await read_request(r)
                if head.startswith(method.encode()):
                    await flood(w, head.split(b" ", 2)[1].decode())
                    await w.drain()
                    continue
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                        % (len(MODELS_OK), MODELS_OK))
                await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
