"""Chunking (strategy E): offsets found in the text, nothing lost, headers, windows."""

from __future__ import annotations

import re
import shutil
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from index.embed import Embedder
from index.ingest.chunk import CHUNKER_VERSION, chunk_document, heading_title
from index.ingest.extract import EXTRACTOR_VERSION
from index.ingest.pipeline import PIPELINE_VERSION
from index.models import Chunking, Extracted
from index.records import Stamp
from index.storage.store import Store

# --- an independent reading of the rules, line by line, used as the oracle

_ORACLE_HEADING = re.compile(r" {0,3}(#{1,6})[ \t]+(.*)")
_ORACLE_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")


def oracle_headings(text: str, kind: str) -> list[tuple[int, int, int, str]]:
    """``(line start, line end, level, title)`` of every heading line."""
    if kind not in ("md", "html"):
        return []
    out = []
    fence: str | None = None
    pos = 0
    for line in text.split("\n"):
        start, pos = pos, pos + len(line) + 1
        m = _ORACLE_FENCE.fullmatch(line)
        if fence is not None:
            if m and m[1][0] == fence[0] and len(m[1]) >= len(fence) and not m[2].strip():
                fence = None
            continue
        if m and not (m[1][0] == "`" and "`" in m[2]):
            fence = m[1]
            continue
        h = _ORACLE_HEADING.fullmatch(line)
        if h:
            out.append((start, start + len(line), len(h[1]), heading_title(h[2])))
    return out


def oracle_paths(doc: Extracted) -> list[tuple[int, list[str]]]:
    """``(offset, section path)`` in force from each heading line's end."""
    stack: list[tuple[int, str]] = []
    paths: list[tuple[int, list[str]]] = [(0, [])]
    for _, end, level, title in oracle_headings(doc.text, doc.kind):
        stack = [(lv, t) for lv, t in stack if lv < level] + [(level, title)]
        path = [
            t
            for lv, t in stack
            if t and not (lv == 1 and t.casefold() == " ".join(doc.title.split()).casefold())
        ]
        paths.append((end, path))
    return paths


def oracle_paragraphs(
    text: str, headings: list[tuple[int, int, int, str]]
) -> list[tuple[int, int]]:
    """Stripped spans of runs of non-blank lines, never across a heading line."""
    heading_starts = {h[0] for h in headings}
    out: list[tuple[int, int]] = []
    run: tuple[int, int] | None = None
    pos = 0
    for line in text.split("\n"):
        start, pos = pos, pos + len(line) + 1
        if line.strip() and start not in heading_starts:
            s = start + len(line) - len(line.lstrip())
            e = start + len(line.rstrip())
            run = (run[0], e) if run else (s, e)
        else:
            if run:
                out.append(run)
            run = None
    if run:
        out.append(run)
    return out


def check_content(doc: Extracted, result: Chunking, budget: int) -> None:
    """Offsets, stripping, order, budget, nothing lost, nothing from heading lines."""
    text, chunks = doc.text, result.chunks
    headings = oracle_headings(text, doc.kind)
    # 1 and 2: offsets, stripped content, order, no overlap
    for i, c in enumerate(chunks):
        assert c.ordinal == i
        assert text[c.start : c.end] == c.content
        assert c.content and c.content == c.content.strip()
        assert c.text.endswith("\n" + c.content)
        if i:
            assert chunks[i - 1].end <= c.start
    # 6: the budget holds (a long word is cut hard, so it holds always)
    assert all(len(c.content) <= budget for c in chunks)
    # 3: no text lost outside heading lines
    covered = bytearray(len(text) + 1)
    for c in chunks:
        covered[c.start : c.end] = b"\x01" * (c.end - c.start)
    for s, e, _, _ in headings:
        covered[s:e] = b"\x01" * (e - s)
    lost = [i for i, ch in enumerate(text) if not ch.isspace() and not covered[i]]
    assert not lost, f"lost characters at {lost[:10]}"
    # 4: no chunk reaches into a heading line (so none crosses a section)
    for s, e, _, _ in headings:
        assert not any(c.start < e and c.end > s for c in chunks)


