"""What documents a person may not read can change for them: only the order of the rest.

BM25's corpus statistics (how many passages hold a word) and the query map are
computed over every passage, the hidden ones too. The search itself is filtered
inside the index, so a hidden passage is never a candidate, and the gate decides
on dense distances, which no other passage changes. A member who watches the
order of the passages they may read, as hidden documents come and go, could
tell that something changed; they see no hidden text, no score of it, and no
other decision (docs/security.md, *Known limits*).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from core.answer import Answer, build_engine
from core.config import EngineConfig, LLMConfig
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase

QUESTIONS = [
    "How do I get reimbursed for a conference ticket?",
    "Which laptop do I get?",
    "expense policy for travel",
    "Can I deploy on a Friday?",
    "What is the offside rule in football?",
]
ASKER = frozenset({"C_OTHER"})  # not a member of C_EXEC


def _hidden_memos(kb: KnowledgeBase) -> set[int]:
    """Memos in a channel the asker is not in, in the words the questions use."""
    words = "conference ticket reimbursement expense laptop travel deploy Friday policy"
    return {
        kb.ingest_bytes(
            f"# Memo {i}\n\n{words} memo {i}. {words}.\n".encode(), f"memo{i}.md", scope="C_EXEC"
        ).document.id
        for i in range(30)
    }


async def _answers(kb: KnowledgeBase) -> list[Answer]:
    config = EngineConfig(llm=LLMConfig(base_url=""), link_base_url="https://kb.example.com")
    engine = build_engine(config, kb)
    try:
        return [await engine.ask(q, scopes=ASKER) for q in QUESTIONS]
    finally:
        await engine.aclose()


async def test_hidden_documents_change_no_decision_and_no_distance_a_person_sees(
    sample_data_dir: Path, tmp_path: Path, embedder: Embedder
) -> None:
    shutil.copytree(sample_data_dir, tmp_path / "without")
    shutil.copytree(sample_data_dir, tmp_path / "with")
    without = KnowledgeBase(IndexConfig(data_dir=tmp_path / "without"), embedder=embedder)
    with_memos = KnowledgeBase(IndexConfig(data_dir=tmp_path / "with"), embedder=embedder)
    hidden = _hidden_memos(with_memos)

    before, after = await _answers(without), await _answers(with_memos)

    reordered = 0
    for question, a, b in zip(QUESTIONS, before, after, strict=True):
        assert not hidden & {s.document_id for s in b.sources + b.kept + b.beside}, question
        assert a.outcome == b.outcome, question
        shown_a = {
            (s.document_id, s.start, s.end): s.distance for s in a.sources + a.kept + a.beside
        }
        shown_b = {
            (s.document_id, s.start, s.end): s.distance for s in b.sources + b.kept + b.beside
        }
        for passage in shown_a.keys() & shown_b.keys():  # a passage's distance is its own
            assert shown_a[passage] == shown_b[passage], question
        reordered += list(shown_a) != list(shown_b)
    # The limit: the order of what the asker may read does depend on the hidden memos.
    assert reordered >= 1
