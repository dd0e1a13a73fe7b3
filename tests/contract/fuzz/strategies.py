"""Hypothesis strategies for hostile request bodies on both surfaces.

Bodies are built as JSON *text*, so that what a Python JSON encoder cannot make is
possible too: numbers beyond any float or 64-bit int, nesting thousands deep, strings
with invalid UTF-8, lone surrogate escapes and NULs. Every field of a plausible request
is drawn from `field(valid)`: usually a valid value, sometimes a hostile one, so one
example carries hostile values at several depths at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from tests.contract.fuzz.edge import CAPPED_OUTPUT, MODEL


class Raw:
    """JSON text inserted verbatim by `encode`."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text[:60]!r}{'...' if len(self.text) > 60 else ''})"


def encode(value: Any) -> bytes:
    """JSON text of `value`, with `Raw` pieces inserted as they are."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return b"{" + b",".join(encode(str(k)) + b":" + encode(v) for k, v in value.items()) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(encode(v) for v in value) + b"]"
    return json.dumps(value).encode()


def _deep(depth: int, kind: str) -> Raw:
    if kind == "array":
        return Raw(b"[" * depth + b"]" * depth)
    return Raw(b'{"a":' * depth + b"1" + b"}" * depth)


HUGE_NUMBERS = [b"1" + b"0" * 400, b"-" + b"9" * 5000, b"1e999999", b"-1e-999999", b"18446744073709551616",
                b"9223372036854775808", b"-9223372036854775809", b"1.7976931348623157e309", b"-0", b"0.0e0"]
ODD_STRINGS = [b'"\xff\xfe\xfd"', b'"\xc3\x28"', b'"\xed\xa0\x80"', b'"\\ud800"', b'"\\udfff\\ud800"',
               b'"\\u0000"', b'"a\\u0000b"', b'"\\"', b'"\xf4\x90\x80\x80"', b'"\xef\xbb\xbf"']
DEPTHS = [64, 500, 950, 990, 1000, 1100, 5000, 20000]


def hostile() -> st.SearchStrategy[Any]:
    """A value of a wrong or extreme kind for any field."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from(HUGE_NUMBERS).map(Raw),
        st.sampled_from(ODD_STRINGS).map(Raw),
        st.text(max_size=40),
        st.lists(st.integers() | st.text(max_size=5), max_size=4),
        st.dictionaries(st.text(max_size=8), st.integers() | st.none(), max_size=3),
        st.builds(_deep, st.sampled_from(DEPTHS), st.sampled_from(["array", "object"])),
        st.sampled_from([1_000, 100_000, 600_000]).map(lambda n: "x" * n),  # giant strings
        st.sampled_from([[], {}, "", [[]], [{}], {"": None}]),
    )


HOSTILE = hostile()


def field(valid: st.SearchStrategy[Any], odds: int = 12, odd: list[Any] | None = None) -> st.SearchStrategy[Any]:
    """`valid`, or one time in `odds` a hostile value (or one of the `odd` ones): a request has
    a few hostile spots at most, so most examples get past the first field to deeper code."""
    bad = HOSTILE if not odd else st.one_of(HOSTILE, st.sampled_from(odd))
    # Hypothesis favours small integers: 0 (the likeliest draw) must be the valid side.
    return st.integers(0, odds - 1).flatmap(lambda i: bad if i == odds - 1 else valid)


def optional(draw: Callable[..., Any], out: dict[str, Any], key: str, valid: st.SearchStrategy[Any]) -> None:
    if draw(st.booleans()):
        out[key] = draw(field(valid))


