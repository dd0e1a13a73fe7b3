"""Schema-driven fuzzing: schemathesis on docs/openapi.json against a live gateway.

Examples come from the documented request schemas, both valid ones and ones that break
them (schemathesis' positive and negative modes), with a fixed seed and budget. Checks:
no 5xx (`not_a_server_error`), and only documented statuses, content types, headers and
response bodies. Not checked: that every schema-breaking request is refused. The
decoders are as permissive as vLLM on purpose (a named `tool_choice` without `type`, a
text block without `type` where only text may stand), and serving those is no fault.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from tests.contract.fuzz.edge import MODEL, Edge

ROOT = Path(__file__).resolve().parents[3]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


def _document() -> dict[str, Any]:
    """The checked-in document, with `model` narrowed to the fuzzed gateway's one model:
    free strings would stop nearly every example at the router's 404."""
    document: dict[str, Any] = json.loads((ROOT / "docs" / "openapi.json").read_text(encoding="utf-8"))
    schemas = document["components"]["schemas"]
    for name in ("ChatCompletionRequest", "MessagesParams", "CountTokensParams", "CreateResponse", "CompletionRequest",
                 "EmbeddingRequest"):
        schemas[name]["properties"]["model"] = {"type": "string", "enum": [MODEL]}
    return document


schema = schemathesis.openapi.from_dict(_document())


@schema.parametrize()
@settings(max_examples=20, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_document(case: schemathesis.Case[Any], edge: Edge) -> None:
    case.call_and_validate(base_url=edge.url, checks=CHECKS, timeout=30)