def check_invariants(doc: Extracted, result: Chunking, budget: int) -> None:
    """Every invariant of the chunker without a token counter."""
    check_content(doc, result, budget)
    chunks = result.chunks
    # 5: header and section
    paths = oracle_paths(doc)
    for c in chunks:
        path = paths[bisect_right([p[0] for p in paths], c.start) - 1][1]
        assert c.section == " > ".join(path)
        assert c.text == " > ".join([doc.title, *path]) + "\n" + c.content
    # never cut inside a paragraph that fits the budget (pages are hard
    # boundaries: a paragraph running over a page break is cut there)
    page_cuts = set(doc.page_starts or ())
    for s, e in oracle_paragraphs(doc.text, oracle_headings(doc.text, doc.kind)):
        if e - s <= budget and not any(s < p < e for p in page_cuts):
            assert any(c.start <= s and e <= c.end for c in chunks), (s, e)
    # 8: page of the start, and every chunk on one page
    for c in chunks:
        expected = bisect_right(doc.page_starts, c.start) if doc.page_starts else None
        assert c.page == expected
        assert not any(c.start < p < c.end for p in page_cuts)


# --- generated documents

_VOCAB = [
    "the", "policy", "é", "naïve", "中文", "ERR_42", "v2.3", "a", "x" * 40, "w" * 90,
    "end.", "why?", "wow!", "etc…", "(done.)", "句子。", "“quoted.”", "#tag", "~~", "``",
]  # fmt: skip
# Word separators inside a paragraph: spaces, tabs, single line breaks.
_GAP = st.sampled_from([" ", " ", " ", "  ", "\t", "\n", " \n  "])


@st.composite
def paragraphs(draw: st.DrawFn) -> str:
    words = draw(st.lists(st.tuples(st.sampled_from(_VOCAB), _GAP), min_size=1, max_size=40))
    indent = draw(st.sampled_from(["", " ", "  "]))
    return indent + "".join(w + gap for w, gap in words).rstrip("\n")


@st.composite
def headings(draw: st.DrawFn) -> str:
    level = draw(st.integers(1, 6))
    indent = draw(st.sampled_from(["", " ", "   "]))
    words = draw(
        st.lists(st.sampled_from(["Setup", "guide", "é", "Runbook", "#", "x" * 300]), max_size=4)
    )
    closing = draw(st.sampled_from(["", " ##", " #  "]))
    return f"{indent}{'#' * level}{draw(st.sampled_from([' ', '  ', chr(9)]))}{' '.join(words)}{closing}"


@st.composite
def fences(draw: st.DrawFn) -> str:
    marker = draw(st.sampled_from(["```", "~~~", "````", "~~~~~"]))
    info = draw(st.sampled_from(["", "python", " sh"]))
    body = draw(
        st.lists(
            st.sampled_from(["# not a heading", "## nor this", "", "x = 1", "   ", "```", "~~~ x"]),
            max_size=6,
        )
    )
    closed = draw(st.booleans())
    return "\n".join([marker + info, *body] + ([marker] if closed else []))


@st.composite
def markdown_docs(draw: st.DrawFn) -> Extracted:
    block = st.one_of(paragraphs(), paragraphs(), headings(), fences(), st.just("   "))
    sep = st.sampled_from(["\n", "\n\n", "\n\n\n", "\n \t\n"])
    blocks = draw(st.lists(st.tuples(block, sep), max_size=14))
    text = draw(st.sampled_from(["", "\n", "  \n"])) + "".join(b + s for b, s in blocks)
    title = draw(st.sampled_from(["Guide", "setup", "Runbook é"]))
    kind = draw(st.sampled_from(["md", "md", "html", "txt"]))
    return Extracted(text=text, title=title, kind=kind)


