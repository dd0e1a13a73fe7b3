"""Drive one target with one scenario: a correctness check, then wrk (or loadgen.py), then
the time-to-first-token probe. Every run is bounded in time; loopback only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from targets import MODEL

HERE = Path(__file__).resolve().parent
USER = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class Scenario:
    key: str  # "v1", "v1-stream", "llm-stream"
    label: str
    stream: bool
    anthropic: bool

    def body(self) -> bytes:
        if self.anthropic:
            return json.dumps({"model": MODEL, "max_tokens": 64, "stream": True, "messages": USER}).encode()
        body: dict[str, object] = {"model": MODEL, "messages": USER}
        if self.stream:
            body["stream"] = True
        return json.dumps(body, separators=(",", ":")).encode()


SCENARIOS = [
    Scenario("v1", "/v1 non-stream", stream=False, anthropic=False),
    Scenario("v1-stream", "/v1 stream", stream=True, anthropic=False),
    Scenario("llm-stream", "/llm stream", stream=True, anthropic=True),
]


def path_for(scenario: Scenario, messages_path: str | None) -> str | None:
    """The route a target serves the scenario on, or None (direct/nginx have no Messages API)."""
    return messages_path if scenario.anthropic else "/v1/chat/completions"


def check(url: str, scenario: Scenario, headers: dict[str, str]) -> tuple[bool, str]:
    """One request, its answer checked: did the target really answer this scenario?"""
    request = urllib.request.Request(url, data=scenario.body(), method="POST",
                                     headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, text = response.status, response.read().decode(errors="replace")
    except OSError as exc:
        return False, f"request failed: {exc}"
    if status != 200:
        return False, f"HTTP {status}"
    if scenario.anthropic:
        ok = "message_stop" in text and "text_delta" in text
    elif scenario.stream:
        ok = "data: [DONE]" in text and '"content"' in text
    else:
        try:
            ok = bool(json.loads(text)["choices"][0]["message"]["content"])
        except (ValueError, LookupError, TypeError):
            ok = False
    return ok, "ok" if ok else f"unexpected answer: {text[:200]!r}"


def wrk_binary() -> str | None:
    return shutil.which("wrk")


WRK_LUA = """\
wrk.method = "POST"
wrk.body = [==[{body}]==]
wrk.headers["Content-Type"] = "application/json"
{headers}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCHJSON {{"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50_us":%d,"p99_us":%d}}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def _pinned(cpus: set[int] | None) -> Callable[[], None] | None:
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def run_wrk(url: str, scenario: Scenario, headers: dict[str, str], concurrency: int, seconds: float,
            workdir: Path, cpus: set[int] | None) -> dict[str, object]:
    binary = wrk_binary()
    assert binary is not None
    lua = workdir / f"wrk-{scenario.key}-{abs(hash(tuple(headers.items()))) % 10**8}.lua"
    lua.write_text(WRK_LUA.format(body=scenario.body().decode(), headers="\n".join(
        f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())))
    threads = 1 if cpus and len(cpus) == 1 else min(2, concurrency)
    duration = max(1, round(seconds))
    argv = [binary, f"-t{threads}", f"-c{concurrency}", f"-d{duration}s", "--timeout", "10s",
            "-s", str(lua), url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 30,
                          preexec_fn=_pinned(cpus))
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("BENCHJSON ")), None)
    if line is None:
        return {"driver": "wrk", "ok": 0, "errors": 1, "rps": 0.0, "failure": (done.stdout + done.stderr)[-500:]}
    raw = json.loads(line.removeprefix("BENCHJSON "))
    seconds_run = raw["duration_us"] / 1e6
    socket_errors = raw["connect"] + raw["read"] + raw["write"] + raw["timeout"]
    ok = raw["requests"] - raw["status"]
    return {
        "driver": "wrk", "requests": raw["requests"], "ok": ok, "errors": raw["status"] + socket_errors,
        "seconds": seconds_run, "rps": ok / seconds_run if seconds_run else 0.0,
        "p50_ms": raw["p50_us"] / 1000, "p99_ms": raw["p99_us"] / 1000,
    }


def loadgen_process(url: str, scenario: Scenario, headers: dict[str, str], concurrency: int, seconds: float,
                    cpus: set[int] | None) -> subprocess.Popen[str]:
    argv = [sys.executable, str(HERE / "loadgen.py"), "--url", url, "--body", scenario.body().decode(),
            "--concurrency", str(concurrency), "--duration", str(seconds)]
    for name, value in headers.items():
        argv += ["--header", f"{name}: {value}"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_pinned(cpus))


def collect(proc: subprocess.Popen[str], seconds: float) -> dict[str, object]:
    try:
        out, err = proc.communicate(timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    except BaseException:  # Ctrl-C: the load generator must not outlive the harness
        proc.kill()
        proc.wait()
        raise
    try:
        return dict(json.loads(out.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {"driver": "loadgen", "ok": 0, "errors": 1, "rps": 0.0, "failure": err[-500:]}


def run_load(url: str, scenario: Scenario, headers: dict[str, str], concurrency: int, seconds: float,
             workdir: Path, cpus: set[int] | None, driver: str) -> dict[str, object]:
    if driver == "wrk":
        return run_wrk(url, scenario, headers, concurrency, seconds, workdir, cpus)
    return collect(loadgen_process(url, scenario, headers, concurrency, seconds, cpus), seconds)


def probe_ttft(url: str, scenario: Scenario, headers: dict[str, str], concurrency: int, seconds: float,
               workdir: Path, cpus: set[int] | None, driver: str) -> dict[str, object]:
    """TTFT seen by one probe client while the load generator holds concurrency - 1 connections
    (so the target has exactly `concurrency` requests in flight, as in the throughput run)."""
    probe = loadgen_process(url, scenario, headers, 1, seconds, cpus)
    try:
        if concurrency > 1:
            run_load(url, scenario, headers, concurrency - 1, seconds, workdir, cpus, driver)
        return collect(probe, seconds)
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
