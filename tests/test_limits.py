"""Per-document limits: a small upload that expands into thousands of pages or chunks is
refused with a reason before it costs extraction or embedding."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pypdf import PageObject

from bench.limits import one_line_text, page_bomb_pdf
from bot.settings import Settings
from index.config import DEFAULT_MAX_CHUNKS, DEFAULT_MAX_PAGES, IndexConfig
from index.embed import DEFAULT_BATCH_SIZE, Embedder
from index.embed.onnx import OnnxEmbedder
from index.errors import OverLimit
from index.ingest.extract import extract
from index.knowledge_base import KnowledgeBase
from index.models import DocState
from tests.conftest_bot import Bot, BotFactory
from tests.docs_factory import text_pdf
from tests.servers import file_share_event


class _CountingEmbedder(OnnxEmbedder):
    """The real model, counting the texts it is asked to embed."""

    def __init__(self, real: Embedder) -> None:
        self.__dict__.update(real.__dict__)
        self.embedded = 0

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        self.embedded += len(texts)
        return super().encode(texts, batch_size=batch_size, on_batch=on_batch)


@pytest.fixture
def counting(embedder: Embedder) -> _CountingEmbedder:
    return _CountingEmbedder(embedder)


def _kb(
    index_dir: Path,
    embedder: Embedder,
    *,
    max_pages: int = DEFAULT_MAX_PAGES,
    max_chunks: int = DEFAULT_MAX_CHUNKS,
) -> KnowledgeBase:
    config = IndexConfig(data_dir=index_dir, max_pages=max_pages, max_chunks=max_chunks)
    return KnowledgeBase(config, embedder=embedder)


def test_a_page_bomb_fails_before_any_page_is_read(
    index_dir: Path, counting: _CountingEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    extracted: list[int] = []
    real_extract_text = PageObject.extract_text

    def extract_text(page: PageObject, *args: Any, **kwargs: Any) -> str:
        extracted.append(1)
        return real_extract_text(page, *args, **kwargs)

    monkeypatch.setattr(PageObject, "extract_text", extract_text)
    doc = _kb(index_dir, counting).ingest_bytes(page_bomb_pdf(5000), "bomb.pdf").document
    assert len(page_bomb_pdf(5000)) < 40_000, "the bomb is a small upload"
    assert doc.state == DocState.FAILED and doc.chunk_count == 0
    assert doc.failure_reason is not None
    assert "over the limit of 2,000 pages" in doc.failure_reason
    assert "KB_MAX_PAGES" in doc.failure_reason
    assert extracted == [] and counting.embedded == 0


@pytest.mark.parametrize(("pages", "indexed"), [(3, True), (4, False)])
def test_max_pages_is_inclusive(
    index_dir: Path, embedder: Embedder, pages: int, indexed: bool
) -> None:
    pdf = text_pdf([f"Page {i} tells about the holiday policy." for i in range(pages)])
    doc = _kb(index_dir, embedder, max_pages=3).ingest_bytes(pdf, "policy.pdf").document
    if indexed:
        assert doc.state == DocState.INDEXED and doc.chunk_count == pages
    else:
        assert doc.state == DocState.FAILED
        assert "(it has 4 pages)" in (doc.failure_reason or "")


def test_a_deep_page_tree_is_counted_as_the_pages_it_holds() -> None:
    # Page trees have inner nodes: a real document of exactly max_pages pages passes.
    pdf = text_pdf([f"Section {i}." for i in range(40)])
    assert extract(pdf, "long.pdf", max_pages=40).page_starts is not None
    with pytest.raises(OverLimit):
        extract(pdf, "long.pdf", max_pages=39)


def test_a_one_line_file_fails_before_anything_is_embedded(
    index_dir: Path, counting: _CountingEmbedder
) -> None:
    doc = _kb(index_dir, counting).ingest_bytes(one_line_text(), "line.txt").document
    assert doc.state == DocState.FAILED and doc.chunk_count == 0
    assert "more than 5,000 passages" in (doc.failure_reason or "")
    assert "KB_MAX_CHUNKS" in (doc.failure_reason or "")
    assert counting.embedded == 0
    assert _kb(index_dir, counting).store.chunk_count() == 0


@pytest.mark.parametrize(("max_chunks", "indexed"), [(3, True), (2, False)])
def test_max_chunks_is_inclusive(
    index_dir: Path, embedder: Embedder, max_chunks: int, indexed: bool
) -> None:
    text = b"\n\n".join(b"Paragraph %d. " % i + b"word " * 90 for i in range(3))
    kb = _kb(index_dir, embedder, max_chunks=max_chunks)
    doc = kb.ingest_bytes(text, "three.txt").document
    assert doc.state == (DocState.INDEXED if indexed else DocState.FAILED)
    assert doc.chunk_count == (3 if indexed else 0)


def test_a_custom_chunker_is_held_to_the_same_limit(index_dir: Path, embedder: Embedder) -> None:
    from evaluation.strategies import make_chunker

    chunker = make_chunker(
        "A", budget=64, count_tokens=embedder.count_tokens, max_tokens=embedder.max_tokens
    )
    kb = KnowledgeBase(
        IndexConfig(data_dir=index_dir, max_chunks=5), embedder=embedder, chunker=chunker
    )
    doc = kb.ingest_bytes(b"word " * 200, "words.txt").document
    assert doc.state == DocState.FAILED and "KB_MAX_CHUNKS" in (doc.failure_reason or "")


def test_limits_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_MAX_PAGES", "12")
    monkeypatch.setenv("KB_MAX_CHUNKS", "34")
    config = Settings().index_config()
    assert (config.max_pages, config.max_chunks) == (12, 34)
    monkeypatch.setenv("KB_MAX_CHUNKS", "0")
    with pytest.raises(ValueError, match="KB_MAX_CHUNKS"):
        Settings()


async def test_a_slack_upload_over_a_limit_says_which(make_bot: BotFactory) -> None:
    bot: Bot = await make_bot(max_pages=10)
    f = bot.slack.add_file("F0BOMB0001", "bomb.pdf", page_bomb_pdf(50), "application/pdf")
    await bot.event(file_share_event([f]))
    await bot.settle()
    assert bot.kb.store.find_document("bomb.pdf").state == DocState.FAILED
    final = bot.statuses()[-1]
    assert "over the limit of 10 pages" in final and "KB_MAX_PAGES" in final
