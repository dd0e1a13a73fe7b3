"""Real processes for end-to-end tests: the stub upstream and the gateway, on loopback."""

from __future__ import annotations

import atexit
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
OPS_LINE = re.compile(r"gateway ops listening on http://\S+?:(\d+)")
TOGETHER = 4  # processes started at once by `Processes.together`: both cores busy, no pile-up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    # Tests say which telemetry they want: none leaks in from the caller's environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    port: int
    output: Path
    extra: dict[str, object] = field(default_factory=dict)
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ops_port(self) -> int | None:
        """A gateway's ops listener port, from the line it printed at start (None before it)."""
        port = self.extra.get("ops_port")
        if isinstance(port, int):
            return port
        match = OPS_LINE.search(self.text())
        if match is None:
            return None
        found = self.extra["ops_port"] = int(match.group(1))
        return found

    @property
    def ops_url(self) -> str:
        """The ops listener (metrics, health, status) of a gateway."""
        port = self.ops_port
        assert port is not None, f"the gateway printed no ops listener line:\n{self.text()[-2000:]}"
        return f"http://127.0.0.1:{port}"

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stop(self) -> None:
        self.signal(signal.SIGTERM)
        self.wait_stopped()

    def wait_stopped(self, timeout: float = 10.0) -> None:
        """Wait for the process to exit (after `signal`), killing it after `timeout` seconds."""
        try:
            self.popen.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=5)


