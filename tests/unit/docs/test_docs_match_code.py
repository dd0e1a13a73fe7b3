"""The operator and developer docs name what the code does: the access-log fields, the dialect
registration snippet, and the Anthropic usage counters."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from domain.records import RequestRecord

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"


def _section(path: Path, heading: str) -> str:
    """The text under a Markdown heading, up to the next heading of the same or a higher level."""
    text = path.read_text(encoding="utf-8")
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    rest = text[start + len(heading) + 2:]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", rest, re.MULTILINE)]
    return rest[: ends[0]] if ends else rest


def test_every_access_log_field_is_documented() -> None:
    logs = _section(DOCS / "operations.md", "## Logs")
    fields = [field.encode_name for field in msgspec.structs.fields(RequestRecord)]
    missing = [name for name in fields if f"`{name}`" not in logs]
    assert not missing, f"docs/operations.md 'Logs' does not name the access-log fields {missing}"


def test_dialect_registration_snippet_imports_what_it_registers() -> None:
    guide = (DOCS / "adding-a-dialect.md").read_text(encoding="utf-8")
    snippet = re.search(r"## 4\. Register it.*?```python\n(.*?)```", guide, re.DOTALL)
    assert snippet is not None, "docs/adding-a-dialect.md lost its registration step"
    code = snippet.group(1)
    imported = {name.strip() for line in re.findall(r"^from adapters\.inbound import (.+)$", code, re.MULTILINE)
                for name in line.split(",")}
    registered = set(re.findall(r"([<>\w]+)\.router", code))
    assert registered, code
    assert registered <= imported, f"the snippet registers {sorted(registered - imported)} without importing them"


def test_anthropic_usage_cache_counter_is_not_denied() -> None:
    """The usage mapping sends `cache_read_input_tokens`; no section may say there is none."""
    guide = (DOCS / "dialects" / "anthropic.md").read_text(encoding="utf-8")
    assert "`cache_read_input_tokens`" in guide
    assert not re.search(r"no `?cache_\*`? counters", guide), "docs/dialects/anthropic.md denies the cache counters"
