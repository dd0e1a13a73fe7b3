"""Addresses in the configuration: `HOST:PORT` listeners and `HOST[:PORT]` DNS servers."""

from __future__ import annotations

import ipaddress

from config.section import ConfigError


def parse_listen(value: str, key: str = "server.listen", *, any_port: bool = False) -> tuple[str, int]:
    """HOST:PORT; `any_port` allows port 0 (the system picks a free one)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not (0 if any_port else 1) <= int(port) < 65536:
        raise ConfigError(f"{key} must be HOST:PORT, got '{value}'")
    return host.strip("[]") or "0.0.0.0", int(port)


def nameserver(text: str, key: str = "nameservers") -> tuple[str, int]:
    """`HOST[:PORT]` of a DNS server (HOST an IP address; `[v6]:PORT` with a port) -> (host, port)."""
    host, port = text, 53
    if text.startswith("["):
        inner, sep, rest = text[1:].partition("]")
        host = inner
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                host = ""
            else:
                port = int(rest[1:])
        elif not sep:
            host = ""
    elif text.count(":") == 1:
        host, _, digits = text.partition(":")
        port = int(digits) if digits.isdigit() else -1
    if not is_ip(host) or not 0 < port < 65536:
        raise ConfigError(f"{key} must be HOST[:PORT] with HOST an IP address (e.g. '10.96.0.10:53'), got '{text}'")
    return host, port


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
