"""Near-copies measured: one text in four formats against different texts on one subject.

Positives: each page of ``bot/sample/`` and of the Prometheus evaluation corpus,
written as its Markdown, as HTML (markdown-it-py, in a page with a navigation
bar), as a Word file (python-docx, with a running header the reader skips) and
as a PDF (fpdf2: lines wrapped at 70 characters, long words hyphenated at the
line end, a running header and a page number on every page). Every pair of the
four formats of one page is a near-copy.

Negatives: every pair of different pages of one set: the sample handbook, and
each evaluation corpus (``evaluation/sets/*/corpus``: one product's documentation;
the l10n sets hold one page in several languages).

Each text is read by the real reader (``index.ingest.extract``) and compared by
``index.near_copies``. Prints, per shingle length, the lowest positive and the
highest negative estimated Jaccard similarity, the threshold's errors, and what
a signature and a comparison cost.

Run: python -m bench.near_copies [--limit 20]
"""

from __future__ import annotations

import argparse
import io
import itertools
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docx
import numpy as np
from fpdf import FPDF
from markdown_it import MarkdownIt

from bench.machine import describe as machine
from index import near_copies
from index.ingest.extract import extract

ROOT = Path(__file__).resolve().parents[1]
SETS = ROOT / "evaluation" / "sets"
HEADER = "Northwind Handbook - Internal"
LINE = 70


def blocks(markdown: str) -> Iterator[tuple[str, str]]:
    """``(kind, plain text)`` of each heading and paragraph, as a word processor holds them."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    for i, token in enumerate(tokens):
        if token.type != "inline":
            continue
        kind = "heading" if tokens[i - 1].type == "heading_open" else "paragraph"
        text = "".join(
            c.content if c.type in ("text", "code_inline") else " "
            for c in token.children or []
            if c.type in ("text", "code_inline", "softbreak", "hardbreak")
        )
        if text.strip():
            yield kind, " ".join(text.split())
        elif kind == "paragraph" and tokens[i - 1].type == "fence":
            continue
    for token in tokens:
        if token.type in ("fence", "code_block"):
            yield "paragraph", token.content.strip()


def as_html(markdown: str) -> bytes:
    body = MarkdownIt("commonmark").enable("table").render(markdown)
    nav = "<nav><a href='/'>Home</a> <a href='/docs'>Docs</a></nav>"
    return f"<html><head><title>Page</title></head><body>{nav}{body}</body></html>".encode()


def as_docx(markdown: str) -> bytes:
    d = docx.Document()
    d.sections[0].header.paragraphs[0].text = HEADER
    for kind, text in blocks(markdown):
        if kind == "heading":
            d.add_heading(text, 1)
        else:
            d.add_paragraph(text)
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


class _Paged(FPDF):
    def header(self) -> None:
        self.set_font("Helvetica", size=8)
        self.cell(0, 5, HEADER)
        self.ln(8)
        self.set_font("Helvetica", size=10)

    def footer(self) -> None:
        self.set_y(-12)
        self.set_font("Helvetica", size=8)
        self.cell(0, 5, f"Page {self.page_no()}")
        self.set_font("Helvetica", size=10)


def hyphenated(text: str, width: int = LINE) -> list[str]:
    """``text`` in lines of at most ``width`` characters, a long word cut by a hyphen."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        room = width - len(line) - (1 if line else 0)
        if len(word) <= room:
            line = f"{line} {word}" if line else word
            continue
        if room >= 4 and len(word) >= 7 and word.isalpha():
            cut = room - 1
            lines.append(f"{line} {word[:cut]}-" if line else f"{word[:cut]}-")
            line = word[cut:]
            continue
        lines.append(line)
        line = word
    if line:
        lines.append(line)
    return lines


