"""The stub as a real process: vLLM's token ids, answers continued from a token-id prompt, and
`--fault die-mid-stream` (a replica killed mid-answer), read the way a gateway reads them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from stub.launcher import running_stub

MESSAGES = [{"role": "user", "content": "tell me a story"}]
THINK_END = 299999


@pytest.fixture(scope="module")
def reasoning_url() -> Iterator[str]:
    with running_stub("--reasoning", "--tokens", "6") as base:
        yield base


async def stream(base: str, path: str, body: dict[str, Any]) -> tuple[list[Any], Exception | None]:
    """The `data:` payloads of a stream, `[DONE]` as the string, and the error that ended it
    early (None when the body ended cleanly)."""
    out: list[Any] = []
    async with aiohttp.ClientSession() as session, session.post(base + path, json={**body, "stream": True}) as resp:
        assert resp.status == 200
        try:
            async for line in resp.content:
                if line.startswith(b"data: "):
                    text = line[6:].strip().decode()
                    out.append(text if text == "[DONE]" else json.loads(text))
        except aiohttp.ClientPayloadError as exc:
            return out, exc
    return out, None


async def post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.post(base + path, json=body) as resp:
        assert resp.status == 200
        answer: dict[str, Any] = await resp.json()
        return answer


def raw_text(delta: dict[str, Any]) -> str:
    """What a raw completion writes for a chat delta's token (the end of thinking: `</think>`)."""
    return str(delta.get("reasoning") or delta.get("content") or "</think>")


async def chat_tokens(base: str) -> tuple[list[int], list[int], list[str]]:
    """A streamed chat answer with return_token_ids: prompt ids, generated ids, their raw texts."""
    chunks, error = await stream(base, "/v1/chat/completions",
                                 {"model": "m", "messages": MESSAGES, "return_token_ids": True})  # fmt: skip
    assert error is None and chunks[-1] == "[DONE]"
    prompt = chunks[0]["prompt_token_ids"]
    ids, texts = [], []
    for chunk in chunks[1:-1]:
        choice = chunk["choices"][0]
        assert len(choice["token_ids"]) == (0 if choice["finish_reason"] else 1)  # one id per piece
        for token in choice["token_ids"]:
            ids.append(token)
            texts.append(raw_text(choice["delta"]))
    return prompt, ids, texts


async def test_a_chat_stream_reports_its_tokens_and_a_token_prompt_continues_it(reasoning_url: str) -> None:
    prompt, ids, texts = await chat_tokens(reasoning_url)
    assert len(prompt) == 4 and all(i < 100000 for i in prompt)  # the prompt's four words
    assert THINK_END in ids and len(ids) == 5 + 1 + 6
    for k in range(1, len(ids) + 1):  # broken after k tokens: the rest, exactly, as raw text
        chunks, error = await stream(reasoning_url, "/v1/completions", {
            "model": "m", "prompt": prompt + ids[:k], "max_tokens": 100, "return_token_ids": True,
            "stream_options": {"include_usage": True}})  # fmt: skip
        assert error is None and chunks[-1] == "[DONE]"
        choices = [c["choices"][0] for c in chunks[:-2]]
        assert choices[0]["prompt_token_ids"] == prompt + ids[:k]
        assert [i for c in choices for i in c["token_ids"]] == ids[k:]
        assert [c["text"] for c in choices if c["token_ids"]] == texts[k:]
        assert choices[-1]["finish_reason"] == "stop"
        assert chunks[-2]["usage"] == {"prompt_tokens": len(prompt) + k, "completion_tokens": len(ids) - k,
                                       "total_tokens": len(prompt) + len(ids)}  # fmt: skip


