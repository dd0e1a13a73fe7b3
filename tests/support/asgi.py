"""Drive one request through an ASGI app the way uvicorn does, with a client that may hang up.

Litestar's own test client buffers the whole response and never disconnects early, so
the edge's hang-up paths are driven here: the app gets the body, then `receive()`
blocks until `hang_up` is set and answers `http.disconnect` (as uvicorn does when the
peer closes), or until the response is complete.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec


class Exchange:
    """What the app sent back."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.hang_up = asyncio.Event()
        # After this many body sends, a send never completes (the client stopped reading)
        # and the client hangs up meanwhile.
        self.stall_after: int | None = None

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"]) if self.messages else 0

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"]) if self.messages else {}

    @property
    def chunks(self) -> list[bytes]:
        """The non-empty body sends (Litestar ends a stream with an empty one)."""
        return [m["body"] for m in self.messages[1:] if m.get("body")]

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


async def request(
    app: Any, method: str, path: str, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None,
    exchange: Exchange | None = None,
) -> Exchange:
    """Run one request to completion; set `exchange.hang_up` (e.g. from `send`) to leave."""
    ex = exchange or Exchange()
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        waits = [asyncio.ensure_future(ex.hang_up.wait()), asyncio.ensure_future(done.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if ex.hang_up.is_set():
            return  # uvicorn drops what is sent after the peer left
        ex.messages.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            done.set()
        if ex.stall_after is not None and len(ex.messages) > ex.stall_after:
            ex.hang_up.set()
            await asyncio.Event().wait()
        await asyncio.sleep(0)

    await app(scope(method, path, headers), receive, send)
    return ex


def scope(method: str, path: str, headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    """An HTTP scope as uvicorn makes it."""
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"test"), *(headers or [])],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80), "state": {},
    }
