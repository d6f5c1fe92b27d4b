"""Documents fetched from the web for ``kb sync``, under a policy that trusts no server.

Every rule, checked at every hop (the first URL and each redirect):

* only ``http`` and ``https``; ``file://`` and every other scheme are refused;
* the host's addresses are resolved once and every one must be global unicast
  under the one address policy (``index.sync.addresses``: IPv4 forms inside
  IPv6 unwrapped) unless ``allow_private``; the request then goes to the
  checked address itself (``Host`` header and TLS server name kept), so a DNS
  answer that changes between the check and the connection (DNS rebinding)
  cannot reach an internal address, and the connected socket's peer is
  checked again before anything is read;
* a URL that cannot be parsed (an unclosed ``[``, a port that is no number, a
  host name IDNA cannot encode) is a refusal with its reason, never a crash;
* a redirect may leave the first URL's host only for a host in ``allow_hosts``;
* ``robots.txt`` of each origin is obeyed (``urllib.robotparser``): missing
  (4xx) allows everything, unreachable (5xx, network) refuses everything;
* timeouts: connecting, each read, and the whole download;
* the body is streamed and cut at ``max_bytes`` (a ``Content-Length`` over it
  is refused before reading);
* only content types the knowledge base reads are kept, and an HTML page served
  where the URL names a document (``.pdf``), or an HTML sign-in form, is
  reported as a login page, not indexed.

A refusal or failure is a ``FetchFailed`` naming the URL and the reason;
``gone`` is set for 404 and 410, which ``kb sync`` treats as a removed page.
"""

from __future__ import annotations

import re
import socket
import time
import urllib.robotparser
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import unquote, urljoin, urlsplit

from index.config import DEFAULT_DOWNLOAD_TIMEOUT, DEFAULT_MAX_UPLOAD_BYTES
from index.errors import KBError
from index.ingest import SUPPORTED_SUFFIXES
from index.sync.addresses import address_refusal, is_ip_address

if TYPE_CHECKING:
    # The HTTP client loads with the first fetch (`kb sync`, a source): not with `kb serve`.
    import httpx

__all__ = [
    "USER_AGENT",
    "FetchFailed",
    "FetchPolicy",
    "Fetched",
    "Fetcher",
    "ascii_host",
    "check_url",
]

USER_AGENT = "slack-kb-sync/1"
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 30.0
DEFAULT_TOTAL_TIMEOUT = DEFAULT_DOWNLOAD_TIMEOUT
DEFAULT_MAX_REDIRECTS = 5
_MAX_ROBOTS_BYTES = 512 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Content types the extractor reads, and the suffix that tells it which one.
_DOCUMENT_TYPES = {
    "text/html": ".html",
    "application/xhtml+xml": ".html",
    "text/plain": ".txt",
    "text/markdown": ".md",
    "text/x-markdown": ".md",
    "text/csv": ".csv",
    "application/pdf": ".pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ".docx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": ".pptx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": ".xlsx",
}
_XML_TYPES = frozenset({"application/xml", "text/xml"})
_PASSWORD_INPUT = re.compile(rb"<input[^>]+type\s*=\s*[\"']?password", re.IGNORECASE)
# Whether a response's content type is wanted: True, or the reason it is not.
_TypeCheck = Callable[[str], "bool | str"]


class FetchFailed(KBError):
    """A URL was refused by the fetch policy or could not be fetched; ``reason`` says which."""

    def __init__(self, url: str, reason: str, *, gone: bool = False) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason
        self.gone = gone


@dataclass(frozen=True)
class FetchPolicy:
    """What a fetch may do.

    Attributes:
        allow_hosts: hosts a redirect (or a sitemap entry) may lead to besides
            the first URL's own.
        allow_private: allow private, loopback and link-local addresses (a
            local test server, an intranet wiki).
        max_bytes: largest body kept.
        connect_timeout, read_timeout, total_timeout: seconds to connect, to
            wait for each read, and for one whole download.
    """

    allow_hosts: frozenset[str] = field(default_factory=frozenset)
    allow_private: bool = False
    max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    total_timeout: float = DEFAULT_TOTAL_TIMEOUT
    max_redirects: int = DEFAULT_MAX_REDIRECTS


