"""The image-URL check (SSRF at the edge): schemes, and every spelling of a non-public host."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.inbound._shared.media_urls import check_media_url, inet_aton
from domain.errors import InvalidRequest

PARAM = "messages[0].content[1].image_url.url"
FULLWIDTH_LOCALHOST = "https://" + "".join(chr(ord(c) + 0xFEE0) for c in "localhost") + "/"  # IDNA: localhost

# Networks no predictor may be sent to, and some that are plainly public.
PRIVATE_V4 = ["0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
              "192.0.0.0/29", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24",
              "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4"]  # fmt: skip
PRIVATE_V6 = ["::1/128", "::/128", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8", "2001:db8::/32", "::/96"]
PUBLIC_V4 = ["8.8.0.0/16", "1.1.1.0/24", "151.101.0.0/16", "93.184.0.0/16"]
PUBLIC_V6 = ["2606:4700::/32", "2001:4860::/32", "2a00:1450::/32"]


def refused(url: str, schemes: frozenset[str] = frozenset({"https", "data"})) -> bool:
    try:
        check_media_url(url, PARAM, schemes)
    except InvalidRequest as error:
        assert error.param == PARAM and error.message.startswith(f"`{PARAM}` ")
        return True
    return False


def in_network(cidr: str) -> st.SearchStrategy[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    network = ipaddress.ip_network(cidr)
    return st.integers(0, network.num_addresses - 1).map(lambda i: network[i])


def any_of(cidrs: list[str]) -> st.SearchStrategy[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return st.one_of(*(in_network(c) for c in cidrs))


def _part(value: int, base: str) -> str:
    if base == "hex":
        return hex(value)
    if base == "HEX":
        return "0X" + format(value, "X")
    if base == "oct":
        return "0" + format(value, "o")
    return str(value)


@st.composite
def ipv4_spellings(draw: st.DrawFn, address: ipaddress.IPv4Address) -> str:
    """`address` as any host text `inet_aton` reads the same: 1 to 4 parts, each part in any base,
    or an IPv6 form that stands for it (mapped, 6to4, NAT64)."""
    n = int(address)
    octets = list(address.packed)
    base = st.sampled_from(["dec", "hex", "HEX", "oct"])
    form = draw(st.sampled_from(["dotted", "one", "two", "three", "mapped", "mapped-hex", "6to4", "nat64"]))
    if form == "dotted":
        text = ".".join(_part(o, draw(base)) for o in octets)
    elif form == "one":
        text = _part(n, draw(base))
    elif form == "two":
        text = f"{_part(octets[0], draw(base))}.{_part(n & 0xFFFFFF, draw(base))}"
    elif form == "three":
        text = f"{_part(octets[0], draw(base))}.{_part(octets[1], draw(base))}.{_part(n & 0xFFFF, draw(base))}"
    elif form == "mapped":
        return f"[::ffff:{address}]"
    elif form == "mapped-hex":
        return f"[::ffff:{n >> 16:x}:{n & 0xFFFF:x}]"
    elif form == "6to4":
        return f"[2002:{n >> 16:x}:{n & 0xFFFF:x}::{draw(st.integers(1, 0xFFFF)):x}]"
    else:
        return f"[64:ff9b::{n >> 16:x}:{n & 0xFFFF:x}]"
    return text + draw(st.sampled_from(["", "."]))  # a trailing dot is the same host


@given(st.data(), any_of(PRIVATE_V4))
def test_every_spelling_of_a_private_ipv4_address_is_refused(
    data: st.DataObject, address: ipaddress.IPv4Address
) -> None:
    host = data.draw(ipv4_spellings(address))
    assert refused(f"https://{host}/cat.png"), host


@given(st.data(), any_of(PUBLIC_V4))
def test_every_spelling_of_a_public_ipv4_address_passes(
    data: st.DataObject, address: ipaddress.IPv4Address
) -> None:
    host = data.draw(ipv4_spellings(address))
    assert not refused(f"https://{host}/cat.png"), host


@given(any_of(PRIVATE_V6))
def test_non_public_ipv6_addresses_are_refused(address: ipaddress.IPv6Address) -> None:
    assert refused(f"https://[{address}]:443/cat.png"), address
    assert refused(f"https://[{address.exploded.upper()}]/cat.png"), address


@given(any_of(PUBLIC_V6))
def test_public_ipv6_addresses_pass(address: ipaddress.IPv6Address) -> None:
    assert not refused(f"https://[{address}]/cat.png"), address


@given(st.integers(0, 2**32 - 1))
def test_inet_aton_agrees_with_the_dotted_form(n: int) -> None:
    address = ipaddress.IPv4Address(n)
    assert inet_aton(str(address)) == address
    assert inet_aton(str(n)) == address
    assert inet_aton(hex(n)) == address


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "https://169.254.169.254/latest/meta-data/",
    "https://[fd00:ec2::254]/latest/", "https://2852039166/", "https://0xA9FEA9FE/", "https://0251.0376.0251.0376/",
    "https://0x7f.1/", "https://127.1/", "https://0/", "https://[::]/", "https://[::ffff:127.0.0.1]/",
    "https://[::ffff:7f00:1]/", "https://[fe80::1%25eth0]/", "https://100.100.100.200/", "https://255.255.255.255/",
    "https://localhost/", "https://LOCALHOST:8080/x", "https://localhost./", "https://api.localhost/",
    FULLWIDTH_LOCALHOST, "https://metadata.google.internal/computeMetadata/v1/", "https://metadata/",
    "https://instance-data/latest", "https://kubernetes.default.svc/", "https://redis.db.svc.cluster.local/",
    "https://printer.local/", "https://router.home.arpa/",
    # numbers that are not an address inet_aton reads, and hosts no resolver should be handed
    "https://1.2.3.4.5/", "https://08.0.0.1/", "https://256.0.0.1/", "https://0x/", "https://foo.0x7f/",
    "https://%31%32%37.0.0.1/", "https://exa_mple.com%2f/",
])  # fmt: skip
def test_internal_hosts_are_refused(url: str) -> None:
    assert refused(url)


@pytest.mark.parametrize("url", [
    "file:///var/run/secrets/kubernetes.io/serviceaccount/token", "http://example.com/cat.png",
    "ftp://example.com/cat.png", "gopher://example.com:70/_GET", "dict://example.com:11211/stat",
    "ldap://example.com/", "javascript:alert(1)", "jar:https://example.com/x.jar!/", "cat.png", "//example.com/cat.png",
    " https://example.com/cat.png", "\tfile:///etc/passwd", "fi\nle:///etc/passwd", "",
])  # fmt: skip
def test_other_schemes_and_relative_urls_are_refused(url: str) -> None:
    assert refused(url)


@pytest.mark.parametrize("url", [
    "https://example.com\\@127.0.0.1/", "https://user:secret@example.com/cat.png", "https://exa mple.com/",
    "https://example.com/cat.png\n", "https://example.com:99999/", "https:example.com", "https:///cat.png",
])  # fmt: skip
def test_urls_parsers_read_differently_are_refused(url: str) -> None:
    assert refused(url)


@pytest.mark.parametrize("url", [
    "https://example.com/cat.png", "HTTPS://Example.COM/cat.png?size=2#top", "https://img.example.co.uk:8443/a/b",
    "https://xn--bcher-kva.example/cat.png", "https://bücher.example/cat.png", "https://8.8.8.8/cat.png",
    "https://[2606:4700:4700::1111]/cat.png", "https://[::ffff:8.8.8.8]/cat.png",
    "data:image/png;base64,iVBORw0KGgo=", "DATA:image/png;base64,iVBORw0KGgo=",
])  # fmt: skip
def test_public_https_and_data_urls_pass(url: str) -> None:
    assert not refused(url)


def test_the_schemes_are_the_operators() -> None:
    assert refused("data:image/png;base64,AAAA", frozenset({"https"}))
    assert not refused("http://example.com/cat.png", frozenset({"http", "https"}))
    assert refused("http://10.0.0.1/cat.png", frozenset({"http", "https"}))  # hosts are checked for every scheme
    assert refused("https://example.com/cat.png", frozenset())


def test_the_message_names_the_field_and_the_reason_but_never_echoes_much() -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_media_url("file:///etc/passwd", PARAM)
    accepted = "this gateway accepts `data:`, `https:` image URLs."
    assert caught.value.message == f"`{PARAM}` has the scheme 'file'; {accepted}"
    with pytest.raises(InvalidRequest) as caught:
        check_media_url("https://2852039166/", PARAM)
    assert "169.254.169.254" in caught.value.message and "not public" in caught.value.message
    with pytest.raises(InvalidRequest) as caught:
        check_media_url("a" * 100_000 + ":x", PARAM)
    assert len(caught.value.message) < 300


@st.composite
def numeric_hosts(draw: st.DrawFn) -> str:
    """Dot-separated numbers in any base, in range or not: what `inet_aton` may or may not take."""
    count = draw(st.integers(1, 5))
    parts = [_part(draw(st.integers(0, 2**33)), draw(st.sampled_from(["dec", "hex", "HEX", "oct"])))
             for _ in range(count)]  # fmt: skip
    return ".".join(parts)


@given(numeric_hosts())
def test_inet_aton_reads_numbers_as_the_c_library_does(text: str) -> None:
    """The C library (`getaddrinfo` reads a numeric host with it) is the reference."""
    try:
        expected: ipaddress.IPv4Address | None = ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        expected = None
    assert inet_aton(text) == expected
    if expected is not None:
        assert refused(f"https://{text}/") == (not expected.is_global or expected.is_multicast)
    else:
        assert refused(f"https://{text}/")  # a number that is no address is no name either
