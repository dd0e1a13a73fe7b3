"""A real vLLM for contract tests: vLLM's CPU build in `.venv-vllm`, serving a tiny local model.

`scripts/ensure-vllm` installs it (first use only); `vllm/make_model.py` makes the model at test
time (seeded, nothing downloaded); `vllm/launch.py` starts `vllm serve` with the flags a
production deployment uses. Nothing here skips: a vLLM that cannot be installed or started
fails the tests that need it, with the reason.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import ROOT, free_port

VENV = ROOT / ".venv-vllm"
PYTHON = VENV / "bin" / "python"
HERE = Path(__file__).resolve().parent / "vllm"
MODEL = "tiny"
REASONING_MODEL = "thinking"  # the name the server with a reasoning parser serves
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 4
STARTUP_SECONDS = 420.0  # 35-70 s alone on 2 cores; several at once, beside other tests, take longer

# What a production deployment runs with (docs/operations.md, "vLLM flags").
PRODUCTION_FLAGS = (
    "--dtype", "float32",
    "--max-model-len", str(MAX_MODEL_LEN),
    "--max-num-seqs", str(MAX_NUM_SEQS),
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
    "--enable-log-requests",
)
REASONING_FLAGS = (
    "--reasoning-parser", "deepseek_r1",
    "--default-chat-template-kwargs", '{"enable_thinking": true}',
)

_GAUGE = re.compile(r"^(vllm:num_requests_(?:running|waiting))\{[^}]*\} ([0-9.e+-]+)$", re.MULTILINE)


def gauges_at(url: str) -> dict[str, float]:
    """vLLM's own scheduler gauges at `url`, summed over engines: running and waiting now."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        page = response.read().decode()
    totals: dict[str, float] = {}
    for name, value in _GAUGE.findall(page):
        key = name.removeprefix("vllm:num_requests_")
        totals[key] = totals.get(key, 0.0) + float(value)
    return totals


class GaugeWatch:
    """vLLM's scheduler gauges sampled every 50 ms while a `with` block runs: `peak("running")`,
    `peak("waiting")`. The sampler is a process of its own: in the test's process, the SDK
    clients reading a dozen fast streams starve any thread of the interpreter lock for
    seconds at a time, the whole load long."""

    def __init__(self, server: VllmServer) -> None:
        self.server = server
        self.seen: list[dict[str, float]] = []
        self._out = server.log.with_name(f"gauges-{time.monotonic_ns()}.jsonl")
        self._sampler: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GaugeWatch:
        self._sampler = subprocess.Popen([sys.executable, "-m", "tests.support.real_vllm", self.server.url,
                                          str(self._out)], cwd=ROOT)  # fmt: skip
        for _ in range(200):  # the first sample is taken before the block starts
            if self._out.exists() and self._out.read_text().count("\n"):
                break
            time.sleep(0.025)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._sampler is not None
        self._sampler.terminate()
        self._sampler.wait(timeout=10)
        self.seen = [json.loads(line) for line in self._out.read_text().splitlines() if line.endswith("}")]
        self.seen.append(self.server.gauges())

    def peak(self, name: str) -> float:
        return max(g.get(name, 0.0) for g in self.seen)


def _sample_forever(url: str, out: Path) -> None:
    """The sampler process: a JSON line of gauges every 50 ms, for at most 10 minutes."""
    with out.open("a") as lines:
        for _ in range(12_000):
            lines.write(json.dumps(gauges_at(url)) + "\n")
            lines.flush()
            time.sleep(0.05)


def ensure_installed() -> None:
    """Install vLLM's CPU build into .venv-vllm unless it is there; fail with pip's words."""
    done = subprocess.run([str(ROOT / "scripts" / "ensure-vllm")], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/ensure-vllm failed ({done.returncode}):\n{done.stderr[-4000:]}")


def make_model(out: Path) -> Path:
    done = subprocess.run([str(PYTHON), str(HERE / "make_model.py"), str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"making the tiny model failed:\n{done.stderr[-4000:]}")
    return out


@dataclass
class VllmServer:
    """One `vllm serve` process on loopback."""

    popen: subprocess.Popen[bytes]
    port: int
    log: Path
    flags: tuple[str, ...]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = STARTUP_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.popen.returncode}:\n{self.text()[-6000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"vllm serve not ready after {timeout:.0f}s:\n{self.text()[-6000:]}")

    def gauges(self) -> dict[str, float]:
        return gauges_at(self.url)

    def post(self, path: str, body: dict[str, object], timeout: float = 60) -> dict[str, object]:
        """A request straight to vLLM (to compare with what the gateway relays)."""
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer: dict[str, object] = json.loads(response.read())
            return answer

    def post_status(self, path: str, body: dict[str, object]) -> tuple[int, object]:
        """A request straight to vLLM that may be refused: (status, JSON body)."""
        try:
            return 200, self.post(path, body)
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read())

    def stop(self) -> None:
        """Stop the server and its engine processes (its own process group)."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)


class Fleet:
    """The vLLM servers of the vLLM tests, all started together on first use (they take a
    minute each to start; together they take little longer) and stopped after them:
    `main` and `replica` (the same model and flags: two replicas of one upstream) and
    `reasoning` (with a reasoning parser, serving the model as `thinking`)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.servers: dict[str, VllmServer] = {}

    def __getitem__(self, name: str) -> VllmServer:
        if not self.servers:
            ensure_installed()
            model = make_model(self.workdir / "model")
            self.servers = {
                "main": start(model, self.workdir / "vllm-main.log"),
                "replica": start(model, self.workdir / "vllm-replica.log"),
                "reasoning": start(model, self.workdir / "vllm-reasoning.log", *REASONING_FLAGS, name=REASONING_MODEL),
            }
        server = self.servers[name]
        if server.popen.poll() is not None:  # killed by a test: started again, as it was
            model = self.workdir / "model"
            extra = server.flags[len(PRODUCTION_FLAGS):]
            served = REASONING_MODEL if name == "reasoning" else MODEL
            server = self.servers[name] = start(model, server.log.with_suffix(".again.log"), *extra, name=served)
        server.wait_ready()
        return server

    def name_of(self, server: VllmServer) -> str:
        return next(name for name, known in self.servers.items() if known is server)

    def kill(self, name: str) -> None:
        """SIGKILL a server and its engine processes at once, as a node that dies (the next use
        of `name` starts it again)."""
        server = self.servers[name]
        os.killpg(server.popen.pid, signal.SIGKILL)
        server.popen.wait(timeout=30)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


def start(model: Path, log: Path, *extra: str, name: str = MODEL) -> VllmServer:
    """Start `vllm serve` (without waiting for it: several can start at once)."""
    port = free_port()
    flags = (*PRODUCTION_FLAGS, *extra)
    argv = [str(PYTHON), str(HERE / "launch.py"), "serve", str(model), "--served-model-name", name,
            "--host", "127.0.0.1", "--port", str(port), *flags]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VLLM_"))}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    handle = log.open("wb")
    popen = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=log.parent,
                             start_new_session=True)
    handle.close()
    return VllmServer(popen, port, log, flags)


if __name__ == "__main__":
    _sample_forever(sys.argv[1], Path(sys.argv[2]))
