"""docs/openapi.json is what scripts/openapi.py makes from the wire types: never stale."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openapi_generator", ROOT / "scripts" / "openapi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_document_matches_the_generator() -> None:
    generator = _generator()
    text = (ROOT / "docs" / "openapi.json").read_text(encoding="utf-8")
    assert text == generator.render(generator.build_document()), "run: .venv/bin/python scripts/openapi.py"


def test_document_describes_every_dialect_endpoint() -> None:
    document = json.loads((ROOT / "docs" / "openapi.json").read_text(encoding="utf-8"))
    assert document["openapi"].startswith("3.1")
    operations = {(path, method) for path, item in document["paths"].items() for method in item}
    assert operations == {
        ("/v1/chat/completions", "post"), ("/v1/models", "get"), ("/llm/v1/messages", "post"),
        ("/llm/v1/messages/count_tokens", "post"), ("/llm/v1/models", "get"),
    }
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/OpenAI.ChatCompletionRequest"
    }
    assert "application/problem+json" in chat["responses"]["400"]["content"]
    assert "Retry-After" in chat["responses"]["503"]["headers"]
    messages = document["paths"]["/llm/v1/messages"]["post"]
    assert messages["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Anthropic.ErrorBody"
    }
