"""The ops listener (`[ops] listen`): metrics, health and status off the public port.

Real gateway processes: the public port no longer serves `/metrics` (Litestar's plain
404), the ops port serves it with the gateway's families; a taken ops port stops startup
naming `[ops] listen`; with `workers = 2` a scrape through EITHER worker counts both
workers' requests (which worker holds a connection is read from /proc, so the test knows
it scraped through each).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes, free_port, upstream_toml

CAP = {"sequence_slots": 3, "max_in_flight": 2, "queue_depth": 4, "queue_timeout_seconds": 30}
CHAT = {"model": "plain", "messages": [{"role": "user", "content": "hi"}]}


def test_metrics_only_on_the_ops_port_health_on_both(procs: Processes) -> None:
    stub = procs.stub()
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], CAP)
                       + upstream_toml("plain", procs.stub().url, ["plain"]))
    assert httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT).status_code == 200
    public = httpx.get(f"{gw.url}/metrics")
    assert public.status_code == 404 and public.json() == {"status_code": 404, "detail": "Not Found"}
    for path in ("/healthz", "/readyz"):
        assert httpx.get(gw.url + path).status_code == 200, path
        assert httpx.get(gw.ops_url + path).status_code == 200, path
    scrape = httpx.get(gw.ops_url + "/metrics")
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    names = {name for name, _, _ in samples(scrape.text)}
    for family in ("gateway_upstream_slots_in_use", "gateway_upstream_slots_limit", "gateway_upstream_queue_depth",
                   "gateway_upstream_queue_limit", "gateway_admission_total", "gateway_requests_total",
                   "gateway_request_duration_seconds_bucket", "gateway_tokens_total"):
        assert family in names, family
    status = httpx.get(gw.ops_url + "/status.json").json()
    assert [u["name"] for u in status["upstreams"]] == ["reasoning", "plain"]
    assert status["upstreams"][0]["cap"] == 2 and status["upstreams"][0]["replicas"] == []
    page = httpx.get(gw.ops_url + "/status")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'data-v="u:reasoning:in_flight"' in page.text
    # the ops app is only the operations: no dialect there
    assert httpx.post(f"{gw.ops_url}/v1/chat/completions", json=CHAT).status_code == 404


def test_a_taken_ops_port_stops_startup_naming_the_key(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = tmp_path / "gateway.toml"
        config.write_text(f'[server]\nlisten = "127.0.0.1:{free_port()}"\n[ops]\nlisten = "127.0.0.1:{port}"\n'
                          + upstream_toml("plain", "http://127.0.0.1:9", ["plain"]))
        done = subprocess.run([sys.executable, "-m", "cli", "serve", "--config", str(config)],
                              capture_output=True, text=True, timeout=30, check=False,
                              env={**os.environ, "PYTHONPATH": "src"})
    assert done.returncode == 2, done.stderr
    assert "[ops] listen" in done.stderr and str(port) in done.stderr, done.stderr


def test_port_0_is_a_free_port_printed_at_start(procs: Processes) -> None:
    gateways = [procs.gateway(upstream_toml("plain", procs.stub().url, ["plain"])) for _ in range(2)]
    ports = {gw.ops_url for gw in gateways}
    assert len(ports) == 2  # two gateways on one host, each its own ops port
    for gw in gateways:
        assert httpx.get(gw.ops_url + "/healthz").text == "ok\n"


# --- two workers, one scrape ------------------------------------------------------------------


def _workers(parent: int) -> list[int]:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(pid) for pid in children]


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _serving_worker(workers: list[int], client_port: int) -> int | None:
    """The worker holding the server side of our connection from `client_port` (/proc/net/tcp)."""
    wanted = f"{client_port:04X}"
    inodes = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[2].endswith(":" + wanted):  # remote address is our client's
            inodes.append(fields[9])
    for pid in workers:
        if _socket_inodes(pid) & set(inodes):
            return pid
    return None


def _connection(port: int, workers: list[int]) -> tuple[http.client.HTTPConnection, int]:
    """A keep-alive connection and the worker that accepted it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.connect()
    assert conn.sock is not None
    client_port = conn.sock.getsockname()[1]
    conn.request("GET", "/healthz")  # the worker has accepted once it answers
    conn.getresponse().read()
    deadline = time.monotonic() + 5
    while (pid := _serving_worker(workers, client_port)) is None:
        assert time.monotonic() < deadline, "no worker holds the connection"
        time.sleep(0.02)
    return conn, pid


def _requests_total(text: str) -> float:
    return sum(v for name, labels, v in samples(text)
               if name == "gateway_requests_total" and labels.get("route") == "/v1/chat/completions")


def test_two_workers_are_counted_on_one_scrape(procs: Processes) -> None:
    plain = procs.stub()
    gw = procs.gateway(
        f'[admission]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:6379/0"\n'
        f'key_prefix = "ops-test-{uuid.uuid4().hex[:8]}"\n' + upstream_toml("plain", plain.url, ["plain"]),
        server_extra="workers = 2")
    workers = _workers(gw.popen.pid)
    assert len(workers) == 2
    served: dict[int, int] = dict.fromkeys(workers, 0)
    body = json.dumps(CHAT)
    for _ in range(60):  # new connections until each worker has answered some chat requests
        conn, pid = _connection(gw.port, workers)
        for _ in range(3):
            conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            served[pid] += 1
        conn.close()
        if min(served.values()) >= 6:
            break
    assert min(served.values()) >= 6, served  # both workers served requests
    total = sum(served.values())
    scraped: dict[int, float] = {}
    ops_port = int(gw.ops_url.rsplit(":", 1)[1])
    for _ in range(60):  # scrape through each worker
        conn, pid = _connection(ops_port, workers)
        conn.request("GET", "/metrics")
        scraped[pid] = _requests_total(conn.getresponse().read().decode())
        conn.close()
        if len(scraped) == 2:
            break
    assert set(scraped) == set(workers), scraped
    assert all(value == total for value in scraped.values()), (scraped, served)
    status = json.loads(httpx.get(gw.ops_url + "/status.json").text)
    assert status["workers"] == 2 and status["backend"] == "redis"


def test_status_json_counts_503s_in_the_last_minute(procs: Processes, tmp_path: Path) -> None:
    stub = procs.stub("--hold", "1.5")
    gw: Proc = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], {
        "sequence_slots": 2, "max_in_flight": 1, "queue_depth": 0, "queue_timeout_seconds": 30}))
    chat = {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=10) as c:
        import threading

        holder = threading.Thread(target=lambda: c.post(f"{gw.url}/v1/chat/completions", json=chat))
        holder.start()
        deadline = time.monotonic() + 5
        while httpx.get(gw.ops_url + "/status.json").json()["upstreams"][0]["in_flight"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        refused = [httpx.post(f"{gw.url}/v1/chat/completions", json=chat).status_code for _ in range(3)]
        holder.join()
    assert refused == [503] * 3
    upstream = httpx.get(gw.ops_url + "/status.json").json()["upstreams"][0]
    assert upstream["unavailable_last_minute"] == 3 and upstream["unavailable_by_reason"] == {"queue-full": 3}
