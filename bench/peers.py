"""The reference peers: nginx (native pass-through), the ceiling (the cheapest proxy of our
stack, bench/ceiling.py) and LiteLLM proxy (the most used Python gateway), all in front of
the same stub, on loopback, each as a foreground child process."""

from __future__ import annotations

import functools
import os
import secrets
import subprocess
import sys

from targets import (
    LITELLM_VENV,
    MODEL,
    ROOT,
    Procs,
    Target,
    free_port,
    gateway_python,
    litellm_binary,
    nginx_binary,
    wait_ready,
)

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/nginx-body;
    proxy_temp_path {dir}/nginx-proxy;
    fastcgi_temp_path {dir}/nginx-fastcgi;
    uwsgi_temp_path {dir}/nginx-uwsgi;
    scgi_temp_path {dir}/nginx-scgi;
    upstream stub {{
        server 127.0.0.1:{stub_port};
        keepalive 256;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://stub;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def start_nginx(procs: Procs, cpus: set[int] | None, stub_url: str) -> Target:
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("nginx is not installed (bench/run installs it with apt-get)")
    port, stub_port = free_port(), stub_url.rsplit(":", 1)[1]
    conf = procs.workdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=procs.workdir, port=port, stub_port=stub_port))
    argv = [binary, "-p", str(procs.workdir), "-e", str(procs.workdir / "nginx-error.log"), "-c", str(conf)]
    proc, log = procs.spawn("nginx", argv, cpus)
    wait_ready(f"http://127.0.0.1:{port}/health", proc, log, 10)
    return Target("nginx", f"http://127.0.0.1:{port}", proc, log)


def start_ceiling(procs: Procs, cpus: set[int] | None, stub_url: str, name: str = "ceiling",
                  wrap: tuple[str, ...] = ()) -> Target:
    """bench/ceiling.py: one Litestar handler relaying through one aiohttp session, on the
    gateway's interpreter (the runtime venv) when that has aiohttp, else on this one."""
    port = free_port()
    argv = [*wrap, ceiling_python(), str(ROOT / "bench" / "ceiling.py"), "--listen", f"127.0.0.1:{port}",
            "--upstream", stub_url]
    proc, log = procs.spawn(name, argv, cpus)
    wait_ready(f"http://127.0.0.1:{port}/health", proc, log, 600 if wrap else 20)
    return Target("ceiling", f"http://127.0.0.1:{port}", proc, log)


@functools.cache
def ceiling_python() -> str:
    """The gateway's interpreter if it can import aiohttp (today aiohttp is only a dev
    dependency, so the runtime venv may lack it), else the harness's (.venv)."""
    python = gateway_python()
    has_aiohttp = subprocess.run([python, "-c", "import aiohttp"], capture_output=True, timeout=60)
    return python if has_aiohttp.returncode == 0 else sys.executable


LITELLM_CONF = """\
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {stub_url}/v1
      api_key: sk-unused
litellm_settings:
  set_verbose: false
  telemetry: false
general_settings:
  master_key: {key}
"""


def start_litellm(procs: Procs, cpus: set[int] | None, stub_url: str) -> Target:
    binary = litellm_binary()
    if binary is None:
        raise RuntimeError(f"LiteLLM is not installed in {LITELLM_VENV.relative_to(ROOT)} (bench/run installs it)")
    port, key = free_port(), "sk-bench-" + secrets.token_hex(16)
    conf = procs.workdir / "litellm.yaml"
    conf.write_text(LITELLM_CONF.format(model=MODEL, stub_url=stub_url, key=key))
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",  # no model-price download at start
        # /v1/messages for an openai/ model goes to the upstream's /v1/chat/completions
        # (the default, /v1/responses, is not served by vLLM's stub).
        LITELLM_USE_CHAT_COMPLETIONS_URL_FOR_ANTHROPIC_MESSAGES="true",
        PYTHONUNBUFFERED="1",
    )
    argv = [str(binary), "--config", str(conf), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    proc, log = procs.spawn("litellm", argv, cpus, env=env)
    headers = {"Authorization": f"Bearer {key}"}
    wait_ready(f"http://127.0.0.1:{port}/health/liveliness", proc, log, 90, headers)
    return Target("litellm", f"http://127.0.0.1:{port}", proc, log, headers=headers, messages_path="/v1/messages")
