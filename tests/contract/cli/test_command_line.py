"""The `gateway` command as an operator meets it: real processes of the installed entry point.

`--help` says what the gateway is and lists the commands, `--version` the installed version.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from tests.support.processes import ROOT

GATEWAY = str(Path(sys.executable).with_name("gateway"))  # the console script of this environment
COMMANDS = {"serve", "check-config", "keys", "stub"}
ENV = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def _gateway(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GATEWAY, *args], capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=ROOT, env=ENV)


def test_help_says_what_the_gateway_is_and_lists_every_command_with_a_line() -> None:
    done = _gateway("--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps at the terminal's width
    assert "LLM API gateway" in text and "OpenAI API (/v1)" in text and "Anthropic Messages API (/llm)" in text
    assert "vLLM" in text and "admission control" in text
    assert "Composition root" not in text  # no longer the composition root's docstring
    listed = done.stdout.split("commands:")[1]
    for command in COMMANDS:
        line = next(line for line in listed.splitlines() if line.split()[:1] == [command])
        helped = line.split(command, 1)[1].strip() or listed.split(line + "\n")[1].splitlines()[0].strip()
        assert helped, f"{command} has no help line"
    assert "--version" in done.stdout


def test_each_command_has_its_own_help() -> None:
    for command in (["serve"], ["check-config"], ["keys"], ["keys", "new"], ["stub"]):
        done = _gateway(*command, "--help")
        assert done.returncode == 0 and done.stdout.startswith(f"usage: gateway {' '.join(command)}"), done.stderr


def test_version_is_the_installed_one() -> None:
    done = _gateway("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"gateway {version('gateway')}\n"


