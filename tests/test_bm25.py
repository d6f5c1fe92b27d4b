"""BM25: rank-bm25's Okapi scores with Lucene's IDF, scope filtering, persistence."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from index.errors import IndexOutOfSync
from index.search.bm25 import Allowed, BM25Index
from index.search.tokens import ANALYZER, PLAIN, tokenize

SENTENCES = [
    "Employee Handbook > Leave: Annual leave is 25 days per calendar year, plus public holidays.",
    "Employee Handbook > Leave: Unused leave up to 5 days carries over to the next year.",
    "Employee Handbook > Leave: Sick leave needs a doctor's note after the third day.",
    "IT Guide > VPN: To reset your VPN password, open the self-service portal and choose Reset.",
    "IT Guide > VPN: The VPN client v2.3 is required from March; older clients are refused.",
    "IT Guide > VPN: If the VPN drops every hour, check that split tunnelling is off.",
    "IT Guide > Errors: ERR_42 means your access token expired; sign in again to get a new one.",
    "IT Guide > Errors: ERR_17 means the proxy rejected the request; contact the service desk.",
    "IT Guide > Export: CSV exports use the utf-8-sig encoding so that Excel opens them correctly.",
    "Engineering > Python: Run the test suite with python -bb to turn bytes warnings into errors.",
    "Engineering > Python: The flag store_true makes an option a boolean switch.",
    "Engineering > Python: Import helpers from foo.bar, never from the old utils package.",
    "Engineering > Build: Our services are written in C++ and Go, built with Bazel.",
    "Engineering > Config: Secrets live in .env files that are never committed to git.",
    "Finance > Expenses: Submit expenses within 30 days with a photo of the receipt.",
    "Finance > Expenses: Meals while travelling are reimbursed up to 40 euros per day.",
    "Finance > Travel: Book trains for journeys under four hours instead of flights.",
    "Office > Kitchen: The coffee machine is descaled every Friday by the facilities team.",
    "Office > Rooms: Book meeting rooms in the calendar; cancel if you no longer need them.",
    "Office > Access: Lost badges are replaced at reception; the old badge is deactivated.",
    "Security > Passwords: Passwords must be at least 14 characters and are never shared.",
    "Security > Phishing: Report phishing emails with the Report button in the mail client.",
    "Security > Devices: Laptops are encrypted; a lost laptop must be reported within one hour.",
    "Onboarding > First day: New starters get their laptop and badge on the first day.",
]
QUERIES = [
    "how do I reset my VPN password",
    "what does ERR_42 mean",
    "error 42",
    "utf-8-sig",
    "how many days of annual leave do I get",
    "leave leave leave",  # repeated terms count each time
    "python -bb",
    "C++ services",
    "where are secrets stored .env",
    "lost laptop or badge",
    "the",
    "a word that is nowhere",
]


class LuceneIdfOkapi(BM25Okapi):
    """The reference: rank-bm25's Okapi scoring with Lucene's always-positive IDF."""

    def __init__(self, corpus: list[list[str]]) -> None:
        super().__init__(corpus, k1=1.2, b=0.75)

    def _calc_idf(self, nd: dict[str, int]) -> None:
        for word, n in nd.items():
            self.idf[word] = math.log(1 + (self.corpus_size - n + 0.5) / (n + 0.5))


def _all_scores(index: BM25Index, query: str) -> np.ndarray:
    got = dict(index.search(query, k=len(index)))
    return np.array([got.get(int(i), 0.0) for i in index.chunk_ids])


def _generated_corpus(n: int, seed: int = 7) -> list[str]:
    # Chunks of several handbook sentences, so lengths and frequencies vary.
    rng = random.Random(seed)
    return [" ".join(rng.sample(SENTENCES, rng.randint(1, 4))) for _ in range(n)]


@pytest.mark.parametrize(
    "texts", [SENTENCES, _generated_corpus(300)], ids=["handbook", "generated"]
)
def test_scores_equal_rank_bm25_with_lucene_idf(texts: list[str]) -> None:
    ids = [1000 + 3 * i for i in range(len(texts))]
    index = BM25Index(ids, texts)
    reference = LuceneIdfOkapi([ANALYZER.document_terms(t) for t in texts])
    for query in QUERIES:
        expected = reference.get_scores(ANALYZER.query_terms(query))
        assert np.allclose(_all_scores(index, query), expected, rtol=1e-5, atol=1e-6), query


def test_plain_analysis_scores_the_tokeniser_terms() -> None:
    index = BM25Index(range(len(SENTENCES)), SENTENCES, analyzer=PLAIN)
    reference = LuceneIdfOkapi([tokenize(t) for t in SENTENCES])
    for query in QUERIES:
        expected = reference.get_scores(tokenize(query))
        assert np.allclose(_all_scores(index, query), expected, rtol=1e-5, atol=1e-6), query


def test_another_form_of_a_word_finds_the_chunk() -> None:
    texts = ["Reception replaces lost badges.", "The VPN client refuses old versions."]
    assert BM25Index([1, 2], texts).search("who replaced my badge", k=5)[0][0] == 1
    assert BM25Index([1, 2], texts, analyzer=PLAIN).search("replaced badge", k=5) == []


def test_a_question_of_stop_words_alone_finds_nothing() -> None:
    index = BM25Index([1, 2], ["How do I do it?", "What is it?"])
    assert index.search("how do I", k=5) == []
    assert BM25Index([1, 2], ["How do I do it?", "x"], analyzer=PLAIN).search("how", k=5)


def test_two_document_corpus_scores_the_matching_document() -> None:
    texts = ["How to reset the VPN password", "Lunch menu for the week"]
    # The pitfall this index avoids: rank-bm25 gives zero to everything here.
    assert not BM25Okapi([tokenize(t) for t in texts]).get_scores(["vpn"]).any()

    hits = BM25Index([1, 2], texts).search("vpn password", k=5)
    assert [chunk_id for chunk_id, _ in hits] == [1]
    assert hits[0][1] > 0


def test_term_in_exactly_half_the_documents_still_counts() -> None:
    texts = ["badge at reception", "badge for the office", "coffee machine", "meeting rooms"]
    assert BM25Okapi([tokenize(t) for t in texts]).idf["badge"] == 0  # rank-bm25's pitfall

    hits = BM25Index([1, 2, 3, 4], texts).search("badge", k=5)
    assert {chunk_id for chunk_id, _ in hits} == {1, 2}
    assert all(score > 0 for _, score in hits)


def test_term_in_every_document_still_ranks_by_frequency() -> None:
    texts = ["vpn vpn vpn", "vpn and more words here", "vpn"]
    hits = BM25Index([1, 2, 3], texts).search("vpn", k=3)
    assert len(hits) == 3 and all(score > 0 for _, score in hits)
    assert hits[0][0] == 1


def test_only_chunks_sharing_a_term_are_returned_best_first() -> None:
    index = BM25Index(range(len(SENTENCES)), SENTENCES)
    hits = index.search("reset VPN password", k=10)
    assert hits[0][0] == 3
    scores = [score for _, score in hits]
    assert scores == sorted(scores, reverse=True)
    words = set(ANALYZER.query_terms("reset VPN password"))
    for chunk_id, _ in hits:
        assert words & set(ANALYZER.document_terms(SENTENCES[chunk_id]))
    assert index.search("zebra giraffe", k=10) == []


def test_identifier_query_ranks_the_identifier_first() -> None:
    index = BM25Index(range(len(SENTENCES)), SENTENCES)
    assert index.search("ERR_42", k=1)[0][0] == 6
    assert index.search("utf-8-sig", k=1)[0][0] == 8
    assert index.search("store_true", k=1)[0][0] == 10


def test_k_limits_and_ties_go_to_the_lower_id() -> None:
    index = BM25Index([30, 10, 20], ["same words", "same words", "same words"])
    assert [c for c, _ in index.search("words", k=2)] == [10, 20]
    assert index.search("words", k=0) == []


def test_empty_index_and_empty_texts() -> None:
    assert BM25Index([], []).search("anything", k=5) == []
    assert len(BM25Index([], [])) == 0
    index = BM25Index([1, 2], ["", "vpn"])
    assert [c for c, _ in index.search("vpn", k=5)] == [2]


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="texts"):
        BM25Index([1, 2], ["one"])
    with pytest.raises(ValueError, match="unique"):
        BM25Index([1, 1], ["one", "two"])


# --------------------------------------------------------------- scope filtering


@pytest.fixture
def many_vpn_chunks() -> BM25Index:
    # 50 chunks all about the VPN, then 3 weaker matches in another scope.
    texts = ["VPN VPN VPN password reset"] * 50 + ["the VPN is mentioned once in a long text"] * 3
    return BM25Index(range(1, len(texts) + 1), texts)


@pytest.mark.parametrize("kind", ["set", "list", "array", "predicate"])
def test_narrow_scope_still_gets_its_full_k(many_vpn_chunks: BM25Index, kind: str) -> None:
    scope = {51, 52, 53, 999}  # 999 is not in the index
    choices: dict[str, Allowed] = {
        "set": scope,
        "list": sorted(scope),
        "array": np.array(sorted(scope), dtype=np.int64),
        "predicate": scope.__contains__,
    }
    allowed = choices[kind]
    # Better matches exist outside the scope ...
    assert {c for c, _ in many_vpn_chunks.search("vpn", k=3)} <= set(range(1, 51))
    # ... yet the scoped search returns every matching chunk of the scope.
    hits = many_vpn_chunks.search("vpn", k=3, allowed=allowed)
    assert [c for c, _ in hits] == [51, 52, 53]


def test_scope_scores_are_the_unscoped_scores(many_vpn_chunks: BM25Index) -> None:
    everything = dict(many_vpn_chunks.search("vpn password", k=100))
    scoped = many_vpn_chunks.search("vpn password", k=100, allowed={5, 52})
    assert scoped == [(5, everything[5]), (52, everything[52])]


@pytest.mark.parametrize("spread", [1, 10**9], ids=["dense-ids", "sparse-ids"])
def test_scope_lookup_for_dense_and_sparse_ids(spread: int) -> None:
    # Dense ids use a direct id -> position table, sparse ones a sorted search.
    ids = [5 + i * spread for i in range(len(SENTENCES))]
    index = BM25Index(ids, SENTENCES)
    everything = dict(index.search("vpn leave laptop", k=100))
    scope = [ids[3], ids[5], ids[22], ids[1], -7, ids[-1] + 1, ids[3]]  # unknown and repeated ids
    hits = index.search("vpn leave laptop", k=100, allowed=np.array(scope))
    assert sorted(hits, key=lambda h: h[0]) == sorted(
        (c, everything[c]) for c in {ids[3], ids[5], ids[22], ids[1]} if c in everything
    )
    assert len(hits) == 4


def test_predicate_is_walked_past_the_first_window() -> None:
    texts = [f"vpn {'vpn ' * (200 - i)}" for i in range(200)]
    index = BM25Index(range(200), texts)
    hits = index.search("vpn", k=2, allowed=lambda chunk_id: chunk_id >= 195)
    assert [c for c, _ in hits] == [195, 196]


def test_empty_scope_finds_nothing(many_vpn_chunks: BM25Index) -> None:
    assert many_vpn_chunks.search("vpn", k=3, allowed=set()) == []
    assert many_vpn_chunks.search("vpn", k=3, allowed=lambda _: False) == []


# ------------------------------------------------------------------ persistence


def test_save_and_load_round_trip(index_dir: Path) -> None:
    ids = [7, 3, 11] + list(range(100, 121))
    index = BM25Index(ids, SENTENCES, k1=1.2, b=0.75)
    path = index_dir / "bm25.npz"
    index.save(path, generation=42)

    loaded, generation = BM25Index.load(path)
    assert generation == 42
    assert loaded.chunk_ids.tolist() == ids
    assert len(loaded) == len(index)
    for query in QUERIES:
        assert loaded.search(query, k=10) == index.search(query, k=10)
    assert sorted(p.name for p in index_dir.iterdir()) == ["bm25.npz"]  # no temp file left


def test_save_replaces_the_previous_file(index_dir: Path) -> None:
    path = index_dir / "bm25.npz"
    BM25Index([1], ["old text"]).save(path, generation=1)
    BM25Index([2], ["new text"]).save(path, generation=2)
    loaded, generation = BM25Index.load(path)
    assert generation == 2 and loaded.chunk_ids.tolist() == [2]


def test_empty_index_round_trip(index_dir: Path) -> None:
    BM25Index([], []).save(index_dir / "bm25.npz", generation=0)
    loaded, generation = BM25Index.load(index_dir / "bm25.npz")
    assert (len(loaded), generation) == (0, 0)
    assert loaded.search("vpn", k=3) == []


def test_missing_or_damaged_file_is_out_of_sync(index_dir: Path) -> None:
    path = index_dir / "bm25.npz"
    with pytest.raises(IndexOutOfSync, match="rebuild"):
        BM25Index.load(path)
    BM25Index([1, 2], ["a b", "c"]).save(path, generation=1)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(IndexOutOfSync, match="rebuild"):
        BM25Index.load(path)
    path.write_bytes(b"not an index at all")
    with pytest.raises(IndexOutOfSync, match="rebuild"):
        BM25Index.load(path)


def write_version_1_file(path: Path) -> None:
    """A BM25 file as the tokeniser alone wrote it, before stemming (``"tokenizer": 1``)."""
    BM25Index([1], ["vpn"], analyzer=PLAIN).save(path, generation=1)
    with np.load(path) as data:
        arrays = dict(data)
    meta = json.loads(arrays["meta"].tobytes().decode())
    arrays["meta"] = np.frombuffer(json.dumps({**meta, "tokenizer": 1}).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_file_of_another_tokenizer_version_is_out_of_sync(index_dir: Path) -> None:
    path = index_dir / "bm25.npz"
    write_version_1_file(path)
    with pytest.raises(IndexOutOfSync, match="another version"):
        BM25Index.load(path)


def test_file_of_another_analysis_is_out_of_sync(index_dir: Path) -> None:
    path = index_dir / "bm25.npz"
    BM25Index([1], ["vpn"], analyzer=PLAIN).save(path, generation=1)
    with pytest.raises(IndexOutOfSync, match="another version"):
        BM25Index.load(path)
    index, _ = BM25Index.load(path, analyzer=PLAIN)
    assert index.analyzer == PLAIN and index.search("vpn", k=1)[0][0] == 1


def test_inconsistent_file_is_out_of_sync(index_dir: Path) -> None:
    path = index_dir / "bm25.npz"
    BM25Index([1, 2], ["a b", "c"]).save(path, generation=1)
    with np.load(path) as data:
        arrays = dict(data)
    arrays["postings"] = arrays["postings"] + 5  # positions past the last chunk
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(IndexOutOfSync, match="inconsistent"):
        BM25Index.load(path)


def _rewrite(path: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    with np.load(path) as data:
        arrays = dict(data)
    change(arrays)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_a_file_naming_a_chunk_twice_is_out_of_sync(index_dir: Path) -> None:
    path = index_dir / "bm25.npz"
    BM25Index([1, 2], ["a b", "c"]).save(path, generation=1)
    _rewrite(path, lambda arrays: arrays.update(chunk_ids=np.array([2, 2], dtype=np.int64)))
    with pytest.raises(IndexOutOfSync, match="inconsistent"):
        BM25Index.load(path)


def test_a_file_from_before_saved_impacts_is_out_of_sync(index_dir: Path) -> None:
    """Format 1 held no impacts: it is rebuilt, never loaded with impacts made up."""
    path = index_dir / "bm25.npz"
    BM25Index([1, 2], ["a b", "c"]).save(path, generation=1)

    def format_1(arrays: dict[str, np.ndarray]) -> None:
        meta = json.loads(arrays["meta"].tobytes().decode())
        arrays["meta"] = np.frombuffer(json.dumps({**meta, "format": 1}).encode(), np.uint8)
        del arrays["impacts"]

    _rewrite(path, format_1)
    with pytest.raises(IndexOutOfSync, match="another version"):
        BM25Index.load(path)


@pytest.mark.parametrize(
    "damage",
    [
        lambda arrays: arrays.pop("impacts"),
        lambda arrays: arrays.update(impacts=arrays["impacts"][:-1]),
        lambda arrays: arrays.update(impacts=arrays["impacts"].astype(np.float64)),
    ],
    ids=["missing", "one short", "float64"],
)
def test_saved_impacts_that_do_not_fit_are_out_of_sync(
    index_dir: Path, damage: Callable[[dict[str, np.ndarray]], object]
) -> None:
    path = index_dir / "bm25.npz"
    BM25Index([1, 2], ["a b", "c"]).save(path, generation=1)
    _rewrite(path, damage)
    with pytest.raises(IndexOutOfSync, match="rebuild"):
        BM25Index.load(path)


def test_updated_scores_like_a_fresh_build() -> None:
    ids = [100 + i for i in range(len(SENTENCES))]
    base = BM25Index(ids, SENTENCES)
    removed = [100, 105, 110, 111, 999]  # 999 is not in the index
    added = {50: "zeppelin over the VPN", 200: "annual leave leave", 201: "zeppelin the"}
    updated = base.updated(removed, list(added), list(added.values()))
    final = {i: t for i, t in zip(ids, SENTENCES, strict=True) if i not in removed} | added
    fresh = BM25Index(sorted(final), [final[i] for i in sorted(final)])
    assert np.array_equal(updated.chunk_ids, fresh.chunk_ids)  # ascending, like a build
    for query in [*QUERIES, "zeppelin", "doctor's note"]:
        got, want = updated.search(query, 100), fresh.search(query, 100)
        assert [c for c, _ in got] == [c for c, _ in want], query
        assert np.allclose([s for _, s in got], [s for _, s in want]), query
    assert updated.search("zeppelin", 5, allowed=[201]) == fresh.search(
        "zeppelin", 5, allowed=[201]
    )
    # Terms only the removed chunks had leave the vocabulary, as in a fresh build.
    assert sorted(updated._terms) == sorted(fresh._terms)
    # The original is unchanged.
    assert len(base) == len(SENTENCES) and not base.search("zeppelin", 5)


def test_updated_round_trips_and_rejects_bad_input(tmp_path: Path) -> None:
    base = BM25Index([1, 2, 3], SENTENCES[:3])
    updated = base.updated([2], [7], ["zeppelin leave"])
    updated.save(tmp_path / "bm25.npz", 4)
    loaded, generation = BM25Index.load(tmp_path / "bm25.npz")
    assert generation == 4 and loaded.search("leave", 5) == updated.search("leave", 5)
    assert len(base.updated([1, 2, 3], [], [])) == 0
    with pytest.raises(ValueError):
        base.updated([], [1], ["already there"])
    with pytest.raises(ValueError):
        base.updated([], [8, 9], ["one text"])


def test_an_update_keeps_the_analysis_of_its_index() -> None:
    plain = BM25Index([1], ["badges"], analyzer=PLAIN).updated([], [2], ["badge"])
    assert plain.analyzer == PLAIN
    assert [c for c, _ in plain.search("badges", k=5)] == [1]
    stemmed = BM25Index([1], ["badges"]).updated([], [2], ["badge"])
    assert {c for c, _ in stemmed.search("badges", k=5)} == {1, 2}
