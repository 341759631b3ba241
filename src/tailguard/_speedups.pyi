from collections.abc import Callable
from typing import Any

ABI: int

def has_content(data: bytes, start: int = 0, end: int | None = None, /) -> bool: ...

class ChunkStep:
    def __init__(self, relay: Any, clock: Callable[[], float], dec: Any, tally: Any, sink: Any,
                 conn: Any, transport: Any) -> None: ...
    def __call__(self, data: bytes) -> bool: ...
