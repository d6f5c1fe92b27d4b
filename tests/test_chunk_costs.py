"""Chunking and sentence splitting cost what the text's length costs, whatever its shape.

A small hostile document must not make the server pay more: shapes that
once cost quadratic time (a run of sentence marks with no space after it, which
the sentence pattern tried again from each of its marks) or many times their
share of embeddings (thousands of one-word paragraphs, each its own sentence)
are checked here: by the steps counted (``tests.steps``), by the number of
sentences embedded, and for the one regular expression, by its spans against
the pattern it replaced and a time bound hundreds of times what it takes.
"""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from index.embed import Embedder
from index.errors import OverLimit
from index.ingest.chunk import chunk_document, sentence_ends
from index.ingest.extract import extract
from index.ingest.pipeline import prepare_document
from index.ingest.sentences import MIN_CHARS, MIN_SENTENCES_CAP, sentence_texts, sentences
from index.models import Chunking, Extracted
from tests import hostile
from tests.steps import assert_linear, steps

# The pattern sentence ends were found with: backtracking, so quadratic on a run of marks.
REFERENCE = re.compile(r"[.!?…]+[\"'”’»)\]]*(?=\s)|[。！？]+[」』”’）)]*")


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=".!?…\"'”’»)]。！？」』）a \n\t", max_size=40),
    st.integers(0, 40),
    st.integers(0, 40),
)
def test_sentence_ends_are_those_of_the_pattern_they_replace(text: str, a: int, b: int) -> None:
    start, end = min(a, b, len(text)), min(max(a, b), len(text))
    expected = [m.span() for m in REFERENCE.finditer(text, start, end)]
    assert list(sentence_ends(text, start, end)) == expected


@pytest.mark.parametrize("marks", [".", "?", "!)", "…"])
def test_a_run_of_sentence_marks_without_a_space_costs_its_length(marks: str) -> None:
    text = "Intro " + marks * (40_000 // len(marks)) + "x"
    started = time.perf_counter()
    chunks = chunk_document(Extracted(text=text, title="T", kind="md")).chunks
    for chunk in chunks:
        sentences(chunk.content)
    took = time.perf_counter() - started
    assert "".join(c.content for c in chunks) == text.replace(" ", "")
    # Tens of milliseconds; the pattern it replaced took minutes on this text.
    assert took < 5.0, took


def test_one_word_paragraphs_are_embedded_as_sentences_of_their_share() -> None:
    doc = extract(hostile.one_word_paragraphs_docx(4000), "words.docx")
    chunks = chunk_document(doc).chunks
    embedded = [t for c in chunks for t in sentence_texts(c.text, c.content)]
    # One sentence vector per MIN_CHARS characters at most, not one per paragraph (4,000).
    assert len(embedded) <= len(doc.text) // MIN_CHARS < 4000 // 4
    assert all(
        len(sentences(c.content)) <= max(MIN_SENTENCES_CAP, len(c.content) // MIN_CHARS)
        for c in chunks
    )
    # Every word is still in a sentence, in order.
    assert sum(s.split().count("w") for c in chunks for s in sentences(c.content)) == 4000


CHUNKING_SHAPES = {
    "headings": lambda n: "\n".join(f"{'#' * (i % 6 + 1)} Heading {i}\nw" for i in range(n)),
    "empty sections": lambda n: "# h\n" * n,
    "one-letter lines": lambda n: "w\n" * n,
    "one-word paragraphs": lambda n: "w\n\n" * n,
    "one long line": lambda n: "policy " * n,
    "sentence marks": lambda n: "a. " * n,
    "fences": lambda n: "```\n" * n,
    "a run without spaces": lambda n: "x" * (8 * n),
}


@pytest.mark.parametrize("shape", CHUNKING_SHAPES)
def test_chunking_is_linear_in_every_shape(shape: str) -> None:
    build = CHUNKING_SHAPES[shape]

    def chunked(n: int) -> None:
        for chunk in chunk_document(Extracted(text=build(n), title="T", kind="md")).chunks:
            sentences(chunk.content)

    assert_linear(chunked, 500)


def test_a_file_of_bare_headings_is_refused_after_twice_its_passages_of_them(
    embedder: Embedder,
) -> None:
    text = "# h\n" * 100_000
    done: list[Chunking] = []
    # Refused after 201 headings, not after walking 100,000 (millions of steps).
    steps(lambda: done.append(chunk_document(Extracted(text, "T", "md"), max_chunks=100)), 200_000)
    assert done[0].chunks == [] and done[0].too_many_headings == 2 * 100
    honest = "\n\n".join(f"# Part {i}\n\nWhat part {i} says." for i in range(100))
    assert len(chunk_document(Extracted(honest, "T", "md"), max_chunks=100).chunks) == 100
    with pytest.raises(OverLimit, match=r"more than 20 headings.*KB_MAX_CHUNKS"):
        prepare_document(
            text.encode(), "h.md", embedder=embedder, max_bytes=10**7, budget=512, max_chunks=10
        )
