"""``kb sync`` of a folder and of a site, run after run, against real files and a real HTTP server."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
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
from index.records import DocumentRow
from index.sync.fetch import FetchPolicy
from index.sync.sources import SyncSource, load_sources, sync_sources
from tests.docs_factory import text_pdf
from tests.servers import threaded_http_server

LIMIT = 200_000  # KB_MAX_UPLOAD_BYTES in these tests


def page(title: str, body: str) -> bytes:
    return f"<html><head><title>{title}</title></head><body><h1>{title}</h1><p>{body}</p></body></html>".encode()


class Site:
    """What the local server answers: path -> (status, headers, body), changed between runs."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, dict[str, str], bytes]] = {}
        self.hits: list[str] = []
        self.port = 0

    def html(self, path: str, body: bytes) -> None:
        self.routes[path] = (200, {"Content-Type": "text/html; charset=utf-8"}, body)

    def sitemap(self, paths: list[str]) -> None:
        urls = "".join(f"<url><loc>{self.url(p)}</loc></url>" for p in paths)
        xml = f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'
        self.routes["/sitemap.xml"] = (200, {"Content-Type": "application/xml"}, xml.encode())

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def site() -> Iterator[Site]:
    state = Site()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            state.hits.append(self.path)
            if self.path == "/slow.html":
                time.sleep(3)
            if self.path == "/huge.html":
                self._huge()
                return
            status, headers, body = state.routes.get(self.path, (404, {}, b"not here"))
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _huge(self) -> None:
            # No Content-Length: only counting the streamed bytes can stop it.
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"<p>" + b"x" * 65_000 + b"</p>"
            try:
                for _ in range(50):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass  # the client stopped reading, as it should

        def log_message(self, *args: Any) -> None:
            pass

    with threaded_http_server(Handler) as port:
        state.port = port
        yield state


@pytest.fixture(autouse=True)
def small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_MAX_UPLOAD_BYTES", str(LIMIT))