TEXT = st.text(max_size=30) | st.just("use f")  # "use f": the stub answers with a call of tool f
MODELS = st.sampled_from([MODEL, MODEL, MODEL, "unknown-model", ""])
# Image URLs: ones that pass (so the mapping past the check is fuzzed too), ones the edge refuses
# (other schemes, internal hosts in odd spellings), and any text.
URLS = st.one_of(
    st.sampled_from(["https://img.example.com/cat.png", "data:image/png;base64,iVBORw0KGgo=", "HTTPS://EXAMPLE.COM"]),
    st.sampled_from(["file:///etc/passwd", "http://169.254.169.254/", "https://2852039166/", "https://[::ffff:7f00:1]/",
                     "https://0x7f.1/", "https://localhost./", "https://exa\\mple.com@10.0.0.1/", "https://[::1%25lo]/",
                     "https://" + "a" * 300 + ".com/", "https://1.2.3.4.5/", "gopher://x:70/_", " https://x.com/"]),
    TEXT,
)
SCHEMAS = st.one_of(
    st.just({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}),
    st.just({"type": "object", "properties": {"q": {"$ref": "#/nowhere"}}}),
    st.just({"type": 12, "properties": [], "required": "q"}),
    st.just({"anyOf": [], "oneOf": None, "enum": []}),
    st.just({"type": ["null"], "items": {"type": "array"}}),
    st.dictionaries(st.text(max_size=6), HOSTILE, max_size=3),
)


# --- /v1 -------------------------------------------------------------------------


@st.composite
def openai_part(draw: Callable[..., Any]) -> Any:
    kind = draw(field(st.sampled_from(["text", "text", "image_url"]), odd=["input_audio", "unknown", ""]))
    if kind == "text":
        return {"type": "text", "text": draw(field(TEXT))}
    if kind == "image_url":
        return {"type": "image_url", "image_url": draw(field(st.fixed_dictionaries({"url": URLS})))}
    return {"type": kind, "data": draw(TEXT)}


@st.composite
def openai_message(draw: Callable[..., Any]) -> Any:
    role = draw(field(st.sampled_from(["user", "user", "assistant", "system", "developer", "tool"]),
                      odd=["function", "", "USER"]))
    content = st.one_of(TEXT, st.lists(field(openai_part()), max_size=20), st.none())
    message: dict[str, Any] = {"role": role, "content": draw(field(content))}
    if role == "assistant" and draw(st.booleans()):
        call = {"id": draw(TEXT), "type": "function", "function": {"name": "f", "arguments": draw(TEXT)}}
        message["tool_calls"] = draw(field(st.lists(field(st.just(call)), max_size=3)))
    if role == "tool":
        message["tool_call_id"] = draw(field(TEXT))
    optional(draw, message, "name", TEXT)
    return message


@st.composite
def openai_body(draw: Callable[..., Any]) -> bytes:
    body: dict[str, Any] = {
        "model": draw(field(MODELS, 30)),
        "messages": draw(field(st.lists(field(openai_message()), min_size=0, max_size=6), 30)),
    }
    tokens = field(st.integers(1, CAPPED_OUTPUT), odd=[0, -1, CAPPED_OUTPUT + 1, 2**31, 2**64, -(2**65)])
    optional(draw, body, "max_tokens", tokens)
    optional(draw, body, "max_completion_tokens", tokens)
    optional(draw, body, "stream", st.booleans())
    optional(draw, body, "stream_options", st.fixed_dictionaries({"include_usage": st.booleans()}))
    optional(draw, body, "temperature", st.floats(min_value=0, max_value=2))
    optional(draw, body, "stop", st.lists(TEXT, max_size=3) | TEXT)
    optional(draw, body, "n", st.integers(min_value=1, max_value=3))
    optional(draw, body, "seed", st.integers())
    if draw(st.booleans()):
        tool = {"type": "function", "function": {"name": "f", "parameters": draw(field(SCHEMAS))}}
        body["tools"] = draw(field(st.lists(field(st.just(tool)), max_size=3)))
        choices = st.sampled_from(["auto", "none", "required", "any", {"type": "function", "function": {"name": "f"}},
                                   {"type": "function", "function": {"name": "g"}}])
        optional(draw, body, "tool_choice", choices)
        optional(draw, body, "parallel_tool_calls", st.booleans())
    return encode(body)


# --- /llm ------------------------------------------------------------------------