@st.composite
def raw_docs(draw: st.DrawFn) -> Extracted:
    """Any text from a small alphabet full of Markdown's special characters."""
    text = draw(st.text(alphabet="ab #`~.!?\n\t é\u3000", max_size=300))
    kind = draw(st.sampled_from(["md", "html", "txt", "pdf"]))
    page_starts = None
    if kind == "pdf":
        cuts = draw(st.lists(st.integers(1, max(1, len(text))), max_size=4))
        page_starts = tuple(sorted({0, *cuts}))
    return Extracted(text=text, title="# Title", kind=kind, page_starts=page_starts)


_PROPERTY = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_PROPERTY
@given(doc=markdown_docs(), budget=st.sampled_from([1, 7, 25, 60, 150, 512]))
def test_invariants_on_generated_markdown(doc: Extracted, budget: int) -> None:
    check_invariants(doc, chunk_document(doc, budget=budget), budget)


@_PROPERTY
@given(doc=raw_docs(), budget=st.integers(1, 80))
def test_invariants_on_arbitrary_text(doc: Extracted, budget: int) -> None:
    check_invariants(doc, chunk_document(doc, budget=budget), budget)


def _fake_counter(text: str) -> int:
    """A stand-in tokenizer: 2 special tokens, about one piece per 3 UTF-8 bytes."""
    return 2 + (len(text.encode("utf-8")) + 2) // 3


@_PROPERTY
@given(doc=markdown_docs(), budget=st.sampled_from([40, 150, 512]), window=st.integers(12, 80))
def test_window_fit_keeps_invariants(doc: Extracted, budget: int, window: int) -> None:
    result = chunk_document(doc, budget=budget, count_tokens=_fake_counter, max_tokens=window)
    assert all(_fake_counter(c.text) <= window for c in result.chunks)
    check_content(doc, result, budget)


# --- examples


def md(text: str, title: str = "Guide") -> Extracted:
    return Extracted(text=text, title=title, kind="md")


def test_text_before_the_first_heading_is_kept_with_an_empty_section() -> None:
    doc = md("Preamble line.\n\n## Setup\n\nInstall it.\n")
    chunks = chunk_document(doc).chunks
    assert [(c.content, c.section) for c in chunks] == [
        ("Preamble line.", ""),
        ("Install it.", "Setup"),
    ]
    assert chunks[0].text == "Guide\nPreamble line."
    assert chunks[1].text == "Guide > Setup\nInstall it."


def test_a_document_without_headings_is_one_section() -> None:
    doc = Extracted(text="# not a heading in txt\n\nSecond paragraph.", title="notes", kind="txt")
    chunks = chunk_document(doc).chunks
    assert len(chunks) == 1
    assert chunks[0].content == doc.text
    assert chunks[0].section == ""


def test_header_follows_the_heading_stack_and_skips_the_title_heading() -> None:
    doc = md(
        "# Guide\n\nIntro.\n\n## Install\n\n### Linux\n\nApt.\n\n## Use ##\n\nRun.\n\n"
        "# Appendix\n\nMore.\n"
    )
    got = [(c.section, c.text) for c in chunk_document(doc).chunks]
    assert got == [
        ("", "Guide\nIntro."),
        ("Install > Linux", "Guide > Install > Linux\nApt."),
        ("Use", "Guide > Use\nRun."),
        ("Appendix", "Guide > Appendix\nMore."),
    ]


def test_fenced_code_lines_are_content_not_headings() -> None:
    doc = md("## Deploy\n\n```sh\n# build first\nmake\n\n# then ship\n```\n\n~~~\n## still code\n")
    chunks = chunk_document(doc).chunks
    assert {c.section for c in chunks} == {"Deploy"}
    joined = "\n".join(c.content for c in chunks)
    assert "# build first" in joined and "# then ship" in joined and "## still code" in joined


def test_a_code_block_with_blank_lines_is_packed_as_one_paragraph() -> None:
    doc = md("Intro text here.\n\n```\n# a\n\n# b\n```")
    assert [c.content for c in chunk_document(doc, budget=28).chunks] == [
        "Intro text here.",
        "```\n# a\n\n# b\n```",
    ]


