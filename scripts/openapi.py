#!/usr/bin/env python3
"""Write docs/openapi.json: the gateway app's own OpenAPI document, as Litestar makes it.

The schemas come from the wire Structs declared on the dialect handlers
(`adapters/inbound/_shared/openapi.py`); the app serves the same document at `/schema`.
`tests/unit/docs/test_openapi_document.py` fails when the checked-in file and this
script disagree; `tests/contract/fuzz/test_schemathesis.py` runs schemathesis on it
against a live gateway.

    .venv/bin/python scripts/openapi.py          # rewrite docs/openapi.json
    .venv/bin/python scripts/openapi.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = ROOT / "docs" / "openapi.json"
sys.path.insert(0, str(ROOT / "src"))

from bootstrap import build_app  # noqa: E402
from config import load_config_text  # noqa: E402

# The smallest valid configuration: the document does not depend on upstreams or limits.
CONFIG = """\
[upstreams.u]
url = "http://127.0.0.1:9"
models = ["m"]
admission = { sequence_slots = 2, max_in_flight = 1, queue_depth = 0, queue_timeout_seconds = 1 }
"""


def build_document() -> dict[str, Any]:
    schema: dict[str, Any] = build_app(load_config_text(CONFIG)).app.openapi_schema.to_schema()
    return schema


def render(document: dict[str, Any]) -> str:
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
