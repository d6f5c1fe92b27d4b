"""``kb sync`` of hostile sitemaps: DTDs in any encoding, a sitemap index far too large for one
run, entries that are no URL, against a real HTTP server generating its answers as asked; and
sources on the command line that are IPv6 literals, IDN hosts, bare addresses or broken URLs."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from bot.cli import main
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.models import DocState
from index.sync.fetch import FetchPolicy
from index.sync.sources import SourceReport, SyncSource, sync_sources
from tests.servers import threaded_http_server

NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
POLICY = FetchPolicy(allow_private=True, read_timeout=5)


class Site:
    """Static routes, and a sitemap index of ``children`` sitemaps of ``per_child`` pages each,
    every answer generated when it is asked for (a child's 50,000 entries are never built
    before a request, and never at all unless requested)."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[str, bytes]] = {}
        self.gone: set[str] = set()
        self.hits: list[str] = []
        self.children = 2
        self.per_child = 2
        self.port = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def answer(self, path: str) -> tuple[int, str, Iterator[bytes]]:
        if path in self.gone:
            return 404, "text/plain", iter([b"gone"])
        if path in self.routes:
            content_type, body = self.routes[path]
            return 200, content_type, iter([body])
        if path == "/index.xml":
            return 200, "application/xml", self._index()
        if path.startswith("/child-") and path.endswith(".xml"):
            return 200, "application/xml", self._child(int(path[7:-4]))
        if path.startswith("/p/") and path.endswith(".html"):
            title = path[3:-5].replace("/", " ")
            body = f"<html><head><title>Page {title}</title></head><body><p>Policy page {title} of the handbook.</p></body></html>"
            return 200, "text/html", iter([body.encode()])
        return 404, "text/plain", iter([b"not here"])

    def _index(self) -> Iterator[bytes]:
        yield f"<?xml version='1.0'?><sitemapindex {NS}>".encode()
        for n in range(self.children):
            yield f"<sitemap><loc>{self.url(f'/child-{n}.xml')}</loc></sitemap>".encode()
        yield b"</sitemapindex>"

    def _child(self, n: int) -> Iterator[bytes]:
        yield f"<?xml version='1.0'?><urlset {NS}>".encode()
        batch: list[str] = []
        for i in range(self.per_child):
            batch.append(f"<url><loc>{self.url(f'/p/{n}/{i}.html')}</loc></url>")
            if len(batch) == 1000:
                yield "".join(batch).encode()
                batch = []
        yield ("".join(batch) + "</urlset>").encode()


@pytest.fixture
def site() -> Iterator[Site]:
    state = Site()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            state.hits.append(self.path)
            status, content_type, chunks = state.answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for chunk in chunks:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass

        def log_message(self, *args: Any) -> None:
            pass

    with threaded_http_server(Handler) as port:
        state.port = port
        yield state


@pytest.fixture
def kb(index_dir: Path, embedder: Embedder) -> KnowledgeBase:
    return KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)


def live(kb: KnowledgeBase) -> set[str]:
    return {d.name for d in kb.documents() if d.state == DocState.INDEXED}


def one(kb: KnowledgeBase, source: SyncSource, **kwargs: Any) -> SourceReport:
    (report,) = sync_sources(kb, [source], policy=POLICY, **kwargs)
    return report


def page_name(site: Site, path: str) -> str:
    return f"big › 127.0.0.1:{site.port} › {path.strip('/').replace('/', ' › ')}"


def test_a_huge_sitemap_index_stops_at_the_budget_and_removes_nothing(
    kb: KnowledgeBase, site: Site
) -> None:
    source = SyncSource(id="big", sitemap=site.url("/index.xml"))
    first = one(kb, source)
    assert first.ok, first
    before = {page_name(site, f"/p/{n}/{i}.html") for n in (0, 1) for i in (0, 1)}
    assert live(kb) == before

    # 300 children of 50,000 pages each; the run may read 4 entries (a child and 3 pages).
    site.children, site.per_child = 300, 50_000
    site.gone.add("/p/0/1.html")
    site.hits.clear()
    second = one(kb, source, max_urls=4)
    assert second.truncated is not None
    assert "more than 4 entries" in second.truncated
    assert "nothing was removed" in second.truncated
    assert not second.ok, "a listing read in part is not a run that went through"
    assert second.as_dict()["truncated"] == second.truncated
    assert second.removed == [], "what lies past the budget is not gone"
    assert second.unchanged == [site.url("/p/0/0.html")]
    assert second.added == [site.url("/p/0/2.html")]
    assert second.failed == [
        (
            site.url("/p/0/1.html"),
            "the server answered 404 (gone); not removed while the sitemap is read only in part",
        )
    ]
    assert live(kb) == before | {page_name(site, "/p/0/2.html")}
    sitemaps = [h for h in site.hits if h.endswith(".xml")]
    assert sitemaps == ["/index.xml", "/child-0.xml"], "children are listed only as needed"
    pages = [h for h in site.hits if h.endswith(".html")]
    assert pages == ["/p/0/0.html", "/p/0/1.html", "/p/0/2.html"]

    # A listing read to its end removes what it no longer lists, as before.
    site.children, site.per_child = 2, 2
    site.gone.clear()
    third = one(kb, source)
    assert third.ok and third.truncated is None
    assert third.removed == [site.url("/p/0/2.html")]
    assert live(kb) == before


