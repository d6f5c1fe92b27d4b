"""Near-copies: one document in several formats is told, different documents are not.

The sample handbook's expenses page as a PDF export (lines wrapped, long words
hyphenated at line ends, a running header and page numbers), as a Word file and
as an HTML page, built with the same tools as ``bench/near_copies.py``; the
other sample pages are different documents on the same company's subjects. On
a real knowledge base, on SQLite and on Postgres (``tests.postgres``).
"""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.near_copies import as_docx, as_html, as_pdf
from bot.cli import main
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.near_copies import NEAR_COPY_THRESHOLD, signature, similarities, words
from tests.conftest import SAMPLE
from tests.postgres import StoreImage, store_image

HANDBOOK = (SAMPLE / "expenses.md").read_text()
OTHERS = ("oncall.md", "vpn.md", "deploys.md")


def test_words_are_compared_without_what_formats_change() -> None:
    text = (
        "Sub-\nmit the E-mail re\u00ad\nceipt, NOW!\n\nSee [the page](/docs/claims "
        '"Claims") or https://example.com/x?a=1 and www.example.com.'
    )
    expected = "submit the email receipt now see the page or and"
    assert words(text) == expected.split(" ")


@pytest.mark.parametrize("shape", ["a.", "a-", "a-\n", '](a "', "www.a ", "http://"])
def test_a_hostile_text_is_signed_in_time_linear_in_its_length(shape: str) -> None:
    """Shapes that make a backtracking pattern try again from each of their marks: a
    document is a member's. Tenths of a second each; an address pattern that started
    at every word took minutes on the first."""
    started = time.perf_counter()
    signature(shape * 50_000)
    took = time.perf_counter() - started
    assert took < 5.0, took


def test_a_text_of_many_short_words_is_signed_in_memory_a_few_times_its_size() -> None:
    """A member's text file of the upload limit's size holding millions of two-letter words:
    signing it holds its words as 64-bit hashes, never as millions of string objects at once
    (was: 30 times the text's size, and 850 MB for 20 MB)."""
    pairs = [a + b for a in "abcdefghijklmnopqrstuvwxyz" for b in "abcdefghijklmnopqrstuvwxyz"]
    text = " ".join(pairs[(i * 7919) % len(pairs)] for i in range(600_000))  # 1.8 MB
    tracemalloc.start()
    try:
        assert signature(text) is not None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 14 * len(text)  # was 30 times


def test_the_pdf_export_of_a_page_is_a_near_copy_of_its_markdown_and_a_version_too() -> None:
    page, pdf = signature(HANDBOOK), signature(_pdf_text())
    assert page is not None and pdf is not None
    assert similarities(page.minhash, [pdf.minhash])[0] >= NEAR_COPY_THRESHOLD
    changed = HANDBOOK.replace("within 30 days of the expense", "within 45 days of the expense")
    version = signature(changed)
    assert version is not None and version.minhash != page.minhash
    assert similarities(page.minhash, [version.minhash])[0] >= NEAR_COPY_THRESHOLD
    for name in OTHERS:
        other = signature((SAMPLE / name).read_text())
        assert other is not None
        assert similarities(page.minhash, [other.minhash])[0] < NEAR_COPY_THRESHOLD, name


def _pdf_text() -> str:
    from index.ingest.extract import extract

    return extract(as_pdf(HANDBOOK), "expenses.pdf").text


def _formats(data_dir: Path, embedder: Embedder, database_url: str) -> KnowledgeBase:
    """The expenses page as a PDF, the other sample pages, then its Word file and HTML page."""
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir, database_url=database_url), embedder=embedder)
    files = {"expenses.pdf": as_pdf(HANDBOOK)}
    files |= {name: (SAMPLE / name).read_bytes() for name in OTHERS}
    files |= {"expenses.docx": as_docx(HANDBOOK), "expenses.html": as_html(HANDBOOK)}
    for name, data in files.items():
        assert kb.ingest_bytes(data, name).document.state == "indexed", name
    return kb


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def formats_image(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, embedder: Embedder
) -> StoreImage:
    """``_formats`` built once for the module on SQLite and on Postgres (``tests.postgres``)."""
    data_dir = tmp_path_factory.mktemp("formats-kb")
    return store_image(request, data_dir, lambda url: _formats(data_dir, embedder, url))


@pytest.fixture
def formats_kb(
    formats_image: StoreImage,
    store_copy: Callable[[StoreImage], str],
    index_dir: Path,
    embedder: Embedder,
) -> KnowledgeBase:
    """A copy of ``formats_image`` in ``index_dir``: as if ``_formats`` had run in this test."""
    url = store_copy(formats_image)
    return KnowledgeBase(IndexConfig(data_dir=index_dir, database_url=url), embedder=embedder)


