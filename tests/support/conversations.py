"""Agents' conversations against a gateway with `--prefix-cache` stub replicas: each turn
re-sends the whole conversation plus the last answer and a new tool result, as an agent's
does; which replica served each turn is read from the stubs' `--log` lines (the last user
message starts with the conversation and turn, `c03t2`), with its `cached_tokens`.

Used by tests/contract/replicas/test_affinity_e2e.py and by `bench/affinity.py`."""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

_LINE = re.compile(r'user="c(\d+)t(\d+)[^"]*".*prompt_tokens=(\d+) cached_tokens=(\d+)')
WORDS = ("read the file check the result run the tests fix the error call the tool with the path and "
         "report what changed in the module before the next step").split()  # fmt: skip


def system_prompt(words: int = 1200, seed: int = 0) -> str:
    """A long instruction block every conversation shares (an agent's tools and rules)."""
    rng = random.Random(seed)
    return "You are a coding agent. " + " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass
class Turn:
    conversation: int
    turn: int
    ttft: float  # seconds to the first content byte (a stream) or the whole answer (plain)
    status: int


@dataclass
class Placement:
    """Turn (conversation, n) -> (replica index, prompt tokens, cached tokens), from the stubs' logs."""

    where: dict[tuple[int, int], tuple[int, int, int]] = field(default_factory=dict)

    def summary(self) -> str:
        """Each conversation's replicas, turn by turn (`0 0 1 1 1`), and the shares."""
        rows = sorted({c for c, _ in self.where})
        lines = [f"c{c:02d}: " + " ".join(str(self.where[(c, n)][0]) if (c, n) in self.where else "-"
                                         for n in range(max(n for _, n in self.where) + 1)) for c in rows]
        return "\n".join([*lines, f"kept {self.kept():.2f} at_home {self.at_home():.2f} warm {self.warm():.2f}"])

    def home(self, conversation: int) -> int:
        return self.where[(conversation, 0)][0]

    def kept(self, turns: Sequence[int] = (1, 2, 3, 4)) -> float:
        """The share of `turns` (0-based) served where their conversation's last turn was (the
        replica holding its KV cache)."""
        later = [(c, n) for (c, n) in self.where if n in turns and (c, n - 1) in self.where]
        return sum(self.where[(c, n)][0] == self.where[(c, n - 1)][0] for c, n in later) / max(len(later), 1)

    def at_home(self, turns: Sequence[int] = (1, 2, 3, 4)) -> float:
        """The share of `turns` (0-based) served by their conversation's first replica."""
        later = [(c, n) for (c, n) in self.where if n in turns]
        return sum(self.where[key][0] == self.home(key[0]) for key in later) / max(len(later), 1)

    def warm(self, turns: Sequence[int] = (1, 2, 3, 4)) -> float:
        """The share of `turns` (0-based) that found their conversation's whole last turn cached
        (all but its partial last block of 16 tokens)."""
        later = [(c, n) for (c, n) in self.where if n in turns and (c, n - 1) in self.where]
        return sum(self.where[(c, n)][2] >= self.where[(c, n - 1)][1] - 16 for c, n in later) / max(len(later), 1)

    def uncached(self, turns: Sequence[int] = (1, 2, 3, 4)) -> float:
        """Mean uncached prompt tokens (prefilled) per turn of `turns`."""
        rows = [v for (_, n), v in self.where.items() if n in turns]
        return sum(r[1] - r[2] for r in rows) / max(len(rows), 1)

    def cached_share(self, turns: Sequence[int] = (1, 2, 3, 4)) -> float:
        """Cached prompt tokens / prompt tokens over `turns`."""
        rows = [v for (_, n), v in self.where.items() if n in turns]
        return sum(r[2] for r in rows) / max(sum(r[1] for r in rows), 1)


def placement(logs: Sequence[Path]) -> Placement:
    out = Placement()
    for index, log in enumerate(logs):
        if not log.exists():
            continue
        for line in log.read_text().splitlines():
            match = _LINE.search(line)
            if match and " chat start " in line:
                c, n, prompt, cached = map(int, match.groups())
                out.where[(c, n)] = (index, prompt, cached)
    return out


def _body(model: str, messages: list[dict[str, Any]], stream: bool, extra: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 24, **extra}
    if stream:
        body["stream"] = True
    return body


async def _ask(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[int, float, str]:
    """(status, TTFT, answer text) of one /v1 chat request."""
    started = time.monotonic()
    if not body.get("stream"):
        response = await client.post(url, json=body)
        ttft = time.monotonic() - started
        if response.status_code != 200:
            return response.status_code, ttft, ""
        return 200, ttft, response.json()["choices"][0]["message"]["content"] or ""
    ttft, text = 0.0, []
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, time.monotonic() - started, ""
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or []
            piece = choices[0].get("delta", {}).get("content") if choices else None
            if piece:
                if not text:
                    ttft = time.monotonic() - started
                text.append(piece)
    return 200, ttft, "".join(text)


async def converse(
    gateways: Sequence[str], model: str, *, conversations: int = 12, turns: int = 5, seed: int = 1,
    think: tuple[float, float] = (0.05, 0.4), system: str | None = None, result_words: int = 60,
    extra: dict[str, Any] | None = None, deadline: float = 120.0, stream: bool | None = None,
) -> list[Turn]:
    """`conversations` agents at once, `turns` each; turn n of conversation c goes to gateway
    `(c + n) % len(gateways)` (so every gateway sees every conversation); half of them stream
    (`stream` None), or all or none.
    Between turns an agent "runs its tool" for a random think time. Bounded by `deadline`."""
    shared = system if system is not None else system_prompt()
    done: list[Turn] = []
    stop = time.monotonic() + deadline

    async def agent(c: int, client: httpx.AsyncClient) -> None:
        messages: list[dict[str, Any]] = [{"role": "system", "content": shared}]
        pause = random.Random(seed * 1000 + c)
        task = " ".join(pause.choice(WORDS) for _ in range(result_words))
        messages.append({"role": "user", "content": f"c{c:02d}t0 conversation {c}: fix the failing test: {task}"})
        await asyncio.sleep(pause.uniform(0, think[1]))
        for n in range(turns):
            if time.monotonic() > stop:
                return
            url = gateways[(c + n) % len(gateways)] + "/v1/chat/completions"
            streamed = (c + n) % 2 == 1 if stream is None else stream
            status, ttft, answer = await _ask(client, url, _body(model, messages, streamed, extra or {}))
            done.append(Turn(c, n, ttft, status))
            if status != 200:
                return
            result = " ".join(pause.choice(WORDS) for _ in range(result_words))
            messages += [{"role": "assistant", "content": answer or "ok"},
                         {"role": "user", "content": f"c{c:02d}t{n + 1} tool result: {result}"}]  # fmt: skip
            await asyncio.sleep(pause.uniform(*think))

    limits = httpx.Limits(max_connections=4 * conversations)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=limits) as client:
        await asyncio.wait_for(asyncio.gather(*(agent(c, client) for c in range(conversations))), deadline + 30)
    return done


def percentile(values: Sequence[float], q: int) -> float:
    """The q-th percentile (1-99), linear between samples."""
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]