def test_a_sitemap_over_the_protocols_limit_is_read_in_part(
    kb: KnowledgeBase, site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    import index.sync.sources as sources

    monkeypatch.setattr(sources, "MAX_SITEMAP_URLS", 2)
    site.per_child = 3
    source = SyncSource(id="big", sitemap=site.url("/child-0.xml"))
    report = one(kb, source, dry_run=True)
    assert report.truncated is not None and "more than 2 URLs" in report.truncated
    assert report.added == [site.url("/p/0/0.html"), site.url("/p/0/1.html")]


def _sitemap(site: Site, *paths: str) -> str:
    urls = "".join(f"<url><loc>{site.url(p)}</loc></url>" for p in paths)
    return f"<urlset {NS}>{urls}</urlset>"


@pytest.mark.parametrize(
    "shape",
    ["utf-16 with entities", "utf-16-le with a dtd", "a doctype after a long comment"],
)
def test_a_dtd_is_refused_whatever_the_encoding_or_its_place(
    kb: KnowledgeBase, site: Site, shape: str
) -> None:
    urlset = _sitemap(site, "/p/0/0.html")
    if shape == "utf-16 with entities":
        text = f'<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE urlset [<!ENTITY a "x">]>{urlset}'
        body = text.encode("utf-16")
    elif shape == "utf-16-le with a dtd":
        text = f'<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE urlset SYSTEM "{site.url("/evil.dtd")}">{urlset}'
        body = b"\xff\xfe" + text.encode("utf-16-le")
    else:
        dtd = f'<!DOCTYPE urlset SYSTEM "{site.url("/evil.dtd")}">'
        body = f'<?xml version="1.0"?><!--{"x" * 10_000}-->{dtd}{urlset}'.encode()
    site.routes["/sitemap.xml"] = ("application/xml", body)
    report = one(kb, SyncSource(id="dtd", sitemap=site.url("/sitemap.xml")))
    assert report.error is not None
    assert "declares a DTD or entities; not read" in report.error
    assert site.hits == ["/robots.txt", "/sitemap.xml"], "neither the page nor the DTD fetched"
    assert live(kb) == set()


def test_a_utf16_sitemap_without_a_dtd_is_read(kb: KnowledgeBase, site: Site) -> None:
    text = f'<?xml version="1.0" encoding="UTF-16"?>{_sitemap(site, "/p/0/0.html")}'
    site.routes["/sitemap.xml"] = ("application/xml", text.encode("utf-16"))
    report = one(kb, SyncSource(id="wide", sitemap=site.url("/sitemap.xml")), dry_run=True)
    assert report.ok, report
    assert report.added == [site.url("/p/0/0.html")]


def test_an_entry_that_is_no_url_is_a_reason_and_the_others_still_sync(
    kb: KnowledgeBase, site: Site
) -> None:
    urls = "<url><loc>http://[::1</loc></url><url><loc>http://x:port/a</loc></url>"
    body = _sitemap(site, "/p/0/0.html").replace("</urlset>", urls + "</urlset>")
    site.routes["/sitemap.xml"] = ("application/xml", body.encode())
    report = one(kb, SyncSource(id="odd", sitemap=site.url("/sitemap.xml")), dry_run=True)
    assert report.added == [site.url("/p/0/0.html")]
    assert report.failed == [
        ("http://[::1", "it is not a valid URL (a [ without its ], or a ] without its [)"),
        ("http://x:port/a", "it is not a valid URL (its port is not a number)"),
    ]


def test_broken_xml_is_a_reason(kb: KnowledgeBase, site: Site) -> None:
    site.routes["/sitemap.xml"] = ("application/xml", b"<urlset><url><loc>x</loc></urlset>")
    report = one(kb, SyncSource(id="broken", sitemap=site.url("/sitemap.xml")))
    assert report.error is not None and "is not valid XML (mismatched tag" in report.error


# ------------------------------------------------------------------ sources on the command line


def _kb_sync(index_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--data-dir", str(index_dir), "sync", *args, "--dry-run"])


@pytest.mark.parametrize("arg", ["::1", "[::1]", "fe80::1%eth0", "127.0.0.1"])
def test_a_bare_address_is_told_to_become_a_url(index_dir: Path, arg: str) -> None:
    result = _kb_sync(index_dir, arg)
    assert result.exit_code == 2, result.output
    assert f"{arg} is an IP address, not a folder or a URL" in result.output
    assert "http://" in result.output


def test_an_ipv6_literal_url_is_a_source(index_dir: Path) -> None:
    result = _kb_sync(index_dir, "http://[2001:db8::1]/handbook.html", "--json")
    assert result.exit_code == 1, result.output  # refused by the address policy, not a usage error
    (source,) = json.loads(result.stdout)["sources"]
    assert source["source"] == "2001-db8-1"
    assert "2001:db8::1 is a documentation address" in source["failed"][0]["reason"]


def test_an_idn_host_is_a_source(index_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> list[Any]:
        asked.append(host)
        raise socket.gaierror("stubbed: no such name")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    result = _kb_sync(index_dir, "https://bücher.example/sitemap.xml", "--json")
    assert result.exit_code == 1, result.output
    (source,) = json.loads(result.stdout)["sources"]
    assert source["source"] == "xn--bcher-kva.example"
    assert source["error"] == "the host bücher.example could not be resolved"
    assert asked == ["xn--bcher-kva.example"]


@pytest.mark.parametrize("arg", ["http://[::1/x", "https://host:port/sitemap.xml"])
def test_a_url_that_does_not_parse_is_a_usage_error_with_its_reason(
    index_dir: Path, arg: str
) -> None:
    result = _kb_sync(index_dir, arg)
    assert result.exit_code == 2
    assert "it is not a valid URL" in result.output
    assert "Traceback" not in result.output
