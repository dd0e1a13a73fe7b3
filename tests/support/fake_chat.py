"""A one-word chat answer for loopback fake replicas (aiohttp handlers), as vLLM writes it:
a stream when the request asks for one (with token ids when asked: a request the gateway may
resume is sent as a stream with `return_token_ids`), else a plain answer."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

_USAGE = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}


async def chat_answer(request: web.Request, text: str = "hi") -> web.Response:
    body: dict[str, Any] = await request.json()
    if not body.get("stream"):
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body.get("model", ""),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": _USAGE})  # fmt: skip
    ids = bool(body.get("return_token_ids"))
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": body.get("model", "")}
    first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    if ids:
        first["prompt_token_ids"] = [1]
    token = {**head, "choices": [{"index": 0, "delta": {"content": text}, "token_ids": [7] if ids else None,
                                  "finish_reason": "stop"}]}  # fmt: skip
    tail = {**head, "choices": [], "usage": _USAGE}
    frames = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in (first, token, tail)) + "data: [DONE]\n\n"
    return web.Response(body=frames.encode(), content_type="text/event-stream")
