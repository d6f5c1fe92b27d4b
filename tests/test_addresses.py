"""The one address policy (``index.sync.addresses``) as ``kb sync`` applies it, with stubbed DNS
and no traffic; and the addresses and URLs an outsider hands over that must end as a reason."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

import index.sync.fetch as fetch_module
from index.errors import DatabaseUnavailable
from index.storage.connect import open_database
from index.sync import address_refusal
from index.sync.fetch import Fetcher, FetchFailed, FetchPolicy
from tests.servers import threaded_http_server

# Each form an attacker used to reach loopback, the cloud metadata address or a private
# network through a name that resolves to it.
REFUSED = {
    "::7f00:1": "IPv4-compatible form of 127.0.0.1",
    "::ffff:0:7f00:1": "SIIT-translated form of 127.0.0.1",
    "::ffff:169.254.169.254": "IPv4-mapped form of 169.254.169.254",
    "64:ff9b::a9fe:a9fe": "NAT64 form of 169.254.169.254",
    "64:ff9b:1::a9fe:a9fe": "a local-use NAT64 address",
    "2002:a9fe:a9fe::1": "6to4 form of 169.254.169.254",
    "2002:0a00:0001::1": "6to4 form of 10.0.0.1",
    # Teredo: server 65.54.227.120, client 127.0.0.1 XORed (0x80fffffe).
    "2001:0:4136:e378:8000:63bf:80ff:fffe": "Teredo client form of 127.0.0.1",
    "2600::5efe:a9fe:a9fe": "ISATAP form of 169.254.169.254",
    "fec0::1": "a site-local address",
    "fc00::1": "a unique local (private) address",
    "fe80::1%eth0": "a link-local address",
    "2001:db8::1": "a documentation address",
    "3fff::1": "a documentation address",
    "ff02::1": "a multicast address",
    "::": "the unspecified address",
    "::1": "a loopback address",
    "100::1": "not in the global unicast range",
    "2001:2::1": "an IETF protocol address",
    "127.0.0.1": "a loopback address",
    "169.254.169.254": "a link-local address",
    "10.1.2.3": "a private address",
    "100.64.0.1": "a shared (carrier-grade NAT) address",
    "0.0.0.0": "an unspecified",
    "192.0.2.1": "a documentation address",
    "198.51.100.7": "a documentation address",
    "203.0.113.9": "a documentation address",
    "224.0.0.1": "a multicast address",
    "255.255.255.255": "a reserved or broadcast address",
}
PUBLIC = ["93.184.215.14", "2606:4700:4700::1111", "64:ff9b::5db8:d70e", "2002:5db8:d70e::1"]


@pytest.mark.parametrize("address", PUBLIC)
def test_a_global_unicast_address_is_allowed(address: str) -> None:
    assert address_refusal(address) is None


@pytest.mark.parametrize("address", ["not-an-address", "1.2.3", ""])
def test_what_is_not_an_address_is_refused(address: str) -> None:
    assert address_refusal(address) == "not an IP address"


class Wire:
    """Stubbed DNS for ``*.test`` names, and every request the fetcher sends, none let out."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: dict[str, list[str]] = {}
        self.sent: list[str] = []
        real = socket.getaddrinfo

        def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
            if host in self.names:
                return [
                    (
                        socket.AF_INET6 if ":" in a else socket.AF_INET,
                        socket.SOCK_STREAM,
                        6,
                        "",
                        (a, port),
                    )
                    for a in self.names[host]
                ]
            return real(host, port, *args, **kwargs)

        def send(client: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
            self.sent.append(str(request.url))
            raise httpx.ConnectError("stubbed: no traffic leaves the test")

        monkeypatch.setattr(fetch_module.socket, "getaddrinfo", getaddrinfo)
        monkeypatch.setattr(httpx.Client, "send", send)


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Wire:
    return Wire(monkeypatch)


def _fetch(url: str, policy: FetchPolicy | None = None) -> FetchFailed:
    fetcher = Fetcher(policy or FetchPolicy())
    try:
        with pytest.raises(FetchFailed) as caught:
            fetcher.fetch(url)
    finally:
        fetcher.close()
    return caught.value


@pytest.mark.parametrize(("address", "why"), sorted(REFUSED.items()))
def test_every_form_of_a_non_public_address_is_refused_before_any_traffic(
    wire: Wire, address: str, why: str
) -> None:
    wire.names["evil.test"] = [address]
    failed = _fetch("http://evil.test/page.html")
    assert f"evil.test resolves to {address}, {why}" in failed.reason
    assert "--allow-private allows it" in failed.reason
    assert wire.sent == [], "nothing is sent to a refused address"


def test_one_refused_address_among_public_ones_refuses_the_host(wire: Wire) -> None:
    wire.names["mixed.test"] = ["93.184.215.14", "64:ff9b::a9fe:a9fe"]
    failed = _fetch("http://mixed.test/page.html")
    assert "NAT64 form of 169.254.169.254" in failed.reason
    assert wire.sent == []


@pytest.mark.parametrize("address", PUBLIC)
def test_a_public_address_is_asked_and_pinned(wire: Wire, address: str) -> None:
    wire.names["public.test"] = [address]
    failed = _fetch("http://public.test/page.html")
    # The stub refused the connection: the policy let the request through, to that address.
    assert "robots.txt of the site could not be read" in failed.reason
    shown = f"[{address}]" if ":" in address else address
    assert wire.sent == [f"http://{shown}/robots.txt"]


def test_an_ipv6_literal_url_is_judged_by_the_policy(wire: Wire) -> None:
    failed = _fetch("http://[::ffff:7f00:1]:8080/x.html")
    assert "::ffff:7f00:1 is IPv4-mapped form of 127.0.0.1" in failed.reason
    assert wire.sent == []


def test_allow_private_keeps_its_meaning(wire: Wire) -> None:
    wire.names["intranet.test"] = ["10.1.2.3"]
    _fetch("http://intranet.test/page.html", FetchPolicy(allow_private=True))
    assert wire.sent == ["http://10.1.2.3/robots.txt"]


# ------------------------------------------------------------------ hops and the peer


@pytest.fixture
def loopback_is_public(monkeypatch: pytest.MonkeyPatch) -> None:
    """127.0.0.1 passes the policy, so the local server plays a public site."""
    real = fetch_module.address_refusal
    monkeypatch.setattr(
        fetch_module, "address_refusal", lambda a: None if a == "127.0.0.1" else real(a)
    )


@pytest.fixture
def server() -> Iterator[tuple[int, list[str]]]:
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            hits.append(self.path)
            if self.path == "/robots.txt":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(302)
            target = {"/to-metadata": "http://metadata.test/latest/", "/broken": "http://[::1"}
            self.send_header("Location", target.get(self.path, "/"))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    with threaded_http_server(Handler) as port:
        yield port, hits


def test_every_redirect_hop_is_checked(
    server: tuple[int, list[str]], loopback_is_public: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, hits = server
    real = socket.getaddrinfo
    monkeypatch.setattr(
        fetch_module.socket,
        "getaddrinfo",
        lambda host, p, *a, **k: (
            [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("64:ff9b::a9fe:a9fe", p, 0, 0))]
            if host == "metadata.test"
            else real(host, p, *a, **k)
        ),
    )
    policy = FetchPolicy(allow_hosts=frozenset({"metadata.test"}), read_timeout=2)
    failed = _fetch(f"http://127.0.0.1:{port}/to-metadata", policy)
    assert failed.url == "http://metadata.test/latest/"
    assert "NAT64 form of 169.254.169.254" in failed.reason
    assert hits == ["/robots.txt", "/to-metadata"], "the first hop went, the second did not"


def test_a_malformed_redirect_is_a_reason(
    server: tuple[int, list[str]], loopback_is_public: None
) -> None:
    port, _hits = server
    failed = _fetch(f"http://127.0.0.1:{port}/broken", FetchPolicy(read_timeout=2))
    # httpx reads the Location before the fetcher does; either way a reason, no traceback.
    assert "Invalid URL in location header" in failed.reason


def test_the_connected_peer_is_checked_too(
    server: tuple[int, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were the resolved address check ever bypassed, the socket's peer still is not."""
    port, _hits = server
    monkeypatch.setattr(Fetcher, "_checked_address", lambda self, url, host, port: "127.0.0.1")
    failed = _fetch(f"http://127.0.0.1:{port}/x.html", FetchPolicy(read_timeout=2))
    assert "the connection reached 127.0.0.1, a loopback address" in failed.reason


# ------------------------------------------------------------------ URLs that do not parse


@pytest.mark.parametrize(
    "url",
    ["http://[::1/x", "http://host:port/x", "http://host:99999/x", "http://u:pa/ss@host/x"],
)
def test_a_url_that_does_not_parse_is_a_reason(wire: Wire, url: str) -> None:
    failed = _fetch(url)
    assert failed.reason.startswith("it is not a valid URL (")
    assert "pa" not in failed.reason and "ss@" not in failed.url, "nothing before an @ is shown"
    assert wire.sent == []


def test_an_idn_host_is_resolved_in_punycode(wire: Wire) -> None:
    wire.names["xn--bcher-kva.test"] = ["127.0.0.1"]
    failed = _fetch("http://bücher.test/page.html")
    assert "bücher.test resolves to 127.0.0.1, a loopback address" in failed.reason


CANARY_PASSWORD = "db-canary-pw"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        (f"postgresql://u:{CANARY_PASSWORD}@[::1/db", "a [ without its ]"),
        (f"postgresql://u:{CANARY_PASSWORD}@host:5x/db", "the port is not a number"),
        ("postgresql://u:db-canary/pw@host/db", "the port is not a number"),
        (f"postgresql://u:{CANARY_PASSWORD}@host:70000/db", "the port is out of range"),
    ],
)
def test_a_database_url_that_does_not_parse_is_a_sentence(
    tmp_path: Path, url: str, why: str
) -> None:
    with pytest.raises(DatabaseUnavailable) as caught:
        open_database(tmp_path, url)
    message = str(caught.value)
    assert message.startswith(f"KB_DATABASE_URL is not a valid URL: {why}")
    assert "canary" not in message, "the password is never repeated"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