def kb_sync(index_dir: Path, *args: str) -> tuple[Result, dict[str, Any]]:
    result = CliRunner().invoke(main, ["--data-dir", str(index_dir), "sync", *args, "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result, json.loads(result.stdout)


@pytest.fixture
def live_names(embedder: Embedder) -> Callable[[Path], dict[str, DocumentRow]]:
    """The searchable documents of a data dir, by name."""

    def names(index_dir: Path) -> dict[str, DocumentRow]:
        kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
        return {d.name: d for d in kb.documents() if d.state == DocState.INDEXED}

    return names


Names = Callable[[Path], dict[str, "DocumentRow"]]


def test_a_folder_is_kept_in_sync_run_after_run(
    index_dir: Path, tmp_path: Path, live_names: Names
) -> None:
    share = tmp_path / "handbook"
    (share / "policies").mkdir(parents=True)
    (share / "a.md").write_text("# Leave\n\nAnnual leave is 27 days for everyone.\n")
    (share / "policies" / "b.md").write_text("# Travel\n\nTrains under four hours, not planes.\n")
    (share / "c.txt").write_text("The office closes at six on Fridays.\n")
    (share / ".draft.md").write_text("# Draft\n\nNot ready.\n")
    (share / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 100)
    args = [str(share), "--uploader", "U0HANDBOOK", "--scope", "C0HANDBOOK"]

    result, data = kb_sync(index_dir, *args)
    assert result.exit_code == 0, result.output
    report = data["sources"][0]
    assert report["source"] == "handbook"
    assert report["counts"] == {
        "added": 3, "changed": 0, "unchanged": 0, "removed": 0, "failed": 0, "skipped": 1,
    }  # fmt: skip
    docs = live_names(index_dir)
    assert set(docs) == {"handbook › a.md", "handbook › policies › b.md", "handbook › c.txt"}
    assert {(d.uploader, d.scope) for d in docs.values()} == {("U0HANDBOOK", "C0HANDBOOK")}
    old_b = docs["handbook › policies › b.md"].id

    (share / "policies" / "b.md").write_text("# Travel\n\nTrains under six hours, not planes.\n")
    (share / "c.txt").unlink()
    (share / "d.md").write_text("# Parking\n\nPermits are renewed every January.\n")
    result, data = kb_sync(index_dir, *args)
    assert result.exit_code == 0, result.output
    report = data["sources"][0]
    assert (report["added"], report["changed"], report["removed"]) == (
        ["d.md"], ["policies/b.md"], ["c.txt"],
    )  # fmt: skip
    assert report["counts"]["unchanged"] == 1
    docs = live_names(index_dir)
    assert set(docs) == {"handbook › a.md", "handbook › policies › b.md", "handbook › d.md"}
    assert docs["handbook › policies › b.md"].id != old_b

    (share / "a.md").unlink()
    result, data = kb_sync(index_dir, *args, "--dry-run")
    assert result.exit_code == 0 and data["dry_run"] is True
    assert data["sources"][0]["removed"] == ["a.md"]
    assert "handbook › a.md" in live_names(index_dir), "a dry run changes nothing"


def test_an_empty_or_missing_folder_removes_nothing_and_other_sources_still_sync(
    index_dir: Path, tmp_path: Path, live_names: Names
) -> None:
    share = tmp_path / "share"
    share.mkdir()
    (share / "a.md").write_text("# Leave\n\nAnnual leave is 27 days.\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.md").write_text("# Desk\n\nHot desks are booked a day ahead.\n")
    result, _ = kb_sync(index_dir, str(share))
    assert result.exit_code == 0
    (share / "a.md").unlink()
    config = tmp_path / "sync.toml"
    config.write_text(
        f'[[source]]\nid = "share"\nfolder = "{share}"\n\n'
        f'[[source]]\nid = "gone"\nfolder = "{tmp_path / "missing"}"\n\n'
        f'[[source]]\nid = "other"\nfolder = "{other}"\nuploader = "U0OTHER"\n'
    )
    result, data = kb_sync(index_dir, "--config", str(config))
    assert result.exit_code == 1
    by_id = {r["source"]: r for r in data["sources"]}
    assert "lists nothing now" in by_id["share"]["error"]
    assert "does not exist" in by_id["gone"]["error"]
    assert by_id["other"]["added"] == ["x.md"] and by_id["other"]["error"] is None
    assert set(live_names(index_dir)) == {"share › a.md", "other › x.md"}


def test_a_source_id_is_never_reused_for_another_place(
    index_dir: Path, tmp_path: Path, live_names: Names
) -> None:
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.md").write_text(f"# {name}\n\nThe {name} folder's text.\n")
    assert kb_sync(index_dir, str(tmp_path / "one"), "--id", "docs")[0].exit_code == 0
    result, data = kb_sync(index_dir, str(tmp_path / "two"), "--id", "docs")
    assert result.exit_code == 1
    assert "was used for" in data["sources"][0]["error"]
    assert set(live_names(index_dir)) == {"docs › one.md"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('[[source]]\nid = "x"\nfolder = "/tmp"\ncolour = "red"\n', "unknown setting(s) colour"),
        ('[[source]]\nid = "x"\nfolder = "/tmp"\nurls = ["https://a.example"]\n', "exactly one of"),
        ('[[source]]\nid = "../x"\nfolder = "/tmp"\n', "must be 1-64 letters"),
        ('[[source]]\nid = "x"\nurls = ["file:///etc/passwd"]\n', "only http and https"),
        ("[[source]\n", "not valid TOML"),
        ('title = "no sources"\n', "has no [[source]] table"),
        (
            '[[source]]\nid = "x"\nfolder = "/tmp"\nuploader = "source:canvases-C0123"\n',
            "uploader 'source:canvases-C0123' is reserved",
        ),
    ],
)
def test_a_malformed_config_is_refused_before_anything_changes(
    index_dir: Path, tmp_path: Path, content: str, message: str
) -> None:
    config = tmp_path / "sync.toml"
    config.write_text(content)
    result = CliRunner().invoke(
        main, ["--data-dir", str(index_dir), "sync", "--config", str(config)]
    )
    assert result.exit_code == 2 and message in result.output


def test_a_password_in_a_url_is_refused_and_never_shown(index_dir: Path) -> None:
    url = "https://kbuser:canary-sync-password@docs.example.com/sitemap.xml"
    result = CliRunner().invoke(main, ["--data-dir", str(index_dir), "sync", url])
    assert result.exit_code == 2 and "a user name or password in the URL" in result.output
    assert "canary-sync-password" not in result.output and "kbuser" not in result.output


def test_file_urls_are_never_fetched(index_dir: Path) -> None:
    result = CliRunner().invoke(main, ["--data-dir", str(index_dir), "sync", "file:///etc/passwd"])
    assert result.exit_code == 2 and "only http and https URLs are fetched" in result.output


def test_a_site_is_kept_in_sync_under_the_fetch_policy(
    index_dir: Path, site: Site, live_names: Names
) -> None:
    site.routes["/robots.txt"] = (
        200,
        {"Content-Type": "text/plain"},
        b"User-agent: *\nDisallow: /private/\n",
    )
    site.html("/a.html", page("Leave", "Annual leave is 27 days for everyone."))
    site.html("/b.html", page("Travel", "Trains under four hours, not planes."))
    site.html("/c.html", page("Closing", "The office closes at six on Fridays."))
    site.html("/gone.html", page("Lockers", "Lockers are emptied every Friday evening."))
    site.html("/private/x.html", page("Salaries", "Nobody may read this."))
    site.routes["/moved.html"] = (302, {"Location": f"http://localhost:{site.port}/a.html"}, b"")
    site.html("/slow.html", page("Slow", "Arrives too late."))
    site.routes["/logo.png"] = (200, {"Content-Type": "image/png"}, b"\x89PNG\r\n\x1a\n")
    site.html("/report.pdf", b"<html><form action=/login><input type=password></form></html>")
    everything = ["/a.html", "/b.html", "/c.html", "/gone.html", "/private/x.html", "/moved.html",
                  "/huge.html", "/slow.html", "/logo.png", "/report.pdf"]  # fmt: skip
    site.sitemap(everything)
    args = [site.url("/sitemap.xml"), "--id", "site", "--allow-private", "--timeout", "1"]

    result, data = kb_sync(index_dir, *args)
    assert result.exit_code == 1, "failed pages make the exit code non-zero"
    report = data["sources"][0]
    assert report["added"] == [site.url(p) for p in ("/a.html", "/b.html", "/c.html", "/gone.html")]
    reasons = {item.removeprefix(site.url("")): reason for item, reason in _failed(report)}
    assert reasons["/private/x.html"] == "robots.txt of the site disallows it"
    assert reasons["/moved.html"].startswith("redirected to another host (localhost), not allowed")
    assert reasons["/huge.html"] == f"it is over the limit of {LIMIT:,} bytes"
    assert "timed out" in reasons["/slow.html"]
    assert "content type image/png is not a document type" in reasons["/logo.png"]
    assert (
        "an HTML page came instead of the .pdf document (a login page?)" in reasons["/report.pdf"]
    )
    assert "/private/x.html" not in site.hits, "robots.txt is read before the page"
    assert f"site › 127.0.0.1:{site.port} › b.html" in live_names(index_dir)

    site.html("/b.html", page("Travel", "Trains under six hours, not planes."))
    site.routes.pop("/gone.html")
    site.sitemap([p for p in everything if p != "/c.html"])
    result, data = kb_sync(index_dir, *args)
    report = data["sources"][0]
    assert report["changed"] == [site.url("/b.html")]
    assert sorted(report["removed"]) == [site.url("/c.html"), site.url("/gone.html")]
    assert report["counts"]["unchanged"] == 1 and report["counts"]["failed"] == 6
    names = set(live_names(index_dir))
    host = f"site › 127.0.0.1:{site.port}"
    assert names == {f"{host} › a.html", f"{host} › b.html"}


def test_redirects_to_an_allowed_host_are_followed(index_dir: Path, site: Site) -> None:
    site.html("/a.html", page("Leave", "Annual leave is 27 days for everyone."))
    site.routes["/moved.html"] = (302, {"Location": f"http://localhost:{site.port}/a.html"}, b"")
    args = [site.url("/moved.html"), "--allow-private", "--allow-host", "localhost"]
    result, data = kb_sync(index_dir, *args)
    assert result.exit_code == 0, result.output
    assert data["sources"][0]["added"] == [site.url("/moved.html")]


def test_private_addresses_are_refused_unless_allowed(index_dir: Path, site: Site) -> None:
    site.html("/a.html", page("Leave", "Annual leave is 27 days for everyone."))
    result, data = kb_sync(index_dir, site.url("/a.html"))
    assert result.exit_code == 1
    ((_, reason),) = _failed(data["sources"][0])
    assert "127.0.0.1 is a loopback address, not a public address" in reason
    assert site.hits == [], "nothing is sent to a refused address"


def _failed(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["item"], f["reason"]) for f in report["failed"]]


