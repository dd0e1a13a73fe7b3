"""Only what the gateway understands is forwarded, shown by a recording upstream.

A real stub process with `--log-bodies` writes every body it receives; two real gateway
processes with API keys (the same config, keys file and `cache_salt_secret_file`) front it.
Clients are the official SDKs, hostile members sent through `extra_body`: `priority` (vLLM's
queue order), `request_id` (its engine id), `kv_transfer_params`, `chat_template`, a client's
own `cache_salt` and unknown members must never arrive; the allowlisted sampling parameters
must; and each consumer's own `cache_salt` (the gateway's) arrives on every body, the same
for one consumer through either gateway process, different between consumers.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import httpx
import msgspec
import openai
import pytest
from tests.support.processes import Proc, Processes, upstream_toml

from adapters.outbound.keys_file import keys_entry, new_key

MODEL = "reasoning"
ALICE, BOB = new_key(), new_key()
USER = [{"role": "user", "content": "hello there"}]
# Never from a client (SECURITY.md), and members nobody models.
HOSTILE: dict[str, Any] = {
    "priority": -100, "request_id": "engine-collision", "kv_transfer_params": {"do_remote_prefill": True},
    "chat_template": "{{ raise_exception('x') }}", "cache_salt": "chosen-by-the-client", "x_unknown": {"a": 1},
    "min_tokens": 4000, "ignore_eos": True, "vllm_xargs": {"k": 1},
}
NEVER = ("priority", "request_id", "kv_transfer_params", "chat_template", "x_unknown", "min_tokens", "ignore_eos",
         "vllm_xargs")
# Allowlisted: they must arrive as sent.
ALLOWED: dict[str, Any] = {
    "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "seed": 7, "presence_penalty": 0.5,
    "frequency_penalty": -0.5, "logit_bias": {"42": -50}, "guided_choice": ["yes", "no"],
}
CHAT_ONLY: dict[str, Any] = {"chat_template_kwargs": {"custom_flag": True}}


@dataclass
class Edge:
    gateways: tuple[Proc, Proc]
    log: Path

    def bodies(self) -> list[dict[str, Any]]:
        """Every body the stub received, in order (the JSON ending each --log line)."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [msgspec.json.decode(line.split(" body=", 1)[1]) for line in lines if " body=" in line]

    def last(self) -> dict[str, Any]:
        bodies = self.bodies()
        assert bodies, "the upstream received nothing"
        return bodies[-1]

    def openai(self, key: str = ALICE, gateway: int = 0) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.gateways[gateway].url}/v1", api_key=key, max_retries=0, timeout=20)

    def anthropic(self, key: str = ALICE) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=f"{self.gateways[0].url}/llm", api_key=key, max_retries=0, timeout=20)


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    workdir = tmp_path_factory.mktemp("forwarding")
    keys, secret = workdir / "keys.toml", workdir / "salt.secret"
    keys.write_text(keys_entry("alice", ALICE) + keys_entry("bob", BOB))
    secret.write_text(secrets.token_urlsafe(32) + "\n")
    auth = f'\n[auth]\nmode = "required"\nkeys_file = "{keys}"\ncache_salt_secret_file = "{secret}"\n'
    procs = Processes(workdir)
    log = workdir / "stub.log"
    try:
        stub = procs.stub("--tokens", "4", "--log-bodies", log=log)
        toml = upstream_toml(MODEL, stub.url, [MODEL]) + auth
        first, second = procs.together(partial(procs.gateway, toml) for _ in range(2))
        yield Edge((first, second), log)
    finally:
        procs.stop_all()


def _salt(body: dict[str, Any]) -> str:
    salt = body.get("cache_salt")
    assert isinstance(salt, str) and len(salt) == 43 and salt != HOSTILE["cache_salt"], body
    return salt


def _dropped_and_allowed(body: dict[str, Any], allowed: dict[str, Any]) -> None:
    assert not set(NEVER) & set(body), body
    assert {k: body.get(k) for k in allowed} == allowed


