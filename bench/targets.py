"""The processes under test: stub upstream and our gateway (peers.py: nginx, the ceiling, LiteLLM),
all on loopback.

Every process is started in its own session and stopped by `Procs.stop_all()` (the harness
calls it in a `finally`, also on Ctrl-C and SIGTERM). Nothing here talks to anything but
127.0.0.1.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
LITELLM_VENV = ROOT / "bench" / ".venv-litellm"
RUNTIME_VENV = ROOT / "bench" / ".venv-runtime"  # requirements.runtime.lock only, made by bench/run
MODEL = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def litellm_binary() -> Path | None:
    path = LITELLM_VENV / "bin" / "litellm"
    return path if os.access(path, os.X_OK) else None


@dataclass
class Target:
    """One thing the load generator drives: a base URL, its process and its routes."""

    name: str
    url: str
    proc: subprocess.Popen[bytes] | None
    log: Path
    headers: dict[str, str] = field(default_factory=dict)
    messages_path: str | None = None  # streaming Anthropic Messages route, if the target has one

    def pids(self) -> list[int]:
        """The process and its descendants (nginx workers, uvicorn children)."""
        if self.proc is None:
            return []
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*/children"):
                try:
                    todo += [int(c) for c in task.read_text().split()]
                except OSError:
                    pass
        return found


def _status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mb(pids: list[int]) -> float:
    """Sum of VmHWM (peak resident set) over the processes, in MiB."""
    return sum(_status_kb(pid, "VmHWM") for pid in pids) / 1024


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, IndexError, ValueError):
            pass
    return total


CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine_busy_ticks() -> int:
    """Busy CPU time of the whole machine (all processes), from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # minus idle and iowait


def own_ticks() -> float:
    """CPU time of this process and its reaped children (wrk, loadgen.py)."""
    times = os.times()
    return (times.user + times.system + times.children_user + times.children_system) * CLK_TCK


class Background:
    """CPU used during a run by processes that are not part of the benchmark (other work on a
    shared machine), in percent of one core: a run with a high figure is not trustworthy."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = sorted(set(pids))
        self.start = (time.monotonic(), machine_busy_ticks(), cpu_ticks(self.pids), own_ticks())

    def percent(self) -> float:
        wall, busy, ours, own = self.start
        elapsed = time.monotonic() - wall
        other = (machine_busy_ticks() - busy) - (cpu_ticks(self.pids) - ours) - (own_ticks() - own)
        return max(0.0, 100.0 * other / (elapsed * CLK_TCK)) if elapsed > 0 else 0.0


def wait_quiet(pids: list[int], threshold: float, limit: float) -> float:
    """Wait (at most `limit` s) for half a second in which the rest of the machine uses less
    than `threshold` % of a core; returns the seconds waited."""
    began = time.monotonic()
    while time.monotonic() - began < limit:
        background = Background(pids)
        time.sleep(0.5)
        if background.percent() < threshold:
            break
    return time.monotonic() - began


def settle(pids: list[int], limit: float = 5.0) -> None:
    """Wait (at most `limit` s) until the processes are idle: leftover work must not leak
    into the next target's measurement on the same core."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        before = cpu_ticks(pids)
        time.sleep(0.2)
        if cpu_ticks(pids) - before <= 1:
            return