def test_a_page_in_other_formats_is_told_and_the_other_pages_are_not(
    formats_kb: KnowledgeBase,
) -> None:
    kb = formats_kb
    ids = {d.name: d.id for d in kb.documents()}
    formats = {ids["expenses.pdf"], ids["expenses.docx"], ids["expenses.html"]}
    for doc_id in formats:
        assert {d.id for d in kb.near_copies(doc_id)} == formats - {doc_id}
        # None of them is a copy passage for passage: only near-copies tell them.
        assert kb.copies(doc_id) == []
    for name in OTHERS:
        assert kb.near_copies(ids[name]) == [], name
    # Removed, a document is nobody's near-copy any more.
    kb.remove(ids["expenses.html"])
    assert [d.id for d in kb.near_copies(ids["expenses.docx"])] == [ids["expenses.pdf"]]


def test_repeats_name_a_copy_once_as_a_copy_and_the_other_formats_as_near_copies(
    formats_kb: KnowledgeBase,
) -> None:
    kb = formats_kb
    ids = {d.name: d.id for d in kb.documents()}
    resaved = kb.ingest_bytes(HANDBOOK.encode(), "expenses.md").document
    copy = kb.ingest_bytes(HANDBOOK.encode() + b"\n\n", "expenses copy.md").document
    found = kb.repeats_of([copy.id, ids["vpn.md"]])
    assert list(found) == [copy.id]
    # The Word file reads into the page's very passages: a copy, named once, as a copy.
    assert [d.id for d in found[copy.id].same] == [resaved.id, ids["expenses.docx"]]
    assert {d.id for d in found[copy.id].near} == {ids["expenses.pdf"], ids["expenses.html"]}


def test_documents_indexed_before_signatures_are_signed_when_the_store_is_upgraded(
    formats_kb: KnowledgeBase, index_dir: Path, embedder: Embedder
) -> None:
    """The store as the release before this one left it: no signature columns, the
    migration not recorded. Opening it adds them and signs every document from its text."""
    kb = formats_kb
    database_url = kb.config.database_url
    ids = {d.name: d.id for d in kb.documents()}
    recorded = "_kb_migrations" if database_url else "_sqlite_migrations"
    with kb.store.transaction() as db:
        db.execute("DROP INDEX texts_near_shingles")
        db.execute("ALTER TABLE texts DROP COLUMN near_minhash")
        db.execute("ALTER TABLE texts DROP COLUMN near_shingles")
        db.execute(f"DELETE FROM {recorded} WHERE name = ?", ["0025_near_copy_signatures"])
    kb.store.close()
    upgraded = KnowledgeBase(
        IndexConfig(data_dir=index_dir, database_url=database_url), embedder=embedder
    )
    assert {d.id for d in upgraded.near_copies(ids["expenses.pdf"])} == {
        ids["expenses.docx"],
        ids["expenses.html"],
    }
    assert upgraded.near_copies(ids["vpn.md"]) == []


def test_kb_ingest_names_the_near_copies_of_a_file_beside_its_copies(tmp_path: Path) -> None:
    data_dir, folder = tmp_path / "kb", tmp_path / "files"
    folder.mkdir()
    (folder / "expenses.pdf").write_bytes(as_pdf(HANDBOOK))
    (folder / "vpn.md").write_bytes((SAMPLE / "vpn.md").read_bytes())
    _cli(data_dir, "ingest", str(folder))
    (tmp_path / "expenses.html").write_bytes(as_html(HANDBOOK))
    text = _cli(data_dir, "ingest", "--scope", "C0TEAM0001", str(tmp_path / "expenses.html"))
    title = json.loads(_cli(data_dir, "docs", "--json"))[0]["title"] or "expenses.pdf"
    assert [line for line in text.splitlines() if line.startswith(("near", "repeats"))] == [
        f"near     expenses.html: nearly the same text as {title} (id 1, scope *)"
    ]
    (tmp_path / "vpn copy.md").write_bytes((SAMPLE / "vpn.md").read_bytes() + b"\n")
    data = json.loads(_cli(data_dir, "ingest", "--json", str(tmp_path / "vpn copy.md")))
    assert data["near"] == [] and [c["id"] for c in data["repeats"][0]["copies"]] == [2]


def _cli(data_dir: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["--data-dir", str(data_dir), *args])
    assert result.exit_code == 0, result.output
    return result.stdout
