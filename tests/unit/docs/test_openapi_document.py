"""docs/openapi.json is the app's own OpenAPI document (scripts/openapi.py dumps it): never stale."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
from litestar.testing import TestClient
from referencing import Registry
from referencing.jsonschema import DRAFT202012

ROOT = Path(__file__).resolve().parents[3]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openapi_generator", ROOT / "scripts" / "openapi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads((ROOT / "docs" / "openapi.json").read_text(encoding="utf-8"))
    return document


def _validator(document: dict[str, Any], component: str) -> jsonschema.Draft202012Validator:
    """A validator for one component, its `$ref`s resolved in the document."""
    registry: Registry[Any] = Registry().with_resource("urn:doc", DRAFT202012.create_resource(document))
    return jsonschema.Draft202012Validator({"$ref": f"urn:doc#/components/schemas/{component}"}, registry=registry)


def test_checked_in_document_matches_the_generator() -> None:
    generator = _generator()
    text = (ROOT / "docs" / "openapi.json").read_text(encoding="utf-8")
    assert text == generator.render(generator.build_document()), "run: .venv/bin/python scripts/openapi.py"


def test_the_app_serves_the_same_document_at_schema() -> None:
    generator = _generator()
    app = generator.build_app(generator.load_config_text(generator.CONFIG))
    with TestClient(app) as client:
        served = client.get("/schema/openapi.json")
    assert served.status_code == 200
    assert served.json() == _document()


def test_document_describes_every_dialect_endpoint() -> None:
    document = _document()
    assert document["openapi"].startswith("3.1")
    operations = {(path, method) for path, item in document["paths"].items() for method in item}
    assert operations == {
        ("/v1/chat/completions", "post"), ("/v1/models", "get"), ("/v1/responses", "post"),
        ("/v1/completions", "post"), ("/v1/embeddings", "post"),
        ("/llm/v1/messages", "post"), ("/llm/v1/messages/count_tokens", "post"), ("/llm/v1/models", "get"),
    }
    paths = document["paths"]
    bodies = {
        path: paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        for path in ("/v1/chat/completions", "/llm/v1/messages", "/llm/v1/messages/count_tokens")
    }
    assert bodies == {
        "/v1/chat/completions": {"$ref": "#/components/schemas/ChatCompletionRequest"},
        "/llm/v1/messages": {"$ref": "#/components/schemas/MessagesParams"},
        "/llm/v1/messages/count_tokens": {"$ref": "#/components/schemas/CountTokensParams"},
    }
    chat = paths["/v1/chat/completions"]["post"]
    assert chat["responses"]["400"]["content"]["application/problem+json"]["schema"] == {
        "$ref": "#/components/schemas/Problem"
    }
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert chat["responses"]["503"]["headers"]["Retry-After"]["required"] is True
    messages = paths["/llm/v1/messages"]["post"]
    assert messages["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"
    }
    assert "501" in paths["/llm/v1/messages/count_tokens"]["post"]["responses"]


def test_each_dialect_keeps_its_own_component_for_a_shared_name() -> None:
    schemas = _document()["components"]["schemas"]
    assert set(schemas["_shared_problem_ErrorInfo"]["required"]) == {"message", "type"}
    assert set(schemas["anthropic_schema_ErrorInfo"]["required"]) == {"message", "type"}
    assert "param" in schemas["_shared_problem_ErrorInfo"]["properties"]
    assert "has_more" in schemas["anthropic_schema_ModelList"]["properties"]


def test_a_relayed_vllm_answer_conforms() -> None:
    """`/v1` relays a vLLM answer byte for byte: its extra members, nulls and logprobs conform."""
    answer = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "prompt_logprobs": None,
        "choices": [{
            "index": 0, "finish_reason": "stop", "stop_reason": None,
            "logprobs": {"content": [{"token": "hi", "logprob": -0.1, "bytes": [104, 105], "top_logprobs": []}]},
            "message": {"role": "assistant", "content": "hi", "reasoning": None, "reasoning_content": None,
                        "tool_calls": None, "refusal": None, "annotations": None},
        }],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2, "prompt_tokens_details": None},
    }
    _validator(_document(), "ChatCompletion").validate(answer)
