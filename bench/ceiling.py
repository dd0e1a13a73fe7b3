"""The `ceiling` target: the cheapest proxy this stack allows.

One Litestar route handler on uvicorn (uvloop + httptools) relaying the request body to the
upstream and its answer back through one aiohttp session: a `Stream` response for SSE, a
plain `Response` otherwise. No admission, validation, translation, metrics or logs: the
gateway's `/v1` is measured against it (>= 0.8x) and its `/llm` against its `/v1` stream.
Not a product: errors are not shaped and a hang-up just ends the relay.

    python bench/ceiling.py --listen 127.0.0.1:PORT --upstream http://127.0.0.1:STUB
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
import uvicorn
from litestar import Litestar, Request, Response, get, post
from litestar.datastructures import State
from litestar.response import Stream

CHAT = "/v1/chat/completions"


async def relay(upstream: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.content.iter_any():
            yield chunk
    finally:
        upstream.release()


@post(CHAT, status_code=200)
async def chat(request: Request[object, object, State], state: State) -> Response[bytes] | Stream:
    session: aiohttp.ClientSession = state.session
    upstream = await session.post(state.upstream + CHAT, data=await request.body(),
                                  headers={"content-type": "application/json"})
    media_type = upstream.headers.get("content-type", "application/json")
    if media_type.startswith("text/event-stream"):  # Litestar adds the charset to a text/ type
        return Stream(relay(upstream), status_code=upstream.status, media_type="text/event-stream")
    async with upstream:
        return Response(await upstream.read(), status_code=upstream.status, media_type=media_type)


@get("/health", sync_to_thread=False)
def health() -> str:  # readiness probe of bench/targets.wait_ready
    return "ok"


def make_app(upstream: str) -> Litestar:
    async def open_session(app: Litestar) -> None:
        # limit=0: as many keep-alive connections to the stub as there are requests in flight.
        app.state.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        app.state.upstream = upstream

    async def close_session(app: Litestar) -> None:
        await app.state.session.close()

    return Litestar([chat, health], on_startup=[open_session], on_shutdown=[close_session], openapi_config=None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    args = p.parse_args()
    host, port = args.listen.rsplit(":", 1)
    uvicorn.run(make_app(args.upstream), host=host, port=int(port), loop="uvloop", http="httptools",
                access_log=False, log_level="warning", proxy_headers=False, lifespan="on",
                backlog=2048)


if __name__ == "__main__":
    main()