def test_the_example_config_parses() -> None:
    example = Path(__file__).resolve().parents[1] / "deploy" / "sync.example.toml"
    sources = {s.id: s for s in load_sources(example)}
    assert sources["handbook"].folder == Path("/mnt/share/handbook")
    assert sources["engineering"].scope == "C0123456789"
    assert sources["engineering"].allow_hosts == frozenset({"cdn.example.com"})
    assert len(sources["policies"].urls) == 2


def test_a_sitemap_index_is_followed_and_hostile_sitemaps_are_refused(
    index_dir: Path, site: Site, embedder: Embedder
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    site.html("/a.html", page("Leave", "Annual leave is 27 days for everyone."))
    child = (
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f"<url><loc>{site.url('/a.html')}</loc></url>"
        "<url><loc>https://elsewhere.example/x.html</loc></url></urlset>"
    )
    site.routes["/pages.xml"] = (200, {"Content-Type": "application/xml"}, child.encode())
    index = f"<sitemapindex><sitemap><loc>{site.url('/pages.xml')}</loc></sitemap></sitemapindex>"
    site.routes["/index.xml"] = (200, {"Content-Type": "text/xml"}, index.encode())
    bomb = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><urlset>&a;</urlset>'
    site.routes["/bomb.xml"] = (200, {"Content-Type": "application/xml"}, bomb)
    site.routes["/page.xml"] = (200, {"Content-Type": "text/html"}, page("Not", "a sitemap"))
    sources = [
        SyncSource(id="indexed", sitemap=site.url("/index.xml")),
        SyncSource(id="bomb", sitemap=site.url("/bomb.xml")),
        SyncSource(id="html", sitemap=site.url("/page.xml")),
    ]
    reports = {
        r.source: r
        for r in sync_sources(kb, sources, policy=FetchPolicy(allow_private=True, read_timeout=2))
    }
    assert reports["indexed"].added == [site.url("/a.html")]
    assert reports["indexed"].failed == [
        ("https://elsewhere.example/x.html", "on another host than the sitemap; not fetched")
    ]
    assert "declares a DTD or entities" in (reports["bomb"].error or "")
    assert "content type text/html is not a sitemap" in (reports["html"].error or "")
    assert [d.name for d in kb.documents()] == [f"indexed › 127.0.0.1:{site.port} › a.html"]


def test_robots_txt_redirects_are_followed_and_an_unreadable_one_takes_nothing(
    index_dir: Path, site: Site, embedder: Embedder
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    site.routes["/robots.txt"] = (301, {"Location": "/real-robots.txt"}, b"")
    rules = b"User-agent: *\nDisallow: /secret.html\n"
    site.routes["/real-robots.txt"] = (200, {"Content-Type": "text/plain"}, rules)
    site.html("/a.html", page("Leave", "Annual leave is 27 days for everyone."))
    site.html("/secret.html", page("Salaries", "Nobody may read this."))
    source = SyncSource(id="site", urls=(site.url("/a.html"), site.url("/secret.html")))
    policy = FetchPolicy(allow_private=True, read_timeout=2)
    (report,) = sync_sources(kb, [source], policy=policy)
    assert report.added == [site.url("/a.html")]
    assert report.failed == [(site.url("/secret.html"), "robots.txt of the site disallows it")]

    site.routes["/robots.txt"] = (500, {}, b"")
    (report,) = sync_sources(kb, [source], policy=policy)
    reason = "robots.txt of the site could not be read (the server answered 500); nothing is taken from it"
    assert report.failed == [(site.url("/a.html"), reason), (site.url("/secret.html"), reason)]
    assert report.removed == [], "a page that could not be fetched is not a removed page"
    assert len([d for d in kb.documents() if d.state == DocState.INDEXED]) == 1


def test_a_list_of_urls_stays_the_same_source_when_it_grows(
    index_dir: Path, site: Site, embedder: Embedder
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    site.html("/a.html", page("Leave", "Annual leave is 27 days for everyone."))
    site.html("/b.html", page("Travel", "Trains under four hours, not planes."))
    policy = FetchPolicy(allow_private=True, read_timeout=2)
    first = SyncSource(id="pages", urls=(site.url("/a.html"),))
    assert sync_sources(kb, [first], policy=policy)[0].added == [site.url("/a.html")]
    grown = SyncSource(id="pages", urls=(site.url("/a.html"), site.url("/b.html")))
    (report,) = sync_sources(kb, [grown], policy=policy)
    assert (report.added, report.unchanged, report.error) == (
        [site.url("/b.html")],
        [site.url("/a.html")],
        None,
    )


def test_a_source_already_being_synced_is_left_alone(
    index_dir: Path, tmp_path: Path, embedder: Embedder
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    (tmp_path / "share").mkdir()
    (tmp_path / "share" / "a.md").write_text("# Leave\n\nAnnual leave is 27 days.\n")
    source = SyncSource(id="share", folder=tmp_path / "share")
    with kb.store.exclusive("sync-share") as acquired:
        assert acquired
        (report,) = sync_sources(kb, [source], policy=FetchPolicy())
    assert report.error == "another kb sync of this source is running; this one left it alone"
    assert kb.documents() == []
    assert sync_sources(kb, [source], policy=FetchPolicy())[0].added == ["a.md"]


def test_documents_by_their_suffix_are_kept_and_sign_in_pages_are_not(
    index_dir: Path, site: Site, embedder: Embedder
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    pdf = text_pdf(["Expense claims above 50 euros need a receipt. " * 4])
    site.routes["/claims.pdf"] = (200, {"Content-Type": "application/octet-stream"}, pdf)
    form = page("Sign in", '<form method="post"><input name="u"><input type="password" name="p">')
    site.html("/wiki/home", form)
    source = SyncSource(id="wiki", urls=(site.url("/claims.pdf"), site.url("/wiki/home")))
    (report,) = sync_sources(kb, [source], policy=FetchPolicy(allow_private=True))
    assert report.added == [site.url("/claims.pdf")]
    assert report.failed == [
        (site.url("/wiki/home"), "it is a sign-in page (it asks for a password); not indexed")
    ]
    (doc,) = kb.documents()
    assert (doc.name, doc.kind) == (f"wiki › 127.0.0.1:{site.port} › claims.pdf", "pdf")


def test_links_out_of_the_folder_are_skipped(
    index_dir: Path, tmp_path: Path, embedder: Embedder
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    secret = tmp_path / "secret.md"
    secret.write_text("# Keys\n\nThe server's private key.\n")
    (tmp_path / "share").mkdir()
    (tmp_path / "share" / "notes.md").symlink_to(secret)
    source = SyncSource(id="share", folder=tmp_path / "share")
    (report,) = sync_sources(kb, [source], policy=FetchPolicy())
    assert report.skipped == ["notes.md: a link to outside the folder"]
    assert report.added == [] and kb.documents() == []


def test_a_sitemap_index_cannot_lead_to_another_host(
    index_dir: Path, site: Site, embedder: Embedder
) -> None:
    # localhost is the same server under another host name: to kb sync, another site.
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    other = f"http://localhost:{site.port}"
    site.html("/a.html", page("Leave", "Annual leave is 27 days for everyone."))
    site.html("/b.html", page("Salaries", "Another site's page."))
    own = (
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f"<url><loc>{site.url('/a.html')}</loc></url></urlset>"
    )
    foreign = (
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f"<url><loc>{other}/b.html</loc></url></urlset>"
    )
    site.routes["/own.xml"] = (200, {"Content-Type": "application/xml"}, own.encode())
    site.routes["/foreign.xml"] = (200, {"Content-Type": "application/xml"}, foreign.encode())
    index = (
        "<sitemapindex>"
        f"<sitemap><loc>{site.url('/own.xml')}</loc></sitemap>"
        f"<sitemap><loc>{other}/foreign.xml</loc></sitemap>"
        f"<sitemap><loc>{site.url('/foreign.xml')}</loc></sitemap>"
        "</sitemapindex>"
    )
    site.routes["/index.xml"] = (200, {"Content-Type": "text/xml"}, index.encode())
    source = SyncSource(id="site", sitemap=site.url("/index.xml"))
    policy = FetchPolicy(allow_private=True, read_timeout=2)

    (report,) = sync_sources(kb, [source], policy=policy)
    assert report.added == [site.url("/a.html")]
    assert report.failed == [
        (f"{other}/foreign.xml", "a sitemap on another host than the sitemap index; not fetched"),
        (f"{other}/b.html", "on another host than the sitemap; not fetched"),
    ]
    assert site.hits.count("/foreign.xml") == 1, "only the child on the index's own host is read"
    assert "/b.html" not in site.hits
    assert [d.name for d in kb.documents()] == [f"site › 127.0.0.1:{site.port} › a.html"]

    allowed = SyncSource(
        id="site", sitemap=site.url("/index.xml"), allow_hosts=frozenset({"localhost"})
    )
    (report,) = sync_sources(kb, [allowed], policy=policy)
    assert report.failed == [] and sorted(report.added) == [f"{other}/b.html"]


TRAVEL = "# Travel\n\nTrains under four hours, not planes.\n"


def _two_file_share(tmp_path: Path) -> Path:
    """A shared folder of two Markdown documents (a.md on leave, b.md on travel)."""
    share = tmp_path / "share"
    share.mkdir()
    (share / "a.md").write_text("# Leave\n\nAnnual leave is 27 days for everyone.\n")
    (share / "b.md").write_text(TRAVEL)
    return share


def test_a_scope_change_leaves_nothing_in_the_old_scope_when_the_new_copy_fails(
    index_dir: Path, tmp_path: Path, live_names: Names
) -> None:
    share = _two_file_share(tmp_path)
    result, _ = kb_sync(index_dir, str(share), "--scope", "*")
    assert result.exit_code == 0, result.output
    # Narrowed to one channel while one file no longer indexes (now only a heading).
    (share / "b.md").write_text("# Travel\n")
    result, data = kb_sync(index_dir, str(share), "--scope", "C0ONE")
    report = data["sources"][0]
    assert [f["item"] for f in report["failed"]] == ["b.md"]
    assert {name: d.scope for name, d in live_names(index_dir).items()} == {"share › a.md": "C0ONE"}
    # Fixed, it is added in the new scope on the next run.
    (share / "b.md").write_text(TRAVEL)
    result, data = kb_sync(index_dir, str(share), "--scope", "C0ONE")
    assert data["sources"][0]["added"] == ["b.md"]
    assert {d.scope for d in live_names(index_dir).values()} == {"C0ONE"}


def test_a_scope_change_moves_the_documents_and_leaves_none_behind(
    index_dir: Path, tmp_path: Path, live_names: Names
) -> None:
    share = _two_file_share(tmp_path)
    result, _ = kb_sync(index_dir, str(share), "--scope", "C0OLD")
    assert result.exit_code == 0, result.output
    assert {d.scope for d in live_names(index_dir).values()} == {"C0OLD"}

    (share / "b.md").unlink()
    result, data = kb_sync(index_dir, str(share), "--scope", "C0NEW")
    assert result.exit_code == 0, result.output
    report = data["sources"][0]
    assert (report["changed"], report["removed"]) == (["a.md"], ["b.md"])
    docs = live_names(index_dir)
    assert {name: d.scope for name, d in docs.items()} == {"share › a.md": "C0NEW"}

    result, data = kb_sync(index_dir, str(share), "--scope", "C0NEW")
    assert data["sources"][0]["counts"]["unchanged"] == 1
    (share / "a.md").unlink()
    (share / "c.md").write_text("# Parking\n\nPermits are renewed every January.\n")
    result, data = kb_sync(index_dir, str(share), "--scope", "C0NEW")
    assert data["sources"][0]["removed"] == ["a.md"]
    assert set(live_names(index_dir)) == {"share › c.md"}
