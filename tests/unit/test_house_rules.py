"""House rules a reader relies on: modules short enough to read in one sitting, and words that
say what a thing is rather than which ticket brought it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC_LIMIT = 300  # every module under src/ (docs/style: one idea per module)
CODE_LIMIT = 400  # every other file of the project's own code: tests, bench, scripts, deploy
# Our own work-tracking references; an upstream project's ("vLLM #12345", "LiteLLM #40404") are
# citations a reader can follow, and CLI flags such as `--seed 0` are not references at all.
_TICKET = re.compile(r"(?<![-\w])(?:issues?|seeds?|sessions?|tickets?)\s+#?\d+(?:\.\d+)?\b", re.IGNORECASE)


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", *patterns], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_src_modules_are_at_most_300_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _tracked("src/*.py") if (n := _lines(p)) > SRC_LIMIT}
    assert not long, f"modules over {SRC_LIMIT} lines: {long}"


def test_no_code_file_is_over_400_lines() -> None:
    files = _tracked("*.py", "*.lua", "*.sh", "scripts/*", "bench/run", ".ci/*")
    long = {str(p.relative_to(ROOT)): n for p in files if (n := _lines(p)) > CODE_LIMIT}
    assert not long, f"files over {CODE_LIMIT} lines: {long}"


def test_no_ticket_numbers_in_code_tests_or_docs() -> None:
    files = [p for p in _tracked("*.py", "*.md", "*.lua", "*.toml", "*.yaml", "*.yml", "*.json", "scripts/*",
                                 "bench/run", ".ci/*", "Dockerfile", "deploy/*")
             if p.suffix not in {".lock"}]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
            for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if _TICKET.search(line)]
    assert not hits, "say what a thing is, not which ticket brought it:\n" + "\n".join(hits[:40])