def test_not_headings() -> None:
    doc = md("#hashtag\n\n    # indented code\n\n####### seven\n\n#\n")
    chunks = chunk_document(doc).chunks
    assert "".join(c.content for c in chunks).count("#") == 1 + 1 + 7 + 1


def test_only_headings_give_no_chunks_and_a_note() -> None:
    result = chunk_document(md("# Guide\n\n## A\n\n### B\n"))
    assert result.chunks == []
    assert result.notes and "no chunks" in result.notes[0]


def test_paragraphs_are_packed_whole_and_never_cut() -> None:
    paras = ["Alpha " * 10, "Beta " * 10, "Gamma " * 10]  # 60, 50, 60 characters
    doc = md("\n\n".join(p.strip() for p in paras))
    chunks = chunk_document(doc, budget=120).chunks
    assert [c.content for c in chunks] == [
        paras[0].strip() + "\n\n" + paras[1].strip(),
        paras[2].strip(),
    ]


def test_an_oversized_paragraph_is_cut_at_sentence_ends() -> None:
    sentence = "The service restarts nightly at two. "
    doc = md((sentence * 30).strip())
    chunks = chunk_document(doc, budget=200).chunks
    assert len(chunks) > 1
    assert all(c.content.endswith(".") for c in chunks)
    assert all(len(c.content) <= 200 for c in chunks)


def test_a_word_longer_than_the_budget_is_cut_hard_with_contiguous_offsets() -> None:
    doc = md("short " + "x" * 250 + " tail")
    result = chunk_document(doc, budget=100)
    pieces = [c for c in result.chunks if set(c.content) == {"x"}]
    assert [len(c.content) for c in pieces] == [100, 100, 50]
    assert pieces[0].end == pieces[1].start and pieces[1].end == pieces[2].start
    assert any("cut mid-word" in n for n in result.notes)


def test_repeated_paragraphs_get_their_own_offsets() -> None:
    doc = md("Same words.\n\nSame words.\n\nSame words.")
    chunks = chunk_document(doc, budget=11).chunks
    assert [c.start for c in chunks] == [0, 13, 26]


def test_page_is_the_page_of_the_start() -> None:
    pages = ["First page text.", "Second page text.", "Third."]
    text = "\n\n".join(pages)
    starts = (0, len(pages[0]) + 2, len(pages[0]) + len(pages[1]) + 4)
    doc = Extracted(text=text, title="Report", kind="pdf", page_starts=starts)
    chunks = chunk_document(doc, budget=20).chunks
    assert [(c.content, c.page) for c in chunks] == [(p, i + 1) for i, p in enumerate(pages)]
    assert all(c.page is None for c in chunk_document(md(text)).chunks)


def test_a_bad_budget_is_refused() -> None:
    with pytest.raises(ValueError):
        chunk_document(md("x"), budget=0)


def test_version_is_stamped_on_documents_and_a_bump_makes_them_stale(
    fixture_data_dir: Path, tmp_path: Path
) -> None:
    # Documents the product's ingestion indexed (tests/conftest_bot.py), on a
    # copy: the session's fixture stays untouched.
    store = Store(shutil.copytree(fixture_data_dir, tmp_path / "kb"))
    docs = store.documents()
    assert docs and all(CHUNKER_VERSION in d.pipeline_version for d in docs)
    first = docs[0]
    current = Stamp(
        embedding_model=first.embedding_model,
        dimensions=first.dimensions,
        pipeline_version=PIPELINE_VERSION,
        extractor_version=EXTRACTOR_VERSION,
    )
    assert store.stale_documents(current) == []
    # What the stamp becomes once CHUNKER_VERSION is bumped: every document is then stale.
    bumped = PIPELINE_VERSION.replace(CHUNKER_VERSION, CHUNKER_VERSION + "-next")
    stale = store.stale_documents(replace(current, pipeline_version=bumped))
    assert [d.id for d in stale] == [d.id for d in docs]


