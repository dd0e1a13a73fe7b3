"""vLLM's token-id members are cut out of every native payload, and nothing else is touched.

The payloads are vLLM 0.32's own, as a real server wrote them (`tests/contract/vllm` checks the
same against one): a chat stream's first chunk (`prompt_token_ids`), its token and finish chunks
(`token_ids` in the choice), text-completion chunks (both, an echo's ids not null), and the
answers. Every other byte stays: the cut payload is the upstream's with the members' bytes
removed. The token fast path (a learnt shape whose tail holds `token_ids`) relays, read by
read, exactly what the full decode of each payload relays.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.outbound.test_token_frames import _same, _sent

from adapters.outbound.openai_compat.chat_response import response_from_completion
from adapters.outbound.openai_compat.completion_mapping import TextStreamMapper, completion_from_body
from adapters.outbound.openai_compat.stream_mapping import StreamMapper
from adapters.outbound.openai_compat.token_frames import TOKEN_FRAMES_FORMAT
from adapters.outbound.openai_compat.token_ids import cut_tail, without_token_ids
from adapters.outbound.openai_compat.wire import COMPLETION_DECODER, NEXT_CHUNK_DECODER, TEXT_DECODER

_ID = b'{"id":"chatcmpl-ae55","object":"chat.completion.chunk","created":1796499880,"model":"tiny","choices":'
ROLE = _ID + (b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
              b'"prompt_token_ids":null,"prompt_text":null}')
HEAD = _ID + b'[{"index":0,"delta":{"content":'
TAIL = b'},"logprobs":null,"finish_reason":null,"token_ids":null}]}'
FINISH = _ID + (b'[{"index":0,"delta":{"content":"875"},"logprobs":null,"finish_reason":"length",'
                b'"stop_reason":null,"token_ids":null}],"system_fingerprint":"vllm-0.32.0-51efd793"}')
USAGE = _ID + b'[],"usage":{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3}}'
LOGPROBS = (_ID + b'[{"index":1,"delta":{"content":" cache"},"logprobs":{"content":[{"token":" cache",'
            b'"logprob":-8.770624160766602,"bytes":[32,99,97,99,104,101],"top_logprobs":[]}]},'
            b'"finish_reason":null,"token_ids":null}]}')
CHAT_BODY = (b'{"id":"chatcmpl-83eb","object":"chat.completion","created":1796499881,"model":"tiny","choices":'
             b'[{"index":0,"message":{"role":"assistant","content":"continue 516385der","refusal":null,'
             b'"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":null,'
             b'"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null}],'
             b'"service_tier":null,"system_fingerprint":"vllm-0.32.0-51efd793","usage":{"prompt_tokens":10,'
             b'"total_tokens":13,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0,'
             b'"created_cache_tokens":0,"multimodal_tokens":null},"completion_tokens_details":null},'
             b'"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,'
             b'"ec_transfer_params":null,"metrics":null}')
_TEXT_ID = b'{"id":"cmpl-b6b7","object":"text_completion","created":1796499881,"model":"tiny","choices":'
ECHO = _TEXT_ID + (b'[{"index":0,"text":"hi 693","logprobs":null,"finish_reason":null,"stop_reason":null,'
                   b'"prompt_token_ids":[76,77],"token_ids":null}]}')
TEXT = _TEXT_ID + (b'[{"index":0,"text":"Made","logprobs":null,"finish_reason":"length","stop_reason":null,'
                   b'"prompt_token_ids":null,"token_ids":null}],"system_fingerprint":"vllm-0.32.0-51efd793"}')
TEXT_BODY = (_TEXT_ID + b'[{"index":0,"text":"} 18099 8290","logprobs":null,"finish_reason":"length",'
             b'"stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,'
             b'"routed_experts":null}],"service_tier":null,"usage":{"prompt_tokens":2,"total_tokens":5,'
             b'"completion_tokens":3},"kv_transfer_params":null,"metrics":null}')
MEMBERS = (b',"token_ids":null', b',"prompt_token_ids":null', b',"prompt_token_ids":[76,77]', b',"token_ids":[9,10]')


def removed(payload: bytes) -> bytes:
    """The payload with vLLM's members' bytes taken out (what the cut must give)."""
    for member in MEMBERS:
        payload = payload.replace(member, b"")
    return payload


def dropped(value: Any) -> Any:
    """A decoded JSON value without the members, at any depth."""
    if isinstance(value, dict):
        return {k: dropped(v) for k, v in value.items() if k not in ("token_ids", "prompt_token_ids")}
    return [dropped(v) for v in value] if isinstance(value, list) else value


@pytest.mark.parametrize("payload", [ROLE, HEAD + b'"x"' + TAIL, FINISH, LOGPROBS, ECHO, TEXT])
def test_a_vllm_stream_payload_loses_its_members_and_nothing_else(payload: bytes) -> None:
    decoder = TEXT_DECODER if b"text_completion" in payload else NEXT_CHUNK_DECODER
    cut = without_token_ids(payload, decoder.decode(payload))
    assert cut == removed(payload) != payload and b"token_ids" not in cut


def test_a_payload_without_members_is_itself() -> None:
    assert without_token_ids(USAGE, NEXT_CHUNK_DECODER.decode(USAGE)) is USAGE


def test_vllm_answers_lose_their_members_and_nothing_else() -> None:
    for body, decoder in ((CHAT_BODY, COMPLETION_DECODER), (TEXT_BODY, TEXT_DECODER)):
        cut = without_token_ids(body, decoder.decode(body))
        assert cut == removed(body) != body and b"token_ids" not in cut
    assert response_from_completion(CHAT_BODY).native.data == removed(CHAT_BODY)  # type: ignore[union-attr]
    assert completion_from_body(TEXT_BODY).native.data == removed(TEXT_BODY)  # type: ignore[union-attr]


@pytest.mark.parametrize("text", [
    '{"choices":[{"index":0,"token_ids":null,"text":"a"}]}',  # first in its object
    '{"choices":[{"token_ids":[1,2],"prompt_token_ids":null}],"token_ids":null}',  # nothing else in it
    '{"choices": [{"index": 0, "text": "a", "token_ids": [1, 2]}], "prompt_token_ids": [3]}',  # blanks
    '{\n  "choices": [\n    {"text": "a",\n     "prompt_token_ids" : null\n    }\n  ]\n}',
    '{"choices":[{"text":"a","token_ids":{"odd":[1]}}],"prompt_token_ids":"7 8","x":1.5}',  # no ids: decoded
    '{"choices":[{"text":",\\"token_ids\\":null","token_ids":null}],"stop_token_ids":[2]}',  # the name in a text
])  # fmt: skip
def test_any_form_of_the_members_is_cut(text: str) -> None:
    raw = text.encode()
    cut = without_token_ids(raw, TEXT_DECODER.decode(raw))
    assert json.loads(cut) == dropped(json.loads(raw))
    assert json.loads(cut)["choices"][0].get("text", "a") == json.loads(raw)["choices"][0].get("text", "a")


def test_a_tail_loses_its_members_only_if_all_are_there_null() -> None:
    assert cut_tail(TAIL, NEXT_CHUNK_DECODER.decode(HEAD + b'"x"' + TAIL)) == removed(TAIL)
    plain = b'},"logprobs":null,"finish_reason":null}]}'
    assert cut_tail(plain, NEXT_CHUNK_DECODER.decode(HEAD + b'"x"' + plain)) is plain
    ids = TAIL.replace(b"null}]}", b"[5]}]}")  # ids: each token's own, no shape holds
    assert cut_tail(ids, NEXT_CHUNK_DECODER.decode(HEAD + b'"x"' + ids)) is None
    early = HEAD.replace(b'"delta"', b'"token_ids":null,"delta"')  # before the text: no shape
    assert cut_tail(plain, NEXT_CHUNK_DECODER.decode(early + b'"x"' + plain)) is None


# --- the token fast path, with vLLM 0.32's shapes ----------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8)
_token = st.one_of(
    _text.map(lambda text: b"data: " + HEAD + msgspec.json.encode(text) + TAIL),
    st.sampled_from([b"data: " + LOGPROBS, b"data: " + HEAD + b'"a" "b"' + TAIL, b": ping",
                     b"data: " + HEAD + b'"ids"' + TAIL.replace(b"null}]}", b"[9,10]}]}")]),
)


def _events(body: list[bytes]) -> list[bytes]:
    return [b"data: " + ROLE, *body, b"data: " + FINISH, b"data: " + USAGE, b"data: [DONE]"]


@settings(max_examples=200)
@given(st.lists(_token, max_size=20), st.data())
def test_token_reads_relay_what_the_full_decode_relays_without_members(body: list[bytes],
                                                                       data: st.DataObject) -> None:
    events = _events(body)
    cuts = sorted(data.draw(st.sets(st.integers(min_value=1, max_value=len(events)))) | {len(events)})
    reads = [b"".join(event + b"\n\n" for event in events[a:b]) for a, b in itertools.pairwise([0, *cuts])]
    for chunks in (_same(reads), _same([event + b"\n\n" for event in events])):  # and one event a read
        sent = _sent(chunks, "tiny")
        assert b"token_ids" not in sent
        if b'"a" "b"' not in b"".join(body):  # a well-formed stream: every frame relayed, its members cut
            kept = [event for event in events[:-1] if event.startswith(b"data: {")]
            assert sent == b"".join(removed(event) + b"\n\n" for event in kept) + b"data: [DONE]\n\n"


def test_a_run_of_tokens_is_relayed_as_one_slice_without_members() -> None:
    tokens = [b"data: " + HEAD + msgspec.json.encode(text) + TAIL + b"\n\n" for text in ("a", "", "b")]
    mapper = StreamMapper()
    mapper.feed_events(b"data: " + ROLE + b"\n\n" + tokens[0])  # learns the shape
    [run] = mapper.feed_events(b"".join(tokens))
    assert run.native is not None and run.native.format == TOKEN_FRAMES_FORMAT
    assert run.native.data == removed(b"".join(tokens))
    [one] = mapper.token_read(tokens[2]) or []  # a paced read: one token
    assert one.native is not None and one.native.data == removed(tokens[2])


def test_a_completion_stream_relays_its_payloads_without_members() -> None:
    mapper = TextStreamMapper()
    for payload in (ECHO, TEXT):
        chunk = mapper.feed(payload)
        assert chunk is not None and chunk.native is not None and chunk.native.data == removed(payload)
