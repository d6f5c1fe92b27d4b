"""What one hostile document costs, with the per-document limits and without them.

Two small uploads that expand enormously:

    page bomb   a 30 KB PDF whose page tree references one page 5,000 times
    one line    a 5 MB text file of one line ("word word word ...")

Each is ingested (``KnowledgeBase.ingest_bytes``, the bundled model, a fresh
data dir) in a fresh process, once with the limits off (``KB_MAX_PAGES`` and
``KB_MAX_CHUNKS`` at 10**9: the behaviour before they existed) and once with
the defaults. Reported per run: the ingest's wall time, the outcome, and the
child's peak resident memory; a baseline child ingesting a one-line document
shows what the loaded model alone takes.

Run: python -m bench.limits [--only page-bomb|one-line|baseline] [--limits off|default]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.machine import describe as machine

UNLIMITED = 10**9
PAGE_REFERENCES = 5000
ONE_LINE_BYTES = 5 * 1024 * 1024


def page_bomb_pdf(references: int = PAGE_REFERENCES, text: str = "The same page again.") -> bytes:
    """A tiny valid PDF whose page tree lists one page ``references`` times."""
    content = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    kids = b" ".join([b"3 0 R"] * references)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % references,
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def one_line_text(size: int = ONE_LINE_BYTES) -> bytes:
    """``size`` bytes of words on a single line, without a sentence end."""
    return (b"word " * (size // 5 + 1))[:size]


DOCUMENTS: dict[str, tuple[str, Callable[[], bytes]]] = {
    "page-bomb": ("bomb.pdf", page_bomb_pdf),
    "one-line": ("line.txt", one_line_text),
    "baseline": ("small.txt", lambda: b"One short line of text."),
}


def child(kind: str, limits: str) -> None:
    """Ingest one document into a fresh data dir and print what happened as JSON."""
    from index.config import IndexConfig
    from index.knowledge_base import KnowledgeBase

    name, build = DOCUMENTS[kind]
    data = build()
    caps = {"max_pages": UNLIMITED, "max_chunks": UNLIMITED} if limits == "off" else {}
    with tempfile.TemporaryDirectory() as tmp:
        kb = KnowledgeBase(IndexConfig(data_dir=Path(tmp), **caps))  # type: ignore[arg-type]
        kb.embedder.encode(["warm up"])  # the model's load is not the document's cost
        started = time.perf_counter()
        added = kb.ingest_bytes(data, name)
        seconds = time.perf_counter() - started
        doc = added.document
        print(
            json.dumps(
                {
                    "bytes": len(data),
                    "seconds": round(seconds, 2),
                    "state": str(doc.state),
                    "chunks": doc.chunk_count,
                    "reason": doc.failure_reason or "",
                    "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                }
            )
        )


def measure(kind: str, limits: str) -> dict[str, object]:
    """Run one child in a fresh process, so that its peak memory is the document's alone."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.limits", "--child", kind, "--limits", limits],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", choices=sorted(DOCUMENTS))
    ap.add_argument("--limits", choices=["off", "default"])
    ap.add_argument("--child", choices=sorted(DOCUMENTS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.limits or "default")
        return
    print(f"machine: {machine()}")
    runs = [("baseline", "default")] if args.only in (None, "baseline") else []
    for kind in [args.only] if args.only and args.only != "baseline" else ["page-bomb", "one-line"]:
        runs += [(kind, limits) for limits in [args.limits] if limits] or [
            (kind, "default"),
            (kind, "off"),
        ]
    for kind, limits in runs:
        print(kind, f"limits={limits}", json.dumps(measure(kind, limits)), flush=True)


if __name__ == "__main__":
    main()
