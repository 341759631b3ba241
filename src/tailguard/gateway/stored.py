"""Which backend holds each stored Response: the Responses API keeps a conversation's state on
the engine that made it (`store`, on by default), and a follow-up naming it
(`previous_response_id`) must go there, as SGLang's model gateway and LiteLLM's router pin it.
A bounded map, oldest forgotten first; a follow-up whose id is unknown (made before a restart,
or by a backend that has left) goes wherever routing sends it, and that backend answers."""

from __future__ import annotations

from collections import OrderedDict


class ResponseHomes:
    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._homes: OrderedDict[str, str] = OrderedDict()

    def remember(self, response_id: str, backend: str) -> None:
        self._homes[response_id] = backend
        self._homes.move_to_end(response_id)
        if len(self._homes) > self._capacity:
            self._homes.popitem(last=False)

    def home(self, response_id: object) -> str | None:
        """The backend that made `response_id` (a body's `previous_response_id`), if known."""
        return self._homes.get(response_id) if isinstance(response_id, str) else None