class Procs:
    """Starts processes (optionally pinned to CPUs) and stops every one of them."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, argv: list[str], cpus: set[int] | None, env: dict[str, str] | None = None,
              ) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            pin: Callable[[], None] | None = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env or _env(), cwd=self.workdir, start_new_session=True,
                                    preexec_fn=pin)  # only sets the CPU affinity
        self.started.append(proc)
        return proc, log

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in reversed(self.started):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=5)
        self.started.clear()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # its own session: the group holds only what it started
    except ProcessLookupError:
        pass


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float,
               headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"exited with status {proc.returncode}: {tail}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s (log: {log})")


def start_stub(procs: Procs, cpus: set[int] | None, tokens: int, chunk_delay: float = 0.0,
               name: str = "stub") -> Target:
    port = free_port()
    argv = [sys.executable, "-m", "stub", "--listen", f"127.0.0.1:{port}", "--hold", "0", "--tokens", str(tokens)]
    if chunk_delay:
        argv += ["--chunk-delay", str(chunk_delay)]
    proc, log = procs.spawn(name, argv, cpus)
    wait_ready(f"http://127.0.0.1:{port}/health", proc, log, 20)
    return Target("direct", f"http://127.0.0.1:{port}", proc, log)


def gateway_python() -> str:
    """The interpreter the gateway runs on: BENCH_GATEWAY_PYTHON, else the runtime venv (the
    packages of the container image) if bench/run built it from the current lock, else this
    one (the dev venv)."""
    if os.environ.get("BENCH_GATEWAY_PYTHON"):
        return os.environ["BENCH_GATEWAY_PYTHON"]
    runtime = RUNTIME_VENV / "bin" / "python"
    lock = hashlib.sha256((ROOT / "requirements.runtime.lock").read_bytes()).hexdigest()[:16]
    current = (RUNTIME_VENV / f".installed-{lock}").exists()  # bench/run's stamp: built from this lock
    return str(runtime) if current and os.access(runtime, os.X_OK) else sys.executable


def server_extra() -> str:
    """BENCH_GATEWAY_SERVER: lines added to the gateway's `[server]` table, for an A/B of one
    setting (e.g. `starts_per_loop_turn = 0`); empty by default."""
    extra = os.environ.get("BENCH_GATEWAY_SERVER", "").strip()
    return extra + "\n" if extra else ""


def start_gateway(procs: Procs, cpus: set[int] | None, stub_url: str, name: str = "gateway",
                  wrap: tuple[str, ...] = ()) -> Target:
    """`wrap`: a command the gateway runs under (bench/cpu_cost.py: valgrind)."""
    port = free_port()
    config = procs.workdir / f"{name}.toml"
    # BENCH_GATEWAY_WORKERS=N: N processes sharing one cap on the Redis ledger (scaling with
    # processes); the upstream then has an admission table (a cap far above the load).
    workers = os.environ.get("BENCH_GATEWAY_WORKERS")
    shared, admission = "", ""
    if workers:
        redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
        shared = f'workers = {int(workers)}\n\n[admission]\nbackend = "redis"\nredis_url = "{redis_url}"\n'
        shared += 'key_prefix = "bench"\n'
        admission = (
            "[upstreams.stub.admission]\nsequence_slots = 1025\nmax_in_flight = 1024\n"
            "queue_depth = 1024\nqueue_timeout_seconds = 30\n"
        )
    # BENCH_GATEWAY_RESUME=tokens|off: the stub is the one replica of an `[endpoints]` table, with
    # stream resume on (token ids asked for, every chunk decoded) or off: what resume costs.
    resume = os.environ.get("BENCH_GATEWAY_RESUME")
    if resume:
        admission = (
            "[upstreams.stub.admission]\nsequence_slots = 1025\nmax_in_flight = 1024\n"
            "queue_depth = 1024\nqueue_timeout_seconds = 30\n"
            f'[upstreams.stub.endpoints]\nurls = ["{stub_url}"]\nsequence_slots = 1024\nmax_in_flight = 1024\n'
            f'load_metrics = false\naffinity = "off"\nresume = "{resume}"\n'
        )
    config.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\naccess_log = false\n{server_extra()}{shared}\n'
        '[ops]\nlisten = "127.0.0.1:0"\n\n'  # several gateways at once: each its own ops port
        f'[upstreams.stub]\nurl = "{stub_url}"\nmodels = ["{MODEL}"]\n{admission}'
    )
    argv = [*wrap, gateway_python(), "-m", "cli", "serve", "--config", str(config)]
    proc, log = procs.spawn(name, argv, cpus)
    wait_ready(f"http://127.0.0.1:{port}/healthz", proc, log, 600 if wrap else 30)
    return Target("ours", f"http://127.0.0.1:{port}", proc, log, messages_path="/llm/v1/messages")


def start_keyed_gateway(procs: Procs, cpus: set[int] | None, stub_url: str, name: str = "keyed",
                        wrap: tuple[str, ...] = ()) -> Target:
    """`ours` with API keys required and a consumer with request and token limits far above
    the load: every request is authenticated, reserves and settles (what keys and limits add)."""
    key = "gw_0be5c4ed_" + "k" * 43  # a fixed, well-formed key: bench only
    keys = procs.workdir / "keys.toml"
    digest = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    keys.write_text(f'[consumers.bench]\nkeys = ["{digest}"]\nrequests_per_minute = 1000000000\n'
                    "tokens_per_minute = 1000000000000\n")
    port = free_port()
    config = procs.workdir / f"{name}.toml"
    config.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\naccess_log = false\n{server_extra()}\n'
        '[ops]\nlisten = "127.0.0.1:0"\n\n'
        f'[auth]\nmode = "required"\nkeys_file = "{keys}"\n\n'
        f'[upstreams.stub]\nurl = "{stub_url}"\nmodels = ["{MODEL}"]\n'
    )
    argv = [*wrap, gateway_python(), "-m", "cli", "serve", "--config", str(config)]
    proc, log = procs.spawn(name, argv, cpus)
    wait_ready(f"http://127.0.0.1:{port}/healthz", proc, log, 600 if wrap else 30)
    return Target("keyed", f"http://127.0.0.1:{port}", proc, log, headers={"authorization": f"Bearer {key}"},
                  messages_path="/llm/v1/messages")