@dataclass(frozen=True)
class Fetched:
    """A fetched body: the final URL, its content type, and a file name the extractor understands."""

    url: str
    content_type: str
    body: bytes
    filename: str


def check_url(url: str) -> str:
    """``url`` if it is an absolute http(s) URL with a host.

    Raises:
        FetchFailed: another scheme (``file://`` included) or no host.
    """
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port
    except ValueError as exc:
        # Neither the text before an "@" nor urllib's message (which may quote a piece of a
        # password taken for a port: "http://u:pa/ss@host") is repeated.
        raise FetchFailed(
            _without_userinfo(url), f"it is not a valid URL ({_unparsable(exc)})"
        ) from exc
    if parts.scheme not in {"http", "https"}:
        raise FetchFailed(
            url, f"only http and https URLs are fetched, not {parts.scheme or 'a relative URL'}"
        )
    if not host:
        raise FetchFailed(url, "the URL has no host")
    if parts.username or parts.password:
        # They would be shown in every report and log line that names the URL.
        raise FetchFailed(
            url.replace(parts.netloc, parts.netloc.rpartition("@")[2]),
            "a user name or password in the URL is not supported",
        )
    ascii_host(url, host)
    return url


def ascii_host(url: str, host: str) -> str:
    """``host`` as DNS and the ``Host`` header spell it: an internationalised name in punycode.

    Raises:
        FetchFailed: a name IDNA cannot encode (a label too long, a forbidden character).
    """
    if host.isascii() or ":" in host:
        return host
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise FetchFailed(url, f"its host name {host} is not a valid domain name") from exc


def _unparsable(exc: ValueError) -> str:
    text = str(exc)
    if text == "Invalid IPv6 URL":
        return "a [ without its ], or a ] without its ["
    if "out of range" in text:
        return "its port is out of range"
    if "integer" in text:
        return "its port is not a number"
    return "its host is not a valid name or address"


def _without_userinfo(url: str) -> str:
    """``url`` with everything up to its last ``@`` cut, for a URL too broken to parse.

    Too broken to tell where its authority ends (``http://u:pa/ss@host``), it may hold a
    password anywhere before an ``@``.
    """
    scheme, sep, rest = url.partition("://")
    return f"{scheme}://{rest.rpartition('@')[2]}" if sep else url.rpartition("@")[2]


