"""Private Redis deployments on loopback for the HA tests: a 3-master cluster, and a
master + replica watched by three sentinels. Free ports; everything stopped at the end."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.processes import free_port


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _wait(port: int, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not _ping(port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} on port {port} did not start")
        time.sleep(0.05)


class _Servers:
    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is required (scripts/ensure-redis installs it)"
        self.binary, self.workdir = binary, workdir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def _start(self, port: int, *args: str, sentinel: bool = False) -> None:
        where = self.workdir / str(port)
        where.mkdir(parents=True, exist_ok=True)
        if sentinel:
            conf = where / "sentinel.conf"
            conf.write_text("".join(line + "\n" for line in args))
            argv = [self.binary, str(conf), "--sentinel", "--port", str(port), "--bind", "127.0.0.1"]
        else:
            argv = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--dir", str(where), *args]
        self.procs[port] = subprocess.Popen(argv, stdout=(where / "log").open("wb"), stderr=subprocess.STDOUT)
        _wait(port, "redis-server" if not sentinel else "redis-sentinel")

    def kill(self, port: int) -> None:
        proc = self.procs[port]
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)

    def stop(self) -> None:
        for port in list(self.procs):
            self.kill(port)


class RedisCluster(_Servers):
    """Three masters (no replicas), slots spread by `redis-cli --cluster create`."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        super().__init__(workdir)
        self.ports = [free_port() for _ in range(masters)]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self) -> None:
        for port in self.ports:
            self._start(port, "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                        "--cluster-node-timeout", "2000",
                        "--cluster-port", str(free_port()))  # the default, port + 10000, may be past 65535
        cli = shutil.which("redis-cli")
        assert cli, "redis-cli is required"
        subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                        "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 20
        while True:
            info = subprocess.run([cli, "-p", str(self.ports[0]), "cluster", "info"], capture_output=True,
                                  text=True, timeout=10).stdout
            if "cluster_state:ok" in info:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not become ok:\n{info}")
            time.sleep(0.1)


class RedisSentinels(_Servers):
    """A master, one replica, and three sentinels watching the master as `name`."""

    def __init__(self, workdir: Path, name: str = "gateway") -> None:
        super().__init__(workdir)
        self.name = name
        self.master, self.replica = free_port(), free_port()
        self.sentinels = [free_port() for _ in range(3)]

    def start(self) -> None:
        self._start(self.master)
        self._start(self.replica, "--replicaof", "127.0.0.1", str(self.master))
        for port in self.sentinels:
            self._start(port, f"sentinel monitor {self.name} 127.0.0.1 {self.master} 2",
                        f"sentinel down-after-milliseconds {self.name} 1000",
                        f"sentinel failover-timeout {self.name} 5000",
                        f"sentinel parallel-syncs {self.name} 1", sentinel=True)
        cli = shutil.which("redis-cli")
        assert cli
        deadline = time.monotonic() + 20  # the replica has synced and every sentinel knows it
        while True:
            done = all(
                "num-slaves" in (out := subprocess.run(
                    [cli, "-p", str(port), "sentinel", "master", self.name], capture_output=True, text=True,
                    timeout=5).stdout) and out.split("num-slaves\n", 1)[1].split("\n", 1)[0].strip() == "1"
                for port in self.sentinels)
            if done:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels never saw the replica")
            time.sleep(0.2)

    def current_master(self) -> int:
        cli = shutil.which("redis-cli")
        assert cli
        out = subprocess.run([cli, "-p", str(self.sentinels[0]), "sentinel", "get-master-addr-by-name", self.name],
                             capture_output=True, text=True, timeout=5).stdout.split()
        return int(out[1])
