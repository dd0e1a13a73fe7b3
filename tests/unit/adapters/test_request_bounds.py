"""Bounds on what a client sizes, in both decoders: model names, stop sequences, tools and
their schemas, blocks at every nesting level, image URLs; and the config keys behind them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from adapters.inbound._shared.call import Call
from adapters.inbound._shared.limits import InputLimits
from adapters.inbound.anthropic.mapping import decode_count_tokens, decode_messages
from adapters.inbound.openai.mapping import decode_request
from config import ConfigError, load_config_text
from domain.canonical import ImagePart, ToolResultPart
from domain.errors import InvalidRequest
from wiring.http_app import input_limits

LIMITS = InputLimits(max_content_blocks=3, max_stop_sequences=2, max_tools=2, max_tool_schema_bytes=100)
USER = {"role": "user", "content": "hi"}
PUBLIC = "https://img.example.com/cat.png"


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [USER], **fields}).encode()


def openai(**fields: Any) -> Any:
    return decode_request(body(**fields), "", LIMITS).chat


def anthropic(**fields: Any) -> Any:
    return decode_messages(body(max_tokens=8, **fields), "", LIMITS)


def refused(decode: Any, **fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        decode(**fields)
    error = caught.value
    assert error.param is not None and error.param in error.message  # both surfaces name the field
    return error


DECODERS = [openai, anthropic]
IDS = ["v1", "llm"]


# --- model names -------------------------------------------------------------------------


@pytest.mark.parametrize("decode", [openai, anthropic, lambda **f: decode_count_tokens(body(**f), "", LIMITS)],
                         ids=[*IDS, "count_tokens"])
def test_model_names_longer_than_256_characters_are_refused(decode: Any) -> None:
    assert decode(model="m" * 256).model == "m" * 256
    error = refused(decode, model="m" * 257)
    assert error.param == "model" and "257 characters" in error.message and "at most 256" in error.message
    assert refused(decode, model="x" * 30_000).param == "model"


# --- stop sequences ------------------------------------------------------------------------


def test_openai_stop_sequences_are_bounded_in_count_and_length() -> None:
    assert openai(stop=["a", "b"]).stop == ["a", "b"] and openai(stop="a" * 512).stop == ["a" * 512]
    error = refused(openai, stop=["a", "b", "c"])
    assert error.param == "stop" and "3 stop sequences" in error.message and "at most 2" in error.message
    assert refused(openai, stop=["a", "b" * 513]).param == "stop[1]"
    assert refused(openai, stop="b" * 513).param == "stop"


def test_anthropic_stop_sequences_are_bounded_in_count_and_length() -> None:
    assert anthropic(stop_sequences=["a", "b" * 512]).stop == ["a", "b" * 512]
    assert refused(anthropic, stop_sequences=["a", "b", "c"]).param == "stop_sequences"
    error = refused(anthropic, stop_sequences=["a", "b" * 513])
    assert error.param == "stop_sequences.1" and "513 characters" in error.message


# --- tools and their schemas -----------------------------------------------------------------


def openai_tool(name: str, schema: Any = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if schema is not None:
        function["parameters"] = schema
    return {"type": "function", "function": function}


def anthropic_tool(name: str, schema: Any) -> dict[str, Any]:
    return {"name": name, "input_schema": schema}


SMALL = {"type": "object", "properties": {"q": {"type": "string"}}}


@pytest.mark.parametrize(("decode", "tool", "where"), [
    (openai, openai_tool, "tools[1].function.parameters"), (anthropic, anthropic_tool, "tools.1.input_schema"),
], ids=IDS)  # fmt: skip
def test_tools_are_bounded_in_count_and_schema_size(decode: Any, tool: Any, where: str) -> None:
    tools = decode(tools=[tool("a", SMALL), tool("b", SMALL)]).tools
    assert [t.parameters for t in tools] == [SMALL, SMALL]
    error = refused(decode, tools=[tool(c, SMALL) for c in "abc"])
    assert error.param == "tools" and "3 tools" in error.message and "at most 2" in error.message
    big = {"type": "object", "description": "d" * 66}  # 100 bytes as received, more than 100 with spaces
    assert len(json.dumps(big, separators=(",", ":"))) == 100
    compact = json.dumps({"model": "m", "max_tokens": 8, "messages": [USER]})[:-1]
    for spacing, ok in (((",", ":"), True), ((", ", ": "), False)):  # measured as received, whitespace too
        raw = compact + ', "tools": ' + json.dumps([tool("a", SMALL), tool("b", big)], separators=spacing) + "}"
        if ok:
            assert decode_raw(decode, raw.encode()).tools[1].parameters == big
        else:
            with pytest.raises(InvalidRequest) as caught:
                decode_raw(decode, raw.encode())
            assert caught.value.param == where and "at most 100 bytes" in caught.value.message


def decode_raw(decode: Any, raw: bytes) -> Any:
    return decode_request(raw, "", LIMITS).chat if decode is openai else decode_messages(raw, "", LIMITS)


@pytest.mark.parametrize(("decode", "tool", "where"), [
    (openai, openai_tool, "tools[0].function.parameters"), (anthropic, anthropic_tool, "tools.0.input_schema"),
], ids=IDS)  # fmt: skip
def test_a_tool_schema_must_still_be_an_object(decode: Any, tool: Any, where: str) -> None:
    assert refused(decode, tools=[tool("a", [1, 2])]).param == where
    assert refused(decode, tools=[tool("a", "text")]).param == where


def test_a_missing_or_null_schema_keeps_its_meaning() -> None:
    assert openai(tools=[openai_tool("a")]).tools[0].parameters == {}
    assert openai(tools=[{"type": "function", "function": {"name": "a", "parameters": None}}]).tools[0].parameters == {}
    assert refused(anthropic, tools=[{"name": "a"}]).param == "tools.0.input_schema"
    assert refused(anthropic, tools=[{"name": "a", "input_schema": None}]).param == "tools.0.input_schema"


# --- blocks at every level, and image URLs in them -------------------------------------------------


def image(url: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "url", "url": url}}


def tool_result(content: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": "t1", "content": content}


def with_result(content: Any) -> list[dict[str, Any]]:
    call = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    return [USER, {"role": "assistant", "content": [call]}, {"role": "user", "content": [tool_result(content)]}]


def test_tool_result_content_counts_like_a_message() -> None:
    chat = anthropic(messages=with_result([image(PUBLIC)] * 3))
    result = chat.messages[-1].content[0]
    assert isinstance(result, ToolResultPart) and result.content == [ImagePart(url=PUBLIC)] * 3
    error = refused(anthropic, messages=with_result([image(PUBLIC)] * 4))
    assert error.param == "messages.2.content.0.content" and "4 content blocks" in error.message
    with pytest.raises(InvalidRequest):
        decode_count_tokens(body(messages=with_result([{"type": "text", "text": "a"}] * 4)), "", LIMITS)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "http://169.254.169.254/latest", "https://2852039166/",
                                 "https://localhost/x.png", "https://[::ffff:127.0.0.1]/"])
def test_refused_image_urls_name_their_path_in_each_dialect(url: str) -> None:
    part = {"type": "image_url", "image_url": {"url": url}}
    v1 = {"role": "user", "content": [{"type": "text", "text": "see"}, part]}
    assert refused(openai, messages=[v1]).param == "messages[0].content[1].image_url.url"
    llm = {"role": "user", "content": [{"type": "text", "text": "see"}, image(url)]}
    assert refused(anthropic, messages=[llm]).param == "messages.0.content.1.source.url"
    assert refused(anthropic, messages=with_result([image(PUBLIC), image(url)])).param == \
        "messages.2.content.0.content.1.source.url"
    assistant = [USER, {"role": "assistant", "content": [image(url)]}]
    assert refused(anthropic, messages=assistant).param == "messages.1.content.0.source.url"


def test_public_and_data_images_pass_and_data_can_be_turned_off() -> None:
    data = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    chat = anthropic(messages=[{"role": "user", "content": [image(PUBLIC), data]}])
    assert chat.messages[0].content == [ImagePart(url=PUBLIC), ImagePart(url="data:image/png;base64,iVBORw0KGgo=")]
    no_data = InputLimits(media_url_schemes=frozenset({"https"}))
    with pytest.raises(InvalidRequest) as caught:
        decode_messages(body(max_tokens=8, messages=[{"role": "user", "content": [data]}]), "", no_data)
    assert caught.value.param == "messages.0.content.0.source"
    v1 = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}
    with pytest.raises(InvalidRequest) as caught:
        decode_request(body(messages=[v1]), "", no_data)
    assert caught.value.param == "messages[0].content[0].image_url.url"


# --- config ---------------------------------------------------------------------------------

CONFIG = '[upstreams.a]\nurl = "http://a:80"\nmodels = ["m"]\n'


def test_defaults_are_the_documented_ones() -> None:
    limits, server = input_limits(load_config_text(CONFIG)), load_config_text(CONFIG).server
    assert (server.max_stop_sequences, server.max_tools, server.max_tool_schema_bytes) == (16, 256, 65536)
    assert server.media_url_schemes == ["https", "data"]
    assert limits == InputLimits(max_output_tokens=limits.max_output_tokens, max_choices=limits.max_choices)
    assert limits.choices_for("m") == 1  # `max_choices` defaults to 1, as the decoders do


def test_the_keys_reach_the_decoders() -> None:
    text = ("[server]\nmax_stop_sequences = 1\nmax_tools = 1\nmax_tool_schema_bytes = 10\n"
            'media_url_schemes = ["http", "https"]\n' + CONFIG)  # fmt: skip
    limits = input_limits(load_config_text(text))
    assert (limits.max_stop_sequences, limits.max_tools, limits.max_tool_schema_bytes) == (1, 1, 10)
    assert limits.media_url_schemes == {"http", "https"}


@pytest.mark.parametrize(("line", "key"), [
    ('media_url_schemes = ["file"]', "server.media_url_schemes"), ("max_tools = 0", "server.max_tools"),
    ("max_stop_sequences = -1", "server.max_stop_sequences"),
    ("max_tool_schema_bytes = 0", "server.max_tool_schema_bytes"),
])  # fmt: skip
def test_bad_values_are_config_errors_naming_the_key(line: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config_text(f"[server]\n{line}\n" + CONFIG)


def test_the_record_cuts_a_model_name_at_256_whatever_set_it() -> None:
    """The decoders refuse longer names; the record is cut anyway, for every observer (log, metrics, traces)."""
    call = Call({"headers": [], "path": "/v1/chat/completions"}, None)
    call.record.model = "claude-" + "x" * 30_000
    assert call.close_record().model == ("claude-" + "x" * 30_000)[:256]
