"""The `gateway` command: reads its arguments (and the config), asks the composition root
(`bootstrap`) for the app and serves it (`serving`).

`gateway serve [--config PATH]` runs the gateway; without `--config` it runs the
embedded demo (`demo`: two stub upstreams started as child processes and a config
pointing at them). `gateway check-config --config PATH` validates a file,
`gateway keys new --consumer NAME` makes an API key and its keys-file entry,
`gateway stub --listen HOST:PORT` runs the vLLM-like stub upstream, `gateway --version`
prints the installed version.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

from litestar import Litestar

import serving
from adapters.inbound._shared.edge import EdgeMiddleware
from adapters.inbound._shared.http_guard import guarded_protocol
from adapters.outbound.keys_file import KeysFileError, keys_entry, new_key, read_keys_file, read_salt_secret
from bootstrap import build_app
from config import Config, ConfigError, dump_config, load_config, parse_listen, parse_ops_listen
from wiring.observability import MULTIPROC_ENV

DESCRIPTION = (
    "An LLM API gateway: serves the OpenAI API (/v1) and the Anthropic Messages API (/llm) over "
    "self-hosted vLLM upstreams, each behind its own admission control (a cap on requests in flight "
    "and a bounded queue)."
)
log = logging.getLogger("gateway")


def _serve(args: argparse.Namespace) -> int:
    if args.config is None:
        from demo import demo_config

        config, stop_stubs = demo_config()
    else:
        config, stop_stubs = load_config(args.config), None
    host, port = parse_listen(config.server.listen)
    _check_keys_file(config)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    server = config.server
    grace = server.drain_grace_seconds
    # The server's protocol bounds the request head below the app (SECURITY.md).
    protocol = guarded_protocol(2 * server.max_header_bytes, server.header_timeout_seconds,
                                server.client_write_timeout_seconds)
    limit, keep_alive = server.limit_concurrency, server.keep_alive_timeout_seconds

    def build() -> tuple[EdgeMiddleware, Any, Litestar]:
        app = build_app(config)
        container = app.app.state.container
        return app, serving.make_drain(container.lifecycle(), container.gate(), grace), container.ops_app()

    metrics_dir = _multiprocess_metrics() if server.workers > 1 else None
    ops_socket = _ops_socket(config)
    try:
        if server.workers > 1:
            return serving.run_workers(server.workers, host, port, grace, build, http_protocol=protocol,
                                       limit_concurrency=limit, keep_alive=keep_alive, ops_socket=ops_socket)
        app, drain, ops = build()
        serving.run(app, host, port, drain, grace, http_protocol=protocol, limit_concurrency=limit,
                    keep_alive=keep_alive, ops=serving.Ops(ops, ops_socket))
    finally:
        ops_socket.close()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
        if stop_stubs is not None:
            stop_stubs()
    return 0


def _ops_socket(config: Config) -> socket.socket:
    """The ops listener's socket, bound before anything starts: a taken port stops startup."""
    host, port = parse_ops_listen(config)
    try:
        sock = serving.listen_socket(host, port)
    except OSError as error:
        raise ConfigError(f"[ops] listen = '{config.ops.listen}': cannot listen there ({error.strerror})") from None
    bound = sock.getsockname()[1]
    log.info("gateway ops listening on http://%s:%d (/metrics /healthz /readyz /status)", host, bound)
    return sock


def _check_keys_file(config: Config) -> None:
    """A bad keys file stops `serve` before it listens, like a bad config (exit 2)."""
    if config.auth.mode == "required" and config.auth.keys_file is not None:
        try:
            read_keys_file(config.auth.keys_file)
        except KeysFileError as error:
            raise ConfigError(f"auth.keys_file: {error}") from None
        if config.auth.cache_salt_secret_file is not None:
            try:
                read_salt_secret(config.auth.cache_salt_secret_file)
            except KeysFileError as error:
                raise ConfigError(f"auth.cache_salt_secret_file: {error}") from None


def _multiprocess_metrics() -> str:
    """A fresh directory for every worker's metric files, set before prometheus_client is loaded."""
    if "prometheus_client" in sys.modules:  # its multiprocess mode is chosen at import
        raise RuntimeError("prometheus_client was imported before the workers' metrics directory was set")
    directory = tempfile.mkdtemp(prefix="gateway-metrics-")
    os.environ[MULTIPROC_ENV] = directory
    return directory


def _check_config(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    try:
        print(dump_config(config), flush=True)
    except BrokenPipeError:  # `| head` stopped reading: the check itself passed
        # Python's advice: point stdout at devnull, so the flush at exit cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _keys_new(args: argparse.Namespace) -> int:
    """Print a new key once, and the keys-file lines holding its digest (the only thing stored)."""
    key = new_key()
    print(f"key: {key}")
    print("# Shown once: store the key now. Add these lines to the keys file ([auth] keys_file):")
    print(keys_entry(args.consumer, key), end="")
    return 0


def _stub(args: argparse.Namespace) -> int:
    from stub.cli import run

    return run(args)


def parser() -> argparse.ArgumentParser:
    from stub.cli import add_arguments as add_stub_arguments

    gateway = argparse.ArgumentParser(prog="gateway", description=DESCRIPTION,
                                      epilog="`gateway COMMAND --help`: its options. More: docs/operations.md")
    gateway.add_argument("--version", action="version", version=f"%(prog)s {version('gateway')}")
    commands = gateway.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the gateway (no --config: a demo on two stub upstreams)",
                                description="Run the gateway until SIGTERM/SIGINT (the first one drains).")
    serve.add_argument("--config", help="TOML config file (default: the embedded stub demo)")
    serve.set_defaults(run=_serve)
    check = commands.add_parser("check-config", help="validate a config file, print it with secrets masked")
    check.add_argument("--config", required=True)
    check.set_defaults(run=_check_config)
    keys = commands.add_parser("keys", help="API keys (`keys new` makes one)").add_subparsers(
        dest="keys_command", required=True, title="commands", metavar="COMMAND")
    new = keys.add_parser("new", help="make a new API key and print its keys-file entry")
    new.add_argument("--consumer", required=True, help="the consumer (keys-file table name) the key is for")
    new.set_defaults(run=_keys_new)
    stub = commands.add_parser("stub", help="run the vLLM-compatible stub upstream")
    add_stub_arguments(stub)
    stub.set_defaults(run=_stub)
    return gateway


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as error:
        print(f"gateway: configuration error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