async def test_max_tokens_counts_the_continuation_and_a_body_carries_the_ids(reasoning_url: str) -> None:
    prompt, ids, texts = await chat_tokens(reasoning_url)
    cut = {"model": "m", "prompt": prompt + ids[:3], "max_tokens": 4, "return_token_ids": True}
    body = await post(reasoning_url, "/v1/completions", cut)
    choice = body["choices"][0]
    assert (choice["token_ids"], choice["text"], choice["finish_reason"]) == (ids[3:7], "".join(texts[3:7]), "length")
    assert choice["prompt_token_ids"] == prompt + ids[:3] and body["usage"]["prompt_tokens"] == len(prompt) + 3
    fresh = await post(reasoning_url, "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 2})
    assert fresh["choices"][0]["text"] == "alpha bravo"  # no generated tail: the usual completion
    assert fresh["choices"][0]["token_ids"] is None and fresh["usage"]["prompt_tokens"] == len(prompt)


async def test_a_chat_body_carries_the_same_ids(reasoning_url: str) -> None:
    prompt, ids, _ = await chat_tokens(reasoning_url)
    body = await post(reasoning_url, "/v1/chat/completions",
                      {"model": "m", "messages": MESSAGES, "return_token_ids": True})  # fmt: skip
    assert (body["prompt_token_ids"], body["choices"][0]["token_ids"]) == (prompt, ids)
    assert body["usage"]["completion_tokens"] == len(ids)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("delay", ["0", "0.02"])
async def test_die_mid_stream_sends_n_token_chunks_then_resets(path: str, delay: str) -> None:
    body = {"model": "m", "messages": MESSAGES, "prompt": "tell me", "return_token_ids": True}
    with running_stub("--fault", "die-mid-stream", "--fault-after-tokens", "3", "--chunk-delay", delay) as base:
        chunks, error = await stream(base, path, body)
        assert isinstance(error, aiohttp.ClientPayloadError)  # no finish chunk, no [DONE], no chunked end
        tokens = [c for c in chunks if c["choices"][0].get("token_ids")]
        assert len(tokens) == 3 and "[DONE]" not in chunks
        assert [c["choices"][0]["token_ids"] for c in tokens] == [[100000], [100001], [100002]]
        assert not any(c["choices"][0]["finish_reason"] for c in chunks)
        if path == "/v1/chat/completions":
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and len(chunks) == 4
        streamed = {**body, "stream": True}
        with pytest.raises(httpx.TransportError):  # httpx: a reset (ReadError) mid-body
            async with httpx.AsyncClient() as client, client.stream("POST", base + path, json=streamed) as resp:
                async for _ in resp.aiter_bytes():
                    pass
        with pytest.raises(aiohttp.ClientError):  # not streamed: reset before any answer
            await post(base, path, body)


async def test_reasoning_tokens_count_before_the_reset(tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    with running_stub("--reasoning", "--fault", "die-mid-stream", "--fault-after-tokens", "2", "--log",
                      str(log)) as base:  # fmt: skip
        chunks, error = await stream(base, "/v1/chat/completions", {"model": "m", "messages": MESSAGES})
        assert error is not None and [c["choices"][0]["delta"] for c in chunks[1:]] == [{"reasoning": "Let"},
                                                                                         {"reasoning": " me"}]
    assert log.read_text().rstrip().endswith("fault=die-mid-stream")


async def test_fault_limit_and_fault_after_decide_which_requests_die(tmp_path: Path) -> None:
    body = {"model": "m", "messages": MESSAGES, "prompt": [5, 6, 100000, 100001], "return_token_ids": True}
    log = tmp_path / "limit.log"
    # the first request dies (a completion counts as one), then everything is fine
    with running_stub("--fault", "die-mid-stream", "--fault-limit", "1", "--log", str(log)) as base:
        assert (await stream(base, "/v1/completions", body))[1] is not None
        assert (await stream(base, "/v1/chat/completions", body))[0][-1] == "[DONE]"
        assert (await stream(base, "/v1/completions", body))[0][-1] == "[DONE]"
    lines = log.read_text().splitlines()
    assert "completion start" in lines[0] and " continued=2 " in lines[0] and lines[0].endswith("fault=die-mid-stream")
    assert all("fault=" not in line and " in_flight=1 " in line for line in lines[1:])  # the dead one was released
    with running_stub("--fault", "die-mid-stream", "--fault-after", "1") as base:  # the reverse
        assert (await stream(base, "/v1/chat/completions", body))[0][-1] == "[DONE]"
        assert (await stream(base, "/v1/chat/completions", body))[1] is not None
        assert (await stream(base, "/v1/completions", body))[1] is not None
