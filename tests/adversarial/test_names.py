"""File names and titles cannot spoof themselves, forge lines or overflow Slack.

The attacker uploads a document whose name (or HTML title) carries a
right-to-left override (``report\\u202eexe.md`` reads as ``reportdm.exe``),
newlines that would forge a line in a status message or a log, zero-width
characters, or thousands of characters that would break a Block Kit limit.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.conftest_bot")

from bot.slack.blocks import render_answer  # noqa: E402
from bot.slack.words import words_for  # noqa: E402
from core.answer import Answer, Outcome, SourceRef  # noqa: E402
from index.config import IndexConfig  # noqa: E402
from index.embed import Embedder  # noqa: E402
from index.knowledge_base import KnowledgeBase  # noqa: E402
from index.names import MAX_NAME_CHARS, display_name  # noqa: E402
from tests.conftest_bot import Bot  # noqa: E402
from tests.servers import file_share_event  # noqa: E402

HOSTILE_NAMES = [
    "invoice\u202egpj.md",
    "notes\nINFO forged log line.md",
    "zero\u200bwidth\u2066name.md",
    "nul\x00byte\x1b[31m.md",
    "long-" + "x" * 5000 + ".md",
]


def _tricky(text: str) -> list[str]:
    return [
        f"U+{ord(ch):04X}" for ch in text if unicodedata.category(ch) in {"Cc", "Cf"} and ch != " "
    ]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_display_names_are_one_clean_bounded_line(name: str) -> None:
    shown = display_name(name)
    assert _tricky(shown) == [] and "\n" not in shown
    assert 0 < len(shown) <= MAX_NAME_CHARS
    assert shown.endswith(".md")  # the extension survives truncation


def test_stored_names_and_titles_are_clean(tmp_path: Path, embedder: Embedder) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=tmp_path / "kb"), embedder=embedder)
    page = b"<html><head><title>Pay\xe2\x80\xae here\nnow</title></head><body><p>Text.</p></body></html>"
    row = kb.ingest_bytes(page, "a\u202eb\nc.html").document
    assert row.state == "indexed"
    assert _tricky(row.name) == [] and "\n" not in row.name
    assert _tricky(row.title) == [] and "\n" not in row.title


async def test_hostile_names_reach_slack_clean_and_within_limits(bot: Bot) -> None:
    files = [
        bot.slack.add_file(f"F0NAME{i:04d}", name, b"# Doc\n\nSome text.\n", "text/markdown")
        for i, name in enumerate(HOSTILE_NAMES)
    ]
    await bot.event(file_share_event(files))
    await bot.settle(len(files))
    # The mock Slack rejects what real Slack rejects (Block Kit limits): nothing was.
    assert bot.slack.rejected == []
    for status in bot.statuses():
        assert _tricky(status) == [], status[:200]
        assert len(status) < 3000
    for doc in bot.kb.documents():
        assert _tricky(doc.name) == [] and len(doc.name) <= MAX_NAME_CHARS


def test_answers_show_clean_document_names() -> None:
    source = SourceRef(
        n=1,
        chunk_id=1,
        document_id=1,
        document="Policy\u202etxt.exe\nfake",
        section="Intro\u2066",
        page=None,
        start=0,
        end=4,
        url="https://kb.example/d/1?t=x#char=0,4",
        quote="Text",
        distance=0.1,
    )
    answer = Answer(
        question="q",
        outcome=Outcome.ANSWERED,
        answer="Yes [1].",
        grounded=True,
        model_called=True,
        sources=[source],
        kept=[source],
    )
    shown = json.loads(json.dumps(render_answer(answer, words=words_for("en")).blocks))
    text = json.dumps(shown, ensure_ascii=False)
    assert "\u202e" not in text and "\u2066" not in text