def test_v1_chat_forwards_only_the_allowlist_and_the_gateways_own_salt(edge: Edge) -> None:
    edge.openai().chat.completions.create(model=MODEL, messages=USER,  # type: ignore[arg-type]
                                          extra_body={**HOSTILE, **ALLOWED, **CHAT_ONLY})
    body = edge.last()
    _dropped_and_allowed(body, {**ALLOWED, **CHAT_ONLY})
    _salt(body)


def test_one_consumer_has_one_salt_across_gateway_processes_and_consumers_differ(edge: Edge) -> None:
    salts = {}
    for who, key, gateway in (("alice@0", ALICE, 0), ("alice@1", ALICE, 1), ("bob@0", BOB, 0), ("bob@1", BOB, 1)):
        edge.openai(key, gateway).chat.completions.create(model=MODEL, messages=USER)  # type: ignore[arg-type]
        salts[who] = _salt(edge.last())
    assert salts["alice@0"] == salts["alice@1"] and salts["bob@0"] == salts["bob@1"]
    assert salts["alice@0"] != salts["bob@0"]


def test_llm_messages_drop_what_is_not_modelled_and_salt_every_body(edge: Edge) -> None:
    client = edge.anthropic()
    client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                           extra_body=HOSTILE)
    body = edge.last()
    _dropped_and_allowed(body, {})
    salt = _salt(body)
    # An assistant prefill is vLLM's continue_final_message, set by the gateway, not a client.
    client.messages.create(model=MODEL, max_tokens=8, messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure:"}])
    prefill = edge.last()
    assert (prefill["continue_final_message"], prefill["add_generation_prompt"]) == (True, False)
    assert _salt(prefill) == salt


def test_v1_responses_drop_what_is_not_modelled(edge: Edge) -> None:
    edge.openai().responses.create(model=MODEL, input="hi", max_output_tokens=8, extra_body=HOSTILE)
    body = edge.last()
    _dropped_and_allowed(body, {})
    _salt(body)


def test_v1_completions_and_embeddings_forward_only_the_allowlist(edge: Edge) -> None:
    client = edge.openai()
    client.completions.create(model=MODEL, prompt="once upon", max_tokens=4, extra_body={**HOSTILE, **ALLOWED})
    body = edge.last()
    _dropped_and_allowed(body, ALLOWED)
    salt = _salt(body)
    client.embeddings.create(model=MODEL, input="a b", extra_body=HOSTILE)
    embedded = edge.last()
    _dropped_and_allowed(embedded, {})
    assert _salt(embedded) == salt


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": USER, "n": 64, "best_of": 64}, "n"),
    ("/v1/chat/completions", {"messages": USER, "best_of": 2}, "best_of"),
    ("/v1/completions", {"prompt": "x", "n": 64, "best_of": 64}, "n"),
    ("/v1/completions", {"prompt": "x", "best_of": 64}, "best_of"),
    ("/v1/chat/completions", {"messages": USER, "logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": USER, "top_k": -5}, "top_k"),
])  # fmt: skip
def test_choices_above_max_choices_and_unbounded_members_are_400_naming_the_field(
    edge: Edge, path: str, body: dict[str, Any], param: str
) -> None:
    before = len(edge.bodies())
    answer = httpx.post(edge.gateways[0].url + path, json={"model": MODEL, **body},
                        headers={"authorization": f"Bearer {ALICE}"}, timeout=20)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.text
    assert len(edge.bodies()) == before  # refused at the edge: nothing reached the upstream


def test_the_openai_sdk_sees_the_400_as_a_bad_request(edge: Edge) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        edge.openai().chat.completions.create(model=MODEL, messages=USER, n=64,  # type: ignore[arg-type]
                                              extra_body={"best_of": 64})
    assert "max_choices" in caught.value.message