@st.composite
def anthropic_block(draw: Callable[..., Any]) -> Any:
    kind = draw(field(st.sampled_from(["text", "text", "image", "tool_use", "tool_result", "thinking",
                                       "redacted_thinking"]), odd=["document", "server_tool_use", "search_result", ""]))
    if kind == "text":
        return {"type": "text", "text": draw(field(TEXT)), "cache_control": {"type": "ephemeral"}}
    if kind == "image":
        source = st.one_of(
            st.fixed_dictionaries({"type": st.just("base64"), "media_type": st.sampled_from(["image/png", "text/x"]),
                                   "data": TEXT}),
            st.fixed_dictionaries({"type": st.just("url"), "url": URLS}),
            st.fixed_dictionaries({"type": st.just("file"), "file_id": TEXT}),
        )
        return {"type": "image", "source": draw(field(source))}
    if kind == "tool_use":
        return {"type": "tool_use", "id": draw(field(TEXT)), "name": "f", "input": draw(field(st.just({"q": "x"})))}
    if kind == "tool_result":
        inner = st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), st.fixed_dictionaries(
            {"type": st.just("image"), "source": st.fixed_dictionaries({"type": st.just("url"), "url": URLS})}))
        content = TEXT | st.lists(inner, max_size=3)
        return {"type": "tool_result", "tool_use_id": draw(field(TEXT)), "content": draw(field(content)),
                "is_error": draw(field(st.booleans()))}
    if kind == "thinking":
        return {"type": "thinking", "thinking": draw(field(TEXT)), "signature": draw(field(TEXT | st.none()))}
    if kind == "redacted_thinking":
        return {"type": "redacted_thinking", "data": draw(field(TEXT))}
    return {"type": kind, "source": draw(HOSTILE)}


@st.composite
def anthropic_message(draw: Callable[..., Any]) -> Any:
    role = draw(field(st.sampled_from(["user", "user", "assistant"]), odd=["system", "tool", ""]))
    content = st.one_of(TEXT, st.lists(field(anthropic_block()), max_size=20))
    return {"role": role, "content": draw(field(content))}


@st.composite
def anthropic_body(draw: Callable[..., Any], count_tokens: bool = False) -> bytes:
    first = {"role": "user", "content": draw(TEXT)}
    turns = st.lists(field(anthropic_message()), max_size=6).map(lambda rest: [first, *rest])  # user first
    body: dict[str, Any] = {
        "model": draw(field(MODELS, 30)),
        "messages": draw(field(turns | st.lists(field(anthropic_message()), max_size=4), 30)),
    }
    if not count_tokens:
        tokens = field(st.integers(1, CAPPED_OUTPUT), odd=[0, -1, CAPPED_OUTPUT + 1, 2**31, 2**64, -(2**65)])
        if draw(st.integers(0, 19)):
            body["max_tokens"] = draw(tokens)
        optional(draw, body, "stream", st.booleans())
        optional(draw, body, "temperature", field(st.floats(min_value=0, max_value=1), odd=[-1, 2, 1e309]))
        optional(draw, body, "stop_sequences", st.lists(TEXT, max_size=3))
        optional(draw, body, "metadata", st.fixed_dictionaries({"user_id": TEXT}))
    system = TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=20)
    optional(draw, body, "system", system)
    thinking = field(st.sampled_from([{"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"},
                                      {"type": "adaptive"}]), odd=[{"type": "enabled", "budget_tokens": 0},
                                                                  {"type": "sometimes"}])
    optional(draw, body, "thinking", thinking)
    if draw(st.booleans()):
        tool = field(st.fixed_dictionaries({"name": st.just("f"), "input_schema": SCHEMAS}), odd=[
            {"type": "web_search_20250305", "name": "web_search"}, {"name": "f"}, {"type": "custom", "name": "f"}])
        body["tools"] = draw(field(st.lists(field(tool), max_size=3)))
        choices = field(st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"},
                                         {"type": "tool", "name": "f"}]),
                        odd=[{"type": "tool", "name": "g"}, {"type": "required"}, "auto"])
        optional(draw, body, "tool_choice", choices)
    return encode(body)


# --- any surface -----------------------------------------------------------------


def garbage() -> st.SearchStrategy[bytes]:
    """Bodies that are not a JSON object at all, or barely."""
    return st.one_of(
        st.binary(max_size=200),
        st.sampled_from([b"", b"null", b"[]", b'"x"', b"1e999", b"{", b'{"model":', b"\xef\xbb\xbf{}", b"{}",
                         b'{"model":"m","model":1}', b"{'model': 'm'}", b'{"messages":[]}\x00', b"NaN"]),
        st.builds(_deep, st.sampled_from(DEPTHS), st.sampled_from(["array", "object"])).map(lambda raw: raw.text),
        st.builds(encode, HOSTILE),
    )