def as_pdf(markdown: str) -> bytes:
    pdf = _Paged()
    pdf.set_font("Helvetica", size=10)
    pdf.add_page()
    for _, text in blocks(markdown):
        safe = text.encode("latin-1", "replace").decode("latin-1")
        for line in hyphenated(safe):
            pdf.cell(0, 5, line, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(3)
    return bytes(pdf.output())


def formats(path: Path) -> dict[str, str]:
    """The text the reader gets from each format of the page at ``path``."""
    source = path.read_text()
    files = {
        "md": (source.encode(), "page.md"),
        "html": (as_html(source), "page.html"),
        "docx": (as_docx(source), "page.docx"),
        "pdf": (as_pdf(source), "page.pdf"),
    }
    return {kind: extract(data, name).text for kind, (data, name) in files.items()}


def corpora(limit: int) -> dict[str, list[Path]]:
    found = {"sample": sorted((ROOT / "bot" / "sample").glob("*.md"))}
    for corpus in sorted(SETS.glob("*/corpus")):
        found[corpus.parent.name] = sorted(corpus.iterdir())[:limit]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=40, help="pages of each corpus")
    args = parser.parse_args()
    sets = corpora(args.limit)
    pages = sets["sample"] + sets["prometheus"][: args.limit]
    texts = {p: formats(p) for p in pages}
    negatives = {
        name: {p: extract(p.read_bytes(), p.name).text for p in paths}
        for name, paths in sets.items()
    }
    print(machine())
    print(
        f"positives: {len(pages)} pages x 4 formats; negatives: {sum(map(len, negatives.values()))} pages in {len(negatives)} sets"
    )
    for width in (3, 4, 5):
        near_copies.SHINGLE_WORDS = width
        same = pair_scores({page.name: by_format for page, by_format in texts.items()})
        different = pair_scores(
            {name: {p.name: t for p, t in by_page.items()} for name, by_page in negatives.items()}
        )
        positive, negative = [s for s, _ in same], [s for s, _ in different]
        worst, top = min(same), max(different)
        t = near_copies.NEAR_COPY_THRESHOLD
        print(
            f"shingle {width}: positives n={len(positive)} min {worst[0]:.3f} ({worst[1]}) "
            f"median {statistics.median(positive):.3f}; negatives n={len(negative)} "
            f"max {top[0]:.3f} ({top[1]}) median {statistics.median(negative):.3f}; "
            f"at {t}: {sum(s < t for s in positive)} missed, {sum(s >= t for s in negative)} false"
        )
    near_copies.SHINGLE_WORDS = 4
    cost()


def pair_scores(groups: dict[str, dict[str, str]]) -> list[tuple[float, str]]:
    """The estimated similarity of every two texts of each group, with which two they are."""
    scores = []
    for group, texts in groups.items():
        sigs = {k: near_copies.signature(t) for k, t in texts.items()}
        for a, b in itertools.combinations(sigs, 2):
            first, second = sigs[a], sigs[b]
            assert first is not None and second is not None, f"{group}: a page without words"
            s = float(near_copies.similarities(first.minhash, [second.minhash])[0])
            scores.append((s, f"{group}: {a} / {b}"))
    return scores


def cost(documents: int = 100_000) -> None:
    """What a signature costs per thousand words, and a look-up among ``documents``.

    The look-up runs the store's query (``Store.near_signatures``) and the comparison
    (``near_copies.Stored``) on SQLite tables of
    the store's shape, filled with random signatures of sizes spread from 50 to 20,000
    runs (log-uniform), for a document of 1,000 runs.
    """
    words = (ROOT / "bot" / "sample" / "expenses.md").read_text().split()
    text = " ".join(itertools.islice(itertools.cycle(words), 100_000))
    start = time.perf_counter()
    near_copies.signature(text)
    per_k = (time.perf_counter() - start) * 1000 / 100
    rng = np.random.default_rng(0)
    sizes = np.exp(rng.uniform(np.log(50), np.log(20_000), documents)).astype(int)
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp) / "kb.sqlite")
        db.execute("CREATE TABLE documents (id INTEGER PRIMARY KEY, state TEXT NOT NULL)")
        db.execute(
            "CREATE TABLE texts (document_id INTEGER PRIMARY KEY, text TEXT NOT NULL, "
            "near_shingles INTEGER, near_minhash BLOB)"
        )
        db.execute("CREATE INDEX texts_near_shingles ON texts(near_shingles)")
        db.executemany(
            "INSERT INTO documents VALUES (?, 'indexed')", [(i,) for i in range(documents)]
        )
        db.executemany(
            "INSERT INTO texts VALUES (?, '', ?, ?)",
            [(i, int(n), rng.bytes(near_copies.PERMUTATIONS * 4)) for i, n in enumerate(sizes)],
        )
        db.commit()
        fewest, most = near_copies.size_range(1000)
        start = time.perf_counter()
        rows = db.execute(
            """SELECT t.document_id, t.near_shingles, t.near_minhash FROM texts t
               JOIN documents d ON d.id = t.document_id
               WHERE t.near_shingles BETWEEN ? AND ? AND d.state = 'indexed'""",
            [fewest, most],
        ).fetchall()
        mine = near_copies.Signature(1000, rows[0][2])
        near_copies.Stored.of(rows).near(-1, mine)
        lookup = (time.perf_counter() - start) * 1000
        db.close()
    print(
        f"signature: {per_k:.2f} ms per 1,000 words, {near_copies.PERMUTATIONS * 4} bytes; "
        f"look-up among {documents:,} documents: {len(rows):,} in its size range "
        f"({fewest}-{most} runs) read and compared in {lookup:.0f} ms"
    )


if __name__ == "__main__":
    main()
