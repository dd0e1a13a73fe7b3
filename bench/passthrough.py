"""Reference: the cheapest Python proxy of the same stack, a framework-free ASGI pass-through.

uvicorn (uvloop + httptools) in front, one keep-alive aiohttp session behind; it forwards the
body of any POST to the upstream and relays status, content type and body bytes as they come.
No routing, admission, validation, metrics or logs: it is the floor the gateway's hot path is
measured against (issue 8 quotes it at about 0.33x nginx non-streaming), not a product.

    python bench/passthrough.py --listen 127.0.0.1:PORT --upstream http://127.0.0.1:STUB
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import uvicorn


def make_app(upstream: str) -> Any:
    session: aiohttp.ClientSession | None = None

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal session
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
                    await send({"type": "lifespan.startup.complete"})
            if session is not None:
                await session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["method"] == "GET":  # readiness probe
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        assert session is not None
        async with session.post(upstream + scope["path"], data=body,
                                headers={"content-type": "application/json"}) as resp:
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", resp.headers.get("content-type", "").encode())]})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    args = p.parse_args()
    host, port = args.listen.rsplit(":", 1)
    uvicorn.run(make_app(args.upstream), host=host, port=int(port), loop="uvloop", http="httptools",
                access_log=False, log_level="warning", proxy_headers=False, lifespan="on")


if __name__ == "__main__":
    main()
