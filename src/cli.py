"""The `gateway` command: reads its arguments (and the config), asks the composition root
(`bootstrap`) for the app and serves it (`serving`).

`gateway serve [--config PATH] [--port N] [--ops-port N]` runs the gateway; without
`--config` it runs the embedded demo (`demo`: two stub upstreams started as child
processes and a config pointing at them). `gateway check-config --config PATH` validates
a file, `gateway keys new --consumer NAME` makes an API key and its keys-file entry,
`gateway stub --listen HOST:PORT` runs the vLLM-like stub upstream, `gateway --version`
prints the installed version.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Sequence
from importlib.metadata import version
from types import FrameType
from typing import TYPE_CHECKING, Any

import serving
from adapters.outbound.keys_file import KeysFileError, keys_entry, new_key, read_keys_file, read_salt_secret
from config import Config, ConfigError, dump_config, load_config, parse_listen, parse_ops_listen
from wiring.observability import MULTIPROC_ENV

if TYPE_CHECKING:
    from litestar import Litestar

    from adapters.inbound._shared.edge import EdgeMiddleware

DESCRIPTION = (
    "An LLM API gateway: serves the OpenAI API (/v1) and the Anthropic Messages API (/llm) over "
    "self-hosted vLLM upstreams, each behind its own admission control (a cap on requests in flight "
    "and a bounded queue)."
)
log = logging.getLogger("gateway")


def _serve(args: argparse.Namespace) -> int:
    """Every way out once the demo's stubs have started (a taken port, a bad config, a failed
    startup, SIGTERM at any time) stops them."""
    if args.config is not None:
        return _serve_config(load_config(args.config), args.port, args.ops_port)
    from demo import demo_config

    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # the default action would skip `finally`
    try:
        config, stop_stubs = demo_config()
        try:
            return _serve_config(config, args.port, args.ops_port, demo=True)
        finally:
            stop_stubs()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(sig: int, _: FrameType | None) -> None:
    raise SystemExit(128 + sig)


def _serve_config(config: Config, port: int | None, ops_port: int | None, *, demo: bool = False) -> int:
    # The app's stack (Litestar, aiohttp, the container) is loaded only to serve: `stub`, `keys`,
    # `check-config` and `--help` start without it.
    from adapters.inbound._shared.http_guard import guarded_protocol
    from bootstrap import build_app

    _override_ports(config, port, ops_port)
    host, main_port = parse_listen(config.server.listen)
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

    with contextlib.ExitStack() as cleanup:
        # Both sockets are bound before anything starts: a taken port stops startup, naming its key.
        main_socket = cleanup.enter_context(_listen(config.server.listen, "[server] listen", (host, main_port)))
        ops_address = parse_ops_listen(config)
        ops_socket = cleanup.enter_context(_listen(config.ops.listen, "[ops] listen", ops_address))
        ops_bound = ops_socket.getsockname()[1]  # the port the system chose for port 0
        log.info("gateway ops listening on http://%s:%d (/metrics /healthz /readyz /status)", ops_address[0], ops_bound)
        if demo:
            from demo import banner

            print(banner(main_port, ops_bound), file=sys.stderr, flush=True)
        if server.workers > 1:
            cleanup.callback(shutil.rmtree, _multiprocess_metrics(), ignore_errors=True)
            return serving.run_workers(server.workers, host, main_port, grace, build, sock=main_socket,
                                       http_protocol=protocol, limit_concurrency=limit, keep_alive=keep_alive,
                                       ops_socket=ops_socket)
        app, drain, ops = build()
        serving.run(app, host, main_port, drain, grace, sock=main_socket, http_protocol=protocol,
                    limit_concurrency=limit, keep_alive=keep_alive, ops=serving.Ops(ops, ops_socket))
    return 0


def _override_ports(config: Config, port: int | None, ops_port: int | None) -> None:
    """`--port` / `--ops-port`: the port of `[server] listen` / `[ops] listen`, their hosts kept."""
    if port is not None:
        config.server.listen = f"{config.server.listen.rpartition(':')[0]}:{port}"
    if ops_port is not None:
        config.ops.listen = f"{config.ops.listen.rpartition(':')[0]}:{ops_port}"
    if parse_ops_listen(config) == parse_listen(config.server.listen):
        raise ConfigError(f"ops.listen must differ from server.listen ('{config.ops.listen}' is both)")


def _listen(listen: str, key: str, address: tuple[str, int]) -> socket.socket:
    try:
        return serving.listen_socket(*address)
    except OSError as error:
        raise ConfigError(f"{key} = '{listen}': cannot listen there ({error.strerror})") from None


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


def _port(lowest: int) -> Callable[[str], int]:
    def port(text: str) -> int:
        if not text.isdigit() or not lowest <= int(text) <= 65535:
            raise argparse.ArgumentTypeError(f"must be a port, {lowest}..65535, got {text!r}")
        return int(text)

    return port


def parser() -> argparse.ArgumentParser:
    from stub.cli import add_arguments as add_stub_arguments

    gateway = argparse.ArgumentParser(prog="gateway", description=DESCRIPTION,
                                      epilog="`gateway COMMAND --help`: its options. More: docs/operations.md")
    gateway.add_argument("--version", action="version", version=f"%(prog)s {version('gateway')}")
    commands = gateway.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the gateway (no --config: a demo on two stub upstreams)",
                                description="Run the gateway until SIGTERM/SIGINT (the first one drains).")
    serve.add_argument("--config", help="TOML config file (default: the embedded stub demo)")
    serve.add_argument("--port", type=_port(1), metavar="N",
                       help="listen on this port, 1..65535 (the port of [server] listen; default: the config's, "
                            "8080 for the demo)")
    serve.add_argument("--ops-port", type=_port(0), metavar="N",
                       help="the ops listener (metrics, health, status) on this port, 0..65535, 0: any free "
                            "port (the port of [ops] listen; default: the config's, 9464)")
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
