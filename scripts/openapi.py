#!/usr/bin/env python3
"""Write docs/openapi.json, the gateway's HTTP API, from the msgspec wire types.

The dialect endpoints are raw ASGI (no framework-made document), so this script is the
document's source: request and response schemas come from the same Structs that decode
and encode the traffic (`msgspec.json.schema_components`), one component namespace per
surface (`OpenAI.*`, `Anthropic.*`). `tests/unit/docs/test_openapi_document.py` fails when
the checked-in file and this script disagree; `tests/contract/fuzz/test_schemathesis.py`
runs schemathesis on it against a live gateway.

    .venv/bin/python scripts/openapi.py          # rewrite docs/openapi.json
    .venv/bin/python scripts/openapi.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = ROOT / "docs" / "openapi.json"
sys.path.insert(0, str(ROOT / "src"))

from adapters.inbound.anthropic import schema as anthropic  # noqa: E402
from adapters.inbound.openai import schema as openai  # noqa: E402

Json = dict[str, Any]

DESCRIPTION = """\
LLM gateway in front of self-hosted OpenAI-compatible model servers (vLLM). Two client
dialects over the same upstreams: `/v1` is OpenAI Chat Completions, `/llm` is Anthropic
Messages. Requests are admitted per upstream under a concurrency cap; overflow waits in
a bounded FIFO queue (503 + Retry-After when full). Streaming answers
(`"stream": true`) are server-sent events. Errors: `/v1` answers RFC 9457 problem
documents with an OpenAI-style `error` member, `/llm` the Anthropic error shape (see
docs/errors.md). API keys: with `[auth] mode = "required"` every request needs a key as
`Authorization: Bearer <key>` or `x-api-key: <key>` (401 otherwise); with auth off (the
default) none is checked (README "API keys", SECURITY.md)."""

ERRORS = {  # status -> when (docs/errors.md)
    "400": "Invalid request: malformed JSON, wrong types, missing fields, a limit exceeded",
    "401": "Missing, unknown or revoked API key, or two different keys (only with `[auth] mode = \"required\"`)",
    "404": "Unknown model (or path)",
    "405": "Method not allowed",
    "408": "The request body was not received within `server.body_timeout_seconds`",
    "413": "Request body larger than `server.max_body_bytes`",
    "431": "Request target and headers larger than `server.max_header_bytes`",
    "501": "Token counting is not available: the model's upstream has no tokenizer endpoint",
    "502": "The upstream failed or answered malformed",
    "503": "Queue full, queue wait timed out, or draining (with Retry-After)",
    "504": "The upstream timed out",
}


def _components(prefix: str, types: list[Any]) -> tuple[list[Json], Json]:
    template = "#/components/schemas/" + prefix + ".{name}"
    schemas, components = msgspec.json.schema_components(types, ref_template=template)
    return list(schemas), {f"{prefix}.{name}": schema for name, schema in components.items()}


ANTHROPIC_EVENTS = ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                    "message_delta", "message_stop", "ping", "error", "queue"]


def _event(description: str, names: list[str] | None = None) -> Json:
    """One server-sent event (the OpenAPI 3.2 convention for `text/event-stream`)."""
    event: Json = {"type": "string"}
    if names:
        event["enum"] = names
    return {
        "type": "object",
        "description": description,
        "properties": {"event": event, "data": {"type": "string"}, "id": {"type": "string"},
                       "retry": {"type": "integer"}},
    }


OPENAI_EVENT = _event("`data:` is a `chat.completion.chunk` (JSON), an `{\"error\": ...}` object after a failure, "
                      "and `[DONE]` last")
ANTHROPIC_EVENT = _event("Anthropic stream events; `queue` (`{\"type\":\"queue\",\"position\":N}`) is this "
                         "gateway's extension, sent while the request waits for a slot", ANTHROPIC_EVENTS)


def _responses(ok: Json, error: Json, error_type: str, stream: Json | None, statuses: list[str]) -> Json:
    content: Json = {"application/json": {"schema": ok}}
    if stream is not None:
        content["text/event-stream"] = {"schema": stream}
    responses: Json = {"200": {"description": "Success", "content": content}}
    for status in statuses:
        responses[status] = {"description": ERRORS[status], "content": {error_type: {"schema": error}}}
        if status == "503":
            retry = {"type": "string", "pattern": "^[0-9]+$"}
            responses[status]["headers"] = {
                "Retry-After": {"required": True, "description": "whole seconds to wait", "schema": retry}
            }
    return responses


def _operation(summary: str, tag: str, responses: Json, body: Json | None = None) -> Json:
    operation: Json = {"summary": summary, "tags": [tag], "operationId": summary.replace(" ", "_"),
                       "responses": responses}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return operation


def build_document() -> Json:
    (o_request, o_completion, o_models, o_problem), o_components = _components(
        "OpenAI", [openai.ChatCompletionRequest, openai.ChatCompletion, openai.ModelList, openai.Problem]
    )
    (a_request, a_count, a_message, a_tokens, a_models, a_error), a_components = _components(
        "Anthropic",
        [anthropic.MessagesParams, anthropic.CountTokensParams, anthropic.MessageOut, anthropic.TokenCount,
         anthropic.ModelList, anthropic.ErrorBody],
    )
    # `/v1` relays a vLLM answer byte for byte when the upstream speaks the dialect: fields
    # beyond those the gateway encodes itself (logprobs, nulls for unset members) may appear.
    o_components["OpenAI.ChatCompletion"]["additionalProperties"] = True
    for name in ("OutMessage", "OutChoice", "OutUsage"):
        _nullable_optionals(o_components[f"OpenAI.{name}"])
    problem, anthropic_error = "application/problem+json", "application/json"
    chat = llm = ["400", "401", "404", "405", "408", "413", "431", "502", "503", "504"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return {
        "openapi": "3.1.0",
        "info": {"title": "gateway", "version": version, "description": DESCRIPTION},
        "paths": {
            "/v1/chat/completions": {"post": _operation(
                "OpenAI chat completion", "openai",
                _responses(o_completion, o_problem, problem, OPENAI_EVENT, chat), o_request,
            )},
            "/v1/models": {"get": _operation(
                "OpenAI model list", "openai", _responses(o_models, o_problem, problem, None, ["401", "431"])
            )},
            "/llm/v1/messages": {"post": _operation(
                "Anthropic message", "anthropic",
                _responses(a_message, a_error, anthropic_error, ANTHROPIC_EVENT, llm), a_request,
            )},
            "/llm/v1/messages/count_tokens": {"post": _operation(
                "Anthropic token count", "anthropic",
                _responses(a_tokens, a_error, anthropic_error, None, sorted([*llm, "501"])), a_count,
            )},
            "/llm/v1/models": {"get": _operation(
                "Anthropic model list", "anthropic",
                _responses(a_models, a_error, anthropic_error, None, ["401", "431"]),
            )},
        },
        "components": {"schemas": {**o_components, **a_components}},
    }


def _nullable_optionals(schema: Json) -> None:
    """Members that are not required may also be null (vLLM writes nulls for unset members)."""
    required = set(schema.get("required", ()))
    schema["additionalProperties"] = True
    for name, prop in schema.get("properties", {}).items():
        if name not in required and "anyOf" not in prop:
            schema["properties"][name] = {"anyOf": [prop, {"type": "null"}]}


def render(document: Json) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render(build_document())
    if "--check" in argv:
        if DOCUMENT.read_text(encoding="utf-8") != text:
            print(f"{DOCUMENT.relative_to(ROOT)} is out of date: run scripts/openapi.py", file=sys.stderr)
            return 1
        return 0
    DOCUMENT.write_text(text, encoding="utf-8")
    print(f"wrote {DOCUMENT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
