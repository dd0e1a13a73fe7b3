"""Image URLs a client may make the model server fetch: the edge's SSRF check.

vLLM fetches an `image_url` itself, from inside the cluster, so a URL is a request the
client makes *through* the predictor. Only the schemes in `[server] media_url_schemes`
pass (default `https` and `data`); a fetched URL's host must be a public name or a
public address, decided on the text alone (no DNS lookup here: the predictor resolves
again, so an answer seen here would prove nothing). The host is read by `yarl`, the
parser of aiohttp, which is what vLLM fetches with, so both read the same host.

Refused hosts: literal addresses outside global unicast (loopback, private, link-local,
CGNAT, unique-local, unspecified, multicast, reserved, documentation, the metadata
address 169.254.169.254 and fd00:ec2::254), IPv6 forms that embed such an IPv4 address
(mapped, 6to4, NAT64), every IPv4 spelling `inet_aton` accepts (`2852039166`,
`0x7f.1`, `0177.0.0.1`, `127.1`), and names that can only be local: `localhost` and
`*.localhost`, names without a dot (resolved through the cluster's search domains:
`metadata`, `kubernetes`), and the special-use suffixes below (which covers
`metadata.google.internal` and `*.svc.cluster.local`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection

from yarl import URL

from domain.errors import InvalidRequest

DEFAULT_SCHEMES = frozenset({"https", "data"})

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# RFC 3986 scheme at the very start: a leading space or control character that a lenient
# parser would strip first (`urllib.parse` does) makes the URL refused, not re-read.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
# Parsers drop or split on these differently (urllib deletes tabs and newlines anywhere).
_UNSAFE = re.compile(r"[\x00-\x20\x7f]")
_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
# WHATWG's "ends in a number": such a host is an IPv4 address or invalid, never a name.
_NUMBER = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)
_HEX = re.compile(r"0[xX][0-9a-fA-F]+")
_OCTAL = re.compile(r"0[0-7]*")
_DECIMAL = re.compile(r"[1-9][0-9]*")
_LOCAL_SUFFIXES = ("localhost", "local", "internal", "localdomain", "home.arpa", "svc")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SHOWN = 80  # characters of a client's scheme or host quoted back in a message


def check_media_url(url: str, param: str, schemes: Collection[str] = DEFAULT_SCHEMES) -> None:
    """Raise `InvalidRequest` naming `param` unless the model server may fetch `url`."""
    if url[:5].lower() == "data:":  # never parsed: a data URL is the image itself (megabytes)
        if "data" not in schemes:
            raise _refused(param, "is a `data:` URL; " + _accepted(schemes))
        return
    scheme = _SCHEME.match(url)
    if scheme is None:
        raise _refused(param, "is not an absolute URL; " + _accepted(schemes))
    name = scheme.group()[:-1].lower()
    if name not in schemes:
        raise _refused(param, f"has the scheme '{name[:_SHOWN]}'; " + _accepted(schemes))
    if _UNSAFE.search(url):
        raise _refused(param, "contains spaces or control characters.")
    reason = url_refusal(url)
    if reason is not None:
        raise _refused(param, reason)


def url_refusal(url: str) -> str | None:
    """Why a fetchable URL (`https:` and the like) must not be fetched, or None."""
    try:
        parsed = URL(url)
        host = parsed.raw_host
    except (ValueError, UnicodeError):
        return "is not a valid URL."
    if not parsed.absolute or not host:
        return "has no host."
    if parsed.raw_user is not None or parsed.raw_password is not None:
        return "carries credentials; media URLs must not."
    return host_refusal(host)


def host_refusal(host: str) -> str | None:
    """Why the host `host` (as yarl gives it: IDNA-encoded, IPv6 without brackets) is refused."""
    host = host.lower()
    if ":" in host:  # only an IPv6 literal has a colon in its host
        try:
            address: IPAddress = ipaddress.IPv6Address(host)
        except ValueError:
            return f"has an invalid host '{host[:_SHOWN]}'."
        return address_refusal(address)
    name = host[:-1] if host.endswith(".") else host
    if _NUMBER.fullmatch(name.rpartition(".")[2]):
        parsed = inet_aton(name)
        if parsed is None:
            return f"has an invalid host '{host[:_SHOWN]}'."
        return address_refusal(parsed)
    if not _NAME.fullmatch(name):
        return f"has an invalid host '{host[:_SHOWN]}'."
    for suffix in _LOCAL_SUFFIXES:
        if name == suffix or name.endswith("." + suffix):
            return f"names the host '{host[:_SHOWN]}', a local name (`{suffix}`)."
    if "." not in name:
        return f"names the host '{host[:_SHOWN]}', a name without a domain (resolved inside the cluster)."
    return None


def address_refusal(address: IPAddress) -> str | None:
    """Why a literal address is refused: anything but global unicast, directly or embedded."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return None if is_public(embedded) else f"names the address {address} ({embedded}), which is not public."
    if is_public(address):
        return None
    return f"names the address {address}, which is not public."


def is_public(address: IPAddress) -> bool:
    """Global unicast, and nothing special: the one kind of address a predictor may fetch from."""
    if not address.is_global or address.is_multicast or address.is_reserved:
        return False
    return not (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, NAT64), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """An IPv4 address in any spelling the C library's `inet_aton` (hence `getaddrinfo`)
    accepts: 1 to 4 parts, each decimal, octal (leading 0) or hex (0x); the last part
    fills the remaining bytes (`127.1`, `2852039166`). None: not such a spelling."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        value = _number(part)
        if value is None:
            return None
        values.append(value)
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = last
    for i, value in enumerate(head):
        number |= value << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def _number(part: str) -> int | None:
    """One part as `inet_aton` reads it (int() alone would also take `1_0`, `+1` or ` 1`)."""
    if _HEX.fullmatch(part):
        return int(part[2:], 16)
    if _OCTAL.fullmatch(part):
        return int(part, 8)
    if _DECIMAL.fullmatch(part):
        return int(part)
    return None


def _accepted(schemes: Collection[str]) -> str:
    if not schemes:
        return "this gateway accepts no image URLs."
    return "this gateway accepts " + ", ".join(f"`{s}:`" for s in sorted(schemes)) + " image URLs."


def _refused(param: str, reason: str) -> InvalidRequest:
    return InvalidRequest(f"`{param}` {reason}", param=param)