class _Exiting:
    """Processes told to stop (SIGTERM) whose exit nobody waits for at once: a gateway takes about
    half a second to shut down (uvicorn's ticks and pauses, then the interpreter's exit), time the
    next test can use. Each is reaped later, and killed if it takes more than 10 s; all of them
    before the next process on a port given in advance, and before the test run ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: list[tuple[Proc, float]] = []  # (proc, when to kill it)

    def add(self, procs: Iterable[Proc]) -> None:
        with self._lock:
            self._procs += [(proc, time.monotonic() + 10.0) for proc in procs]
        self.reap(wait=False)

    def reap(self, *, wait: bool) -> None:
        """Collect those that have exited (and kill those past their time); with `wait`, all."""
        with self._lock:
            pending, self._procs = self._procs, []
        for proc, kill_at in pending:
            if wait or time.monotonic() > kill_at:
                proc.wait_stopped(kill_at - time.monotonic())
            elif proc.popen.poll() is None:
                with self._lock:
                    self._procs.append((proc, kill_at))


EXITING = _Exiting()
atexit.register(EXITING.reap, wait=True)


def wait_http(url: str, proc: subprocess.Popen[bytes], output: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}:\n{output.read_text(errors='replace')}")
        try:
            with urllib.request.urlopen(url, timeout=0.5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.01)  # a refused connect costs next to nothing: find the process ready soon
    raise RuntimeError(f"{url} not ready after {timeout}s:\n{output.read_text(errors='replace')}")


class Processes:
    """Starts processes and stops every one of them at teardown."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[Proc] = []
        self._numbers = itertools.count(1)  # file names; `together` starts from several threads
        self._lock = threading.Lock()
        self._picked: set[int] = set()  # ports handed out here: two starts at once never share one

    def together(self, starts: Iterable[Callable[[], Proc]]) -> list[Proc]:
        """Run several `stub(...)`/`gateway(...)` calls at once (e.g. `functools.partial(procs.stub,
        "--hold", "1")`), each still waiting until its process answers; their Procs in order.
        For processes that do not need one another: a gateway needs its stubs' URLs first."""
        calls = list(starts)
        with ThreadPoolExecutor(min(TOGETHER, len(calls) or 1)) as pool:
            futures = [pool.submit(call) for call in calls]
            return [future.result() for future in futures]

    def _free_port(self) -> int:
        with self._lock:
            while (port := free_port()) in self._picked:
                pass
            self._picked.add(port)
            return port

    def _spawn(self, name: str, argv: list[str], port: int, health: str,
               env: dict[str, str] | None = None, host: str = "127.0.0.1") -> Proc:
        output = self.workdir / f"{next(self._numbers):02d}-{name}.out"
        handle = output.open("wb")
        popen = subprocess.Popen(
            argv, stdout=handle, stderr=subprocess.STDOUT, env={**_env(), **(env or {})}, cwd=ROOT
        )
        handle.close()
        proc = Proc(popen, port, output, host=host)
        self.procs.append(proc)
        wait_http(f"http://{host}:{port}{health}", popen, output)
        return proc

    def _spawn_on_free_port(self, start: Callable[[int], Proc], port: int | None) -> Proc:
        """`start(port)`; with no port given, a free one, and another if the one picked was
        taken before the process bound it (an outgoing connection's ephemeral port, or another
        listener's `:0`, the gateway's own ops listener's included, can land on it in between):
        up to 3 tries."""
        if port is not None:
            EXITING.reap(wait=True)  # a process of an earlier test may still hold that port
            return start(port)
        for attempt in range(3):
            try:
                return start(self._free_port())
            except RuntimeError as error:
                if "address already in use" not in str(error).lower() or attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def stub(self, *args: str, log: str | Path | None = None, port: int | None = None,
             host: str = "127.0.0.1") -> Proc:
        """`host`: another loopback address (127.0.0.2, ...) for replicas on one port."""
        def start(port: int) -> Proc:
            argv = [sys.executable, "-m", "cli", "stub", "--listen", f"{host}:{port}", *args]
            if log is not None:
                argv += ["--log", str(log)]
            return self._spawn("stub", argv, port, "/health", host=host)

        proc = self._spawn_on_free_port(start, port)
        proc.extra["log"] = log
        return proc

    def gateway(self, toml: str, *, port: int | None = None, server_extra: str = "",
                launcher: list[str] | None = None, env: dict[str, str] | None = None,
                ops_listen: str = "127.0.0.1:0") -> Proc:
        """Start `gateway serve` on a config whose [server] listen is filled in here.

        `server_extra` is more `[server]` keys (TOML lines); `launcher` replaces the
        `gateway serve` command line (it is given `--config PATH`). The ops listener takes
        a free port (`proc.ops_url`), unless `toml` has an `[ops]` table of its own.
        """
        def start(port: int) -> Proc:
            config = self.workdir / f"gateway-{next(self._numbers)}.toml"
            ops = "" if "[ops]" in toml else f'\n[ops]\nlisten = "{ops_listen}"\n'
            config.write_text(f'[server]\nlisten = "127.0.0.1:{port}"\n{server_extra}\n' + toml + ops)
            command = launcher or [sys.executable, "-m", "cli", "serve"]
            proc = self._spawn("gateway", [*command, "--config", str(config)], port, "/healthz", env)
            if proc.ops_port == port:
                # The ops listener binds first, on `:0`, and the system can give it the port just
                # picked (and freed) for the main one: /healthz answered from ops, the main failed.
                proc.stop()
                raise RuntimeError("address already in use: the ops listener took the main port")
            proc.extra["config"] = config
            return proc

        return self._spawn_on_free_port(start, port)

    def stop_all(self, *, wait: bool = False) -> None:
        """SIGTERM to every process at once (the last started first). Their exits are waited for
        later (`EXITING`), or with `wait` here, all at once: when their output is read next, or
        what they talk to is stopped next."""
        for proc in reversed(self.procs):
            proc.signal(signal.SIGTERM)
        if not wait:
            EXITING.add(reversed(self.procs))
            return
        for proc in reversed(self.procs):
            proc.wait_stopped()


def upstream_toml(name: str, url: str, models: list[str], admission: dict[str, float] | None = None,
                  extra: str = "") -> str:
    """A `[upstreams.NAME]` table (plus its admission table) as TOML text."""
    model_list = ", ".join(f'"{m}"' for m in models)
    text = f'\n[upstreams.{name}]\nurl = "{url}"\nmodels = [{model_list}]\n{extra}'
    if admission is not None:
        text += f"\n[upstreams.{name}.admission]\n" + "".join(f"{k} = {v}\n" for k, v in admission.items())
    return text