# --- the encoder window, with the real tokenizer


def _window_check(doc: Extracted, embedder: Embedder) -> Chunking:
    result = chunk_document(doc, count_tokens=embedder.count_tokens, max_tokens=embedder.max_tokens)
    assert all(embedder.count_tokens(c.text) <= embedder.max_tokens for c in result.chunks)
    check_content(doc, result, 512)
    return result


def test_dense_scripts_are_split_to_fit_the_window(embedder: Embedder) -> None:
    chinese = "这是一个关于公司报销政策的句子，员工需要在三十天内提交发票" * 4
    doc = Extracted(text="。".join([chinese] * 12), title="报销", kind="txt")
    result = _window_check(doc, embedder)
    assert result.window_splits > 0
    assert any("encoder window" in n for n in result.notes)


def test_numbers_and_identifiers_fit_the_window(embedder: Embedder) -> None:
    text = " ".join(f"ERR_{i * 7919 % 100003}:{i * 31337 % 999983}" for i in range(400))
    result = _window_check(Extracted(text=text, title="codes", kind="txt"), embedder)
    assert result.window_splits > 0


def test_a_huge_title_still_leaves_room_for_content(embedder: Embedder) -> None:
    doc = Extracted(text="Some words here. " * 60, title="Very long title " * 300, kind="txt")
    result = _window_check(doc, embedder)
    assert result.chunks
    assert all(c.text.endswith("\n" + c.content) for c in result.chunks)


def test_plain_english_needs_no_window_split(embedder: Embedder) -> None:
    text = "\n\n".join("Expense reports are due by the fifth of each month. " * 8 for _ in range(5))
    result = _window_check(md(text), embedder)
    assert result.window_splits == 0


# --- speed


def _timed(doc: Extracted, count_tokens: Callable[[str], int] | None = None) -> float:
    # This process's CPU time, not the clock's: a quadratic chunker takes minutes of it,
    # while other work on a shared machine only stretches the wall clock.
    started = time.process_time()
    result = chunk_document(doc, count_tokens=count_tokens)
    elapsed = time.process_time() - started
    assert result.chunks
    return elapsed


def test_a_5mb_single_line_chunks_fast() -> None:
    line = ("The quick brown fox jumps over the lazy dog. " * 120_000)[:5_000_000]
    assert _timed(Extracted(text=line, title="big", kind="txt")) < 5
    assert _timed(Extracted(text="x" * 5_000_000, title="blob", kind="txt")) < 5
    assert _timed(Extracted(text="word " * 1_000_000, title="words", kind="md")) < 5


def test_a_2mb_markdown_document_chunks_fast() -> None:
    section = "## Part\n\nSome text about the part. It has sentences.\n\n```\n# code\n\nx\n```\n\n"
    text = "# Big\n\n" + section * (2_000_000 // len(section))
    assert _timed(md(text, title="Big")) < 5


def test_a_large_document_with_the_tokenizer_is_still_quick(embedder: Embedder) -> None:
    text = ("Payroll runs on the last business day. " * 30 + "\n\n") * 800  # ~1 MB
    assert _timed(md(text), embedder.count_tokens) < 10


def test_pdf_chunks_never_straddle_a_page() -> None:
    pages = [
        "Short first page about apples.",
        "Second page about pears, also short.",
        "Third page: plums.",
    ]
    text = "\n\n".join(pages)
    starts = tuple(text.index(p) for p in pages)
    doc = Extracted(text=text, title="Fruit", kind="pdf", page_starts=starts)
    chunks = chunk_document(doc).chunks
    assert [c.content for c in chunks] == pages
    assert [c.page for c in chunks] == [1, 2, 3]
    ends = (*starts[1:], len(text))
    for c in chunks:
        assert starts[c.page - 1] <= c.start and c.end <= ends[c.page - 1]