class Fetcher:
    """Fetches URLs under one ``FetchPolicy``; remembers each origin's robots.txt."""

    def __init__(self, policy: FetchPolicy) -> None:
        import httpx

        self.policy = policy
        timeout = httpx.Timeout(
            connect=policy.connect_timeout,
            read=policy.read_timeout,
            write=policy.read_timeout,
            pool=policy.connect_timeout,
        )
        # trust_env off: no proxy from the environment may route around the address checks.
        self._client = httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False)
        # Per origin: its rules, and why they could not be read ("" when they could).
        self._robots: dict[str, tuple[urllib.robotparser.RobotFileParser, str]] = {}

    def close(self) -> None:
        """Close the connections."""
        self._client.close()

    def fetch(self, url: str, *, xml: bool = False) -> Fetched:
        """Fetch one document (``xml``: a sitemap) under the policy.

        Raises:
            FetchFailed: refused by a rule, or failed (status, network, timeout).
        """
        check_url(url)
        first_host = (urlsplit(url).hostname or "").lower()
        deadline = time.monotonic() + self.policy.total_timeout
        for _ in range(self.policy.max_redirects + 1):
            check_url(url)
            host = (urlsplit(url).hostname or "").lower()
            if host != first_host and host not in self.policy.allow_hosts:
                raise FetchFailed(
                    url, f"redirected to another host ({host}), not allowed (--allow-host {host})"
                )
            parts = urlsplit(url)
            # The address first: a refused host must not even be asked for robots.txt.
            self._checked_address(url, host, parts.port or _default_port(parts.scheme))
            self._check_robots(url, deadline)
            status, headers, body = self._get(url, deadline, self.policy.max_bytes, _wanted(xml))
            if status in _REDIRECTS and "location" in headers:
                url = _redirect(url, headers["location"])
                continue
            return _document(url, status, headers, body, xml)
        raise FetchFailed(url, f"more than {self.policy.max_redirects} redirects")

    # ------------------------------------------------------------------ robots.txt

    def _check_robots(self, url: str, deadline: float) -> None:
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        if origin not in self._robots:
            self._robots[origin] = self._read_robots(origin, deadline)
        robots, unreadable = self._robots[origin]
        if unreadable:
            raise FetchFailed(url, f"robots.txt of the site {unreadable}; nothing is taken from it")
        if not robots.can_fetch(USER_AGENT, url):
            raise FetchFailed(url, "robots.txt of the site disallows it")

    def _read_robots(
        self, origin: str, deadline: float
    ) -> tuple[urllib.robotparser.RobotFileParser, str]:
        """The origin's rules, or why they could not be read (RFC 9309: then nothing is taken)."""
        robots = urllib.robotparser.RobotFileParser()
        url = origin + "/robots.txt"
        first_host = urlsplit(url).hostname
        try:
            for _ in range(self.policy.max_redirects + 1):
                status, headers, body = self._get(url, deadline, _MAX_ROBOTS_BYTES, _any_type)
                if status not in _REDIRECTS or "location" not in headers:
                    break
                url = check_url(_redirect(url, headers["location"]))
                host = urlsplit(url).hostname
                if host != first_host and host not in self.policy.allow_hosts:
                    return robots, f"redirects to another host ({host})"
        except FetchFailed as exc:
            return robots, f"could not be read ({exc.reason})"
        if 400 <= status < 500:
            robots.parse([])  # RFC 9309: no robots.txt, no restriction
        elif status != 200:
            return robots, f"could not be read (the server answered {status})"
        else:
            robots.parse(body.decode("utf-8", errors="replace").splitlines())
        return robots, ""

    # ------------------------------------------------------------------ one request

    def _get(
        self,
        url: str,
        deadline: float,
        max_bytes: int,
        wanted: _TypeCheck,
    ) -> tuple[int, dict[str, str], bytes]:
        """GET ``url`` from its checked address; the body only of a 200 of a wanted type."""
        check_url(url)
        parts = urlsplit(url)
        host = ascii_host(url, parts.hostname or "")
        address = self._checked_address(url, host, parts.port or _default_port(parts.scheme))
        port = f":{parts.port}" if parts.port else ""
        pinned = parts._replace(netloc=f"{_bracketed(address)}{port}").geturl()
        request = self._client.build_request(
            "GET",
            pinned,
            headers={"Host": f"{_bracketed(host)}{port}", "User-Agent": USER_AGENT},
            extensions={"sni_hostname": host} if parts.scheme == "https" else None,
        )
        import httpx  # loaded with the client already

        try:
            response = self._client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise FetchFailed(url, "timed out connecting or waiting for the server") from exc
        except httpx.RemoteProtocolError as exc:
            # A malformed answer, a Location that is no URL among them: httpx says which.
            said = str(exc).rstrip(".") or type(exc).__name__
            raise FetchFailed(url, f"the server's answer is malformed ({said[:200]})") from exc
        except httpx.HTTPError as exc:
            raise FetchFailed(url, f"could not be fetched ({type(exc).__name__})") from exc
        try:
            self._check_peer(url, response)
            headers = {k.lower(): v for k, v in response.headers.items()}
            if response.status_code != 200:
                return response.status_code, headers, b""
            reason = wanted(_content_type(headers))
            if reason is not True:
                raise FetchFailed(url, str(reason))
            return 200, headers, _read_capped(response, url, deadline, max_bytes)
        finally:
            response.close()

    def _checked_address(self, url: str, host: str, port: int) -> str:
        """The first address of ``host``, once every address it has passed the policy."""
        try:
            infos = socket.getaddrinfo(ascii_host(url, host), port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise FetchFailed(url, f"the host {host} could not be resolved") from exc
        addresses = [str(info[4][0]) for info in infos]
        if not addresses:
            raise FetchFailed(url, f"the host {host} has no address")
        if not self.policy.allow_private:
            for address in addresses:
                refusal = address_refusal(address)
                if refusal:
                    what = f"{host} is" if is_ip_address(host) else f"{host} resolves to {address},"
                    raise FetchFailed(
                        url,
                        f"{what} {refusal}, not a public address; "
                        "not fetched (--allow-private allows it)",
                    )
        return addresses[0]

    def _check_peer(self, url: str, response: httpx.Response) -> None:
        """The address the socket is connected to passes the policy too (no proxy, no surprise)."""
        if self.policy.allow_private:
            return
        stream = response.extensions.get("network_stream")
        server = stream.get_extra_info("server_addr") if stream is not None else None
        if not server:
            return  # the transport does not say (a mock); the address checked above stands
        peer = str(server[0])
        refusal = address_refusal(peer)
        if refusal:
            raise FetchFailed(
                url,
                f"the connection reached {peer}, {refusal}, not a public address; "
                "nothing was read (--allow-private allows it)",
            )


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _redirect(url: str, location: str) -> str:
    """The URL a redirect's ``Location`` names, checked (a malformed one is a refusal)."""
    try:
        target = urljoin(url, location)
    except ValueError as exc:
        raise FetchFailed(url, f"it redirects to a URL that is not valid ({exc})") from exc
    return check_url(target)


def _any_type(_content_type: str) -> bool:
    return True


def _wanted(xml: bool) -> _TypeCheck:
    def check(content_type: str) -> bool | str:
        if xml and (content_type in _XML_TYPES or content_type == "text/plain"):
            return True
        if not xml and (
            content_type in _DOCUMENT_TYPES or content_type == "application/octet-stream"
        ):
            return True
        what = "a sitemap" if xml else "a document type the knowledge base reads"
        return f"its content type {content_type or '(none)'} is not {what}"

    return check


def _content_type(headers: dict[str, str]) -> str:
    return headers.get("content-type", "").split(";", 1)[0].strip().lower()


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def _read_capped(response: httpx.Response, url: str, deadline: float, max_bytes: int) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise FetchFailed(url, f"it is {int(declared):,} bytes, over the limit of {max_bytes:,}")
    import httpx  # loaded with the client already

    data = bytearray()
    try:
        for chunk in response.iter_bytes():
            data.extend(chunk)
            if len(data) > max_bytes:
                # Stop reading: the rest of an oversized body is never buffered.
                raise FetchFailed(url, f"it is over the limit of {max_bytes:,} bytes")
            if time.monotonic() > deadline:
                raise FetchFailed(url, "its download took longer than the time allowed")
    except httpx.TimeoutException as exc:
        raise FetchFailed(url, "timed out waiting for the server") from exc
    except httpx.HTTPError as exc:
        raise FetchFailed(url, f"the download broke off ({type(exc).__name__})") from exc
    return bytes(data)


def _document(url: str, status: int, headers: dict[str, str], body: bytes, xml: bool) -> Fetched:
    if status in {404, 410}:
        raise FetchFailed(url, f"the server answered {status} (gone)", gone=True)
    if status != 200:
        raise FetchFailed(url, f"the server answered {status}")
    content_type = _content_type(headers)
    filename = _filename(url, content_type)
    if not xml:
        _refuse_login_page(url, filename, content_type, body)
    return Fetched(url=url, content_type=content_type, body=body, filename=filename)


def _filename(url: str, content_type: str) -> str:
    """The URL's last path segment, with the suffix of its content type when it has none."""
    name = PurePosixPath(unquote(urlsplit(url).path)).name or "index"
    if PurePosixPath(name).suffix.lower() in SUPPORTED_SUFFIXES:
        return name
    return name + _DOCUMENT_TYPES.get(content_type, "")


def _refuse_login_page(url: str, filename: str, content_type: str, body: bytes) -> None:
    html = content_type in {"text/html", "application/xhtml+xml"}
    suffix = PurePosixPath(filename).suffix.lower()
    if html and suffix not in {".html", ".htm"}:
        raise FetchFailed(
            url, f"an HTML page came instead of the {suffix} document (a login page?); not indexed"
        )
    if html and _PASSWORD_INPUT.search(body[:65536]):
        raise FetchFailed(url, "it is a sign-in page (it asks for a password); not indexed")
