"""API keys through a real `gateway serve` (auth required), the official SDKs and the stub.

One gateway serves most tests (keys for `frontend` and `batch`); the tests that rewrite
the keys file (rotation, a bad reload, a change mid-request) or need another start get
their own. The stub runs with `--log-headers`, so its log shows every header name the
gateway forwarded.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import msgspec
import openai
import pytest
from tests.contract.operations.test_tracing import Receiver, _attrs, receiver  # noqa: F401  (a fixture)
from tests.support.processes import Proc, Processes, upstream_toml

from adapters.outbound.keys_file import keys_entry, new_key
from domain.consumers import key_digest

FRONTEND_KEY = new_key()
BATCH_KEY = new_key()
WRONG_KEY = new_key()  # well-formed, in no file
USER = [{"role": "user", "content": "hi"}]
SECRETS = (FRONTEND_KEY, BATCH_KEY, WRONG_KEY)


def _secret(key: str) -> str:
    return key.split("_", 2)[2]


def _auth_toml(keys_file: Path, interval: float = 0.2) -> str:
    return f'\n[auth]\nmode = "required"\nkeys_file = "{keys_file}"\nreload_interval_seconds = {interval}\n'


def _keys(*entries: tuple[str, str]) -> str:
    return "".join(keys_entry(consumer, key) for consumer, key in entries)


def _write(path: Path, text: str) -> None:
    """Replace the file at once (a rename, as editors and kubelet do), so no reader sees half of it."""
    staged = path.with_suffix(".new")
    staged.write_text(text)
    staged.replace(path)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    """(gateway, stub): the stub logs header names; the gateway requires keys."""
    workdir = tmp_path_factory.mktemp("keyed")
    procs = Processes(workdir)
    try:
        stub = procs.stub("--log-headers", "--tokens", "4", log=workdir / "stub.log")
        keys = workdir / "keys.toml"
        keys.write_text(_keys(("frontend", FRONTEND_KEY), ("batch", BATCH_KEY)))
        gateway = procs.gateway(upstream_toml("plain", stub.url, ["plain"]) + _auth_toml(keys))
        yield gateway, stub
    finally:
        procs.stop_all()


@pytest.fixture
def gateway(world: tuple[Proc, Proc]) -> Proc:
    return world[0]


def _openai(gateway: Proc, key: str, **kwargs: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=20, **kwargs)  # type: ignore[arg-type]


def _anthropic(gateway: Proc, **kwargs: object) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"{gateway.url}/llm", max_retries=0, timeout=20, **kwargs)  # type: ignore[arg-type]


def _chat(gateway: Proc, headers: dict[str, str], surface: str = "v1") -> httpx.Response:
    if surface == "v1":
        url, body = f"{gateway.url}/v1/chat/completions", {"model": "plain", "messages": USER}
    else:
        url, body = f"{gateway.url}/llm/v1/messages", {"model": "plain", "max_tokens": 8, "messages": USER}
    return httpx.post(url, json=body, headers=headers, timeout=20)


# --- the right key ---------------------------------------------------------------------------


def test_openai_sdk_with_bearer_and_with_x_api_key(gateway: Proc) -> None:
    with _openai(gateway, FRONTEND_KEY) as sdk:  # the SDK sends Authorization: Bearer
        answer = sdk.chat.completions.create(model="plain", messages=USER)  # type: ignore[arg-type]
        assert answer.choices[0].message.content
        chunks = list(sdk.chat.completions.create(model="plain", messages=USER, stream=True))  # type: ignore[arg-type]
        assert chunks[-1].choices[0].finish_reason == "stop"
    response = _chat(gateway, {"x-api-key": BATCH_KEY})
    assert response.status_code == 200, response.text


def test_anthropic_sdk_with_x_api_key_and_with_bearer(gateway: Proc) -> None:
    with _anthropic(gateway, api_key=FRONTEND_KEY) as sdk:  # the SDK sends x-api-key
        assert sdk.messages.create(model="plain", max_tokens=8, messages=USER).content  # type: ignore[arg-type]
        with sdk.messages.stream(model="plain", max_tokens=8, messages=USER) as stream:  # type: ignore[arg-type]
            assert stream.get_final_message().stop_reason == "end_turn"
    with _anthropic(gateway, auth_token=BATCH_KEY) as sdk:  # Authorization: Bearer, as agent tools may
        assert sdk.messages.create(model="plain", max_tokens=8, messages=USER).content  # type: ignore[arg-type]
    same_twice = {"authorization": f"Bearer {FRONTEND_KEY}", "x-api-key": FRONTEND_KEY}
    assert _chat(gateway, same_twice, "llm").status_code == 200


# --- refusals --------------------------------------------------------------------------------


def _assert_openai_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == 401 and body["error"]["code"] == "invalid_api_key"
    assert body["error"]["type"] == "invalid_request_error"
    assert not any(_secret(key) in response.text for key in SECRETS)


def _assert_anthropic_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert not any(_secret(key) in response.text for key in SECRETS)


def test_wrong_key_raises_the_sdks_authentication_error(gateway: Proc) -> None:
    with _openai(gateway, WRONG_KEY) as sdk, pytest.raises(openai.AuthenticationError) as caught:
        sdk.chat.completions.create(model="plain", messages=USER)  # type: ignore[arg-type]
    assert caught.value.code == "invalid_api_key" and caught.value.status_code == 401
    _assert_openai_401(caught.value.response)
    with _anthropic(gateway, api_key=WRONG_KEY) as sdk, pytest.raises(anthropic.AuthenticationError) as raised:
        sdk.messages.create(model="plain", max_tokens=8, messages=USER)  # type: ignore[arg-type]
    _assert_anthropic_401(raised.value.response)
    with _anthropic(gateway, api_key=WRONG_KEY) as sdk, pytest.raises(anthropic.AuthenticationError):
        with sdk.messages.stream(model="plain", max_tokens=8, messages=USER):  # type: ignore[arg-type]
            pass


@pytest.mark.parametrize(
    "headers",
    [
        {},  # no key
        {"x-api-key": ""},
        {"authorization": f"Basic {FRONTEND_KEY}"},  # not Bearer
        {"authorization": f"Bearer {FRONTEND_KEY}", "x-api-key": BATCH_KEY},  # two different keys
        {"x-api-key": "not-a-gateway-key"},
        {"x-api-key": FRONTEND_KEY[:-1]},
    ],
)
def test_missing_wrong_or_two_keys_are_401_on_both_surfaces(gateway: Proc, headers: dict[str, str]) -> None:
    _assert_openai_401(_chat(gateway, headers))
    _assert_anthropic_401(_chat(gateway, headers, "llm"))


def test_every_route_of_a_dialect_wants_a_key_but_operations_do_not(gateway: Proc) -> None:
    _assert_openai_401(httpx.get(f"{gateway.url}/v1/models"))
    _assert_openai_401(httpx.get(f"{gateway.url}/v1/no-such-route"))  # no route list for strangers
    _assert_anthropic_401(httpx.post(f"{gateway.url}/llm/v1/messages/count_tokens", json={}))
    assert httpx.get(f"{gateway.url}/v1/models", headers={"x-api-key": FRONTEND_KEY}).status_code == 200
    for path in ("/healthz", "/readyz"):
        assert httpx.get(f"{gateway.url}{path}").status_code == 200, path
    assert httpx.get(f"{gateway.url}/metrics").status_code == 404  # the ops listener's, keyless there
    for path in ("/metrics", "/healthz", "/readyz", "/status", "/status.json"):
        assert httpx.get(f"{gateway.ops_url}{path}").status_code == 200, path


def test_huge_or_binary_header_values_are_a_clear_4xx(gateway: Proc) -> None:
    big = "k" * 40_000  # over max_header_bytes (32 KiB): the surface's 431, before the key is looked at
    response = _chat(gateway, {"x-api-key": big})
    assert response.status_code == 431 and response.json()["error"]["code"] == "headers-too-large"
    assert _chat(gateway, {"authorization": "Bearer " + big}, "llm").json()["error"]["type"] == "request_too_large"
    huge = httpx.post(f"{gateway.url}/v1/chat/completions", headers={"x-api-key": "k" * 300_000}, timeout=20)
    assert huge.status_code == 431  # the server's own head bound
    for value in (b"\xff\xfebinary", b"gw_\x80\x81", "Bearer \u00e9\u00e8".encode("latin-1")):
        request = httpx.Request("POST", f"{gateway.url}/v1/chat/completions", json={"model": "plain"},
                                headers=[(b"x-api-key", value)])
        with httpx.Client(timeout=20) as raw:
            _assert_openai_401(raw.send(request))
    # Control bytes no HTTP client library sends (a raw socket): the HTTP parser refuses them (400).
    for value in (b"\x00\x01\x02", b"\x7f" * 64, b"\x1b[31m"):
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=20) as sock:
            sock.sendall(b"GET /llm/v1/models HTTP/1.1\r\nhost: x\r\nx-api-key: " + value
                         + b"\r\nconnection: close\r\n\r\n")
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
        status = int(answer.split(b" ", 2)[1])
        assert 400 <= status < 500 and status != 404, answer[:200]


# --- nothing leaks ---------------------------------------------------------------------------


def test_no_credential_header_reaches_the_upstream(world: tuple[Proc, Proc]) -> None:
    gateway, stub = world
    _chat(gateway, {"authorization": f"Bearer {FRONTEND_KEY}", "x-api-key": FRONTEND_KEY,
                    "x-claude-code-session-id": "session-7"})  # an agent's session header: logged, not forwarded
    with _anthropic(gateway, api_key=BATCH_KEY) as sdk:
        sdk.messages.create(model="plain", max_tokens=8, messages=USER)  # type: ignore[arg-type]
    lines = Path(str(stub.extra["log"])).read_text().splitlines()
    assert len(lines) >= 2
    for line in lines:
        names = line.split(" headers=", 1)[1].split(" ", 1)[0].split(",")
        assert "content-type" in names, line  # the option shows what arrived
        assert not {"authorization", "x-api-key", "proxy-authorization", "cookie",
                    "x-claude-code-session-id"} & set(names), line
        assert not any(_secret(key) in line for key in SECRETS)


def _access(output: str) -> list[dict[str, Any]]:
    return [msgspec.json.decode(line) for line in output.splitlines() if line.startswith('{"request_id"')]


def test_logs_name_consumer_and_key_id_never_the_key(world: tuple[Proc, Proc]) -> None:
    gateway, _ = world
    logged = len(_access(gateway.text()))
    _chat(gateway, {"x-api-key": FRONTEND_KEY})
    _chat(gateway, {"x-api-key": WRONG_KEY}, "llm")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(_access(gateway.text())) < logged + 2:
        time.sleep(0.05)  # the access lines follow the responses
    output = gateway.text()
    for key in SECRETS:
        assert _secret(key) not in output and key not in output
    records = _access(output)
    mine = [r for r in records if r["consumer"] == "frontend"]
    assert mine and all(r["key_id"] == FRONTEND_KEY.split("_")[1] for r in mine)
    refused = [r for r in records if r["status"] == 401]
    assert refused and all(r["consumer"] is None and r["error_kind"] == "invalid-api-key" for r in refused)


# --- the keys file changes -------------------------------------------------------------------


def _wait_for_status(call: object, status: int, timeout: float = 10.0) -> float:
    """Seconds until `call()` answers `status` (polling every 50 ms), or fail."""
    started = time.monotonic()
    while True:
        got = call().status_code  # type: ignore[operator]
        if got == status:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"still {got} after {timeout}s"
        time.sleep(0.05)


def test_rotation_takes_effect_without_a_restart(procs: Processes, tmp_path: Path) -> None:
    stub = procs.stub()
    keys = tmp_path / "keys.toml"
    old, new = new_key(), new_key()
    keys.write_text(_keys(("frontend", old)))
    gateway = procs.gateway(upstream_toml("plain", stub.url, ["plain"]) + _auth_toml(keys))
    pid = gateway.popen.pid
    assert _chat(gateway, {"x-api-key": old}).status_code == 200
    assert _chat(gateway, {"x-api-key": new}).status_code == 401

    _write(keys, f'[consumers.frontend]\nkeys = ["{key_digest(old)}", "{key_digest(new)}"]\n')  # add the new key
    took = _wait_for_status(lambda: _chat(gateway, {"x-api-key": new}), 200)
    assert took < 5, took  # interval 0.2 s; generous for a loaded machine
    assert _chat(gateway, {"x-api-key": old}).status_code == 200  # both work during the rotation

    _write(keys, f'[consumers.frontend]\nkeys = ["{key_digest(new)}"]\n')  # remove the old key: revoked
    with _openai(gateway, old) as sdk:
        def attempt() -> httpx.Response:
            try:
                sdk.chat.completions.create(model="plain", messages=USER)  # type: ignore[arg-type]
            except openai.AuthenticationError as error:
                return error.response
            return httpx.Response(200)
        assert _wait_for_status(attempt, 401) < 5
    assert _chat(gateway, {"x-api-key": new}).status_code == 200
    assert gateway.popen.poll() is None and gateway.popen.pid == pid  # no restart


def test_a_bad_file_at_reload_keeps_the_previous_consumers(procs: Processes, tmp_path: Path) -> None:
    stub = procs.stub()
    keys = tmp_path / "keys.toml"
    key, other = new_key(), new_key()
    keys.write_text(_keys(("frontend", key)))
    gateway = procs.gateway(upstream_toml("plain", stub.url, ["plain"]) + _auth_toml(keys))
    _write(keys, _keys(("frontend", key), ("batch", other)) + "tokens_per_mnute = 5\n")
    deadline = time.monotonic() + 10
    while "tokens_per_mnute" not in gateway.text() and time.monotonic() < deadline:
        time.sleep(0.05)
    errors = [line for line in gateway.text().splitlines() if "consumers.batch.tokens_per_mnute" in line]
    assert len(errors) == 1 and str(keys) in errors[0] and "keeping the previous consumers" in errors[0]
    assert _chat(gateway, {"x-api-key": key}).status_code == 200  # the old table is in use
    assert _chat(gateway, {"x-api-key": other}).status_code == 401  # nothing of the bad file is
    time.sleep(0.5)  # a few more polls: the same bad file is not reported again
    assert sum("consumers.batch.tokens_per_mnute" in line for line in gateway.text().splitlines()) == 1
    _write(keys, _keys(("frontend", key), ("batch", other)))  # fixed: picked up
    _wait_for_status(lambda: _chat(gateway, {"x-api-key": other}), 200)


def test_a_bad_file_at_start_stops_startup(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('[consumers.frontend]\nkeys = ["sha256:abc"]\n')
    config = tmp_path / "gateway.toml"
    config.write_text('[server]\nlisten = "127.0.0.1:1"\n' + upstream_toml("plain", "http://127.0.0.1:2", ["plain"])
                      + _auth_toml(keys))
    done = subprocess.run([sys.executable, "-m", "cli", "serve", "--config", str(config)],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2, done.stderr
    assert "consumers.frontend.keys[0]" in done.stderr and str(keys) in done.stderr
    keys.unlink()
    done = subprocess.run([sys.executable, "-m", "cli", "serve", "--config", str(config)],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and "cannot read keys file" in done.stderr


def test_a_change_mid_request_does_not_affect_that_request(procs: Processes, tmp_path: Path) -> None:
    stub = procs.stub("--hold", "1.5")
    keys = tmp_path / "keys.toml"
    key = new_key()
    keys.write_text(_keys(("frontend", key)))
    gateway = procs.gateway(upstream_toml("plain", stub.url, ["plain"]) + _auth_toml(keys))
    result: list[httpx.Response] = []
    request = threading.Thread(target=lambda: result.append(_chat(gateway, {"x-api-key": key})))
    request.start()
    time.sleep(0.3)  # the request is with the upstream
    _write(keys, "")  # every key revoked
    _wait_for_status(lambda: _chat(gateway, {"x-api-key": key}), 401)
    request.join(timeout=20)
    assert result and result[0].status_code == 200  # authenticated once, at its start


def test_ten_thousand_keys_load_and_authenticate(procs: Processes, tmp_path: Path) -> None:
    stub = procs.stub()
    keys = [new_key() for _ in range(10_000)]
    path = tmp_path / "keys.toml"
    path.write_text(_keys(*((f"c{i}", key) for i, key in enumerate(keys))))
    gateway = procs.gateway(upstream_toml("plain", stub.url, ["plain"]) + _auth_toml(path, 1))
    for key in (keys[0], keys[4999], keys[-1]):
        assert _chat(gateway, {"x-api-key": key}).status_code == 200
    assert _chat(gateway, {"x-api-key": WRONG_KEY}).status_code == 401


# --- traces ----------------------------------------------------------------------------------


async def test_spans_carry_consumer_and_key_id_never_the_key(procs: Processes, tmp_path: Path,
                                                             receiver: tuple[Receiver, str]) -> None:  # noqa: F811
    collector, endpoint = receiver
    stub = procs.stub()
    keys = tmp_path / "keys.toml"
    keys.write_text(_keys(("frontend", FRONTEND_KEY)))
    gateway = procs.gateway(upstream_toml("plain", stub.url, ["plain"]) + _auth_toml(keys),
                            env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=20) as http:
        ok = await http.post("/llm/v1/messages", headers={"x-api-key": FRONTEND_KEY},
                             json={"model": "plain", "max_tokens": 8, "messages": USER})
        refused = await http.post("/v1/chat/completions", headers={"authorization": f"Bearer {WRONG_KEY}"},
                                  json={"model": "plain", "messages": USER})
    assert (ok.status_code, refused.status_code) == (200, 401)
    spans = await collector.wait_for({"POST /llm/v1/messages", "POST /v1/chat/completions"})
    keyed = _attrs(spans["POST /llm/v1/messages"])
    assert keyed["gateway.consumer"] == "frontend" and keyed["gateway.key_id"] == FRONTEND_KEY.split("_")[1]
    stranger = _attrs(spans["POST /v1/chat/completions"])
    assert "gateway.consumer" not in stranger and stranger["error.type"] == "invalid-api-key"
    for span in collector.spans:
        assert not any(_secret(key) in str(value) for value in _attrs(span).values() for key in SECRETS)
