"""An embedder adapted to the corpus itself, as a retrieval signal beside the gate's own vectors.

Not part of the product: this measures whether it would be worth building.

The bundled MiniLM is fine-tuned for one epoch on pairs the corpus gives for
free, with in-batch negatives (the loss of sentence-transformers'
``MultipleNegativesRankingLoss``, written out so that no training framework is
needed): each sentence of 20 characters or more of a chunk of several sentences
(``index.ingest.sentences.sentences``) against that chunk's embedded text, and each
section heading against up to three of its chunks. A chunk repeated within a
batch keeps its first pair only (a repeated positive would be its own negative).
Batches of 32, AdamW at 2e-5, similarity scale 20, seed 0: two runs give the
same numbers. No question of the evaluation set is used for training.

The gate keeps judging on the original model's chunk vectors in every variant,
so what the asker is refused is measured, not assumed:

* ``product``: the product's order (score fusion of dense and BM25, then the
  sentence leg, ``core.retrieve.sentence_order``);
* ``adapted dense``, ``original dense``: each dense leg alone (top 20);
* ``adapted replaces dense``: the adapted model's leg instead of the original
  one in the product's fusion, then the sentence leg;
* ``3 legs a=W o=V``: original dense (weight V), adapted dense (W) and BM25
  (0.5) in one score fusion, then the sentence leg.

Every row is paired with ``product`` (exact two-sided sign tests on the queries
where they differ). The gate's own separation is also printed for both models'
best distance (ROC AUC of in-domain against out-of-domain questions, and the
in-domain queries refused at the largest cut letting at most 2 through).

Needs PyTorch (training). Takes about 7 min for pip-black (480 chunks, 1,792
pairs) and 16 min for prometheus (1,338 chunks, 3,904 pairs) on 2 cores.

Run: python -m bench.adapt [--set NAME]
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.sentences import Lists, _mrr_pairs, _test, collect, sentence_vectors
from bot.settings import Settings
from core.gate import gate
from core.retrieve import FUSION, Candidate, fuse, score_fusion, sentence_order
from evaluation.inputs import DEFAULT_SET, bundled_set, load_ood, load_questions
from evaluation.run import indexed_corpus
from evaluation.stats import hits_at_k, mrr, wilson_interval
from index.embed import load_embedder, resolve_model
from index.ingest.sentences import sentences

POOL = 20
DEPTH = 25
BATCH = 32
SCALE = 20.0
LEARNING_RATE = 2e-5
MIN_SENTENCE = 20
CHUNKS_PER_HEADING = 3
SENTENCE_WEIGHT = 0.5
ALONE = ("original dense", "adapted dense")


@dataclass
class Corpus:
    """One set, indexed by the product, with everything the variants need."""

    ids: list[int]
    texts: list[str]  # each chunk's embedded text (heading path + content)
    contents: list[str]
    headers: list[str]
    correct: list[set[int]]  # per in-domain query
    queries: list[str]
    ood: list[str]
    lists_in: list[Lists]
    lists_ood: list[Lists]
    sentence_vectors: dict[int, np.ndarray]


def training_pairs(corpus: Corpus) -> list[tuple[str, str]]:
    """(anchor, chunk text) pairs: sentences -> their chunk, headings -> their chunks."""
    pairs: list[tuple[str, str]] = []
    by_heading: dict[str, list[str]] = {}
    for text, content, header in zip(corpus.texts, corpus.contents, corpus.headers, strict=True):
        parts = sentences(content)
        if len(parts) > 1:
            pairs += [(s, text) for s in parts if len(s) >= MIN_SENTENCE]
        if header:
            by_heading.setdefault(header.split(" > ")[-1], []).append(text)
    for heading, texts in by_heading.items():
        pairs += [(heading, t) for t in texts[:CHUNKS_PER_HEADING]]
    random.Random(0).shuffle(pairs)
    return pairs


def adapt(model_path: str, pairs: Sequence[tuple[str, str]]) -> tuple[object, float]:
    """The model fine-tuned on ``pairs`` for one epoch, and the seconds it took."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(model_path, device="cpu")
    optimiser = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    model.train()
    started = time.perf_counter()
    for i in range(0, len(pairs), BATCH):
        batch = list({p: a for a, p in reversed(pairs[i : i + BATCH])}.items())
        if len(batch) < 2:
            continue
        anchors = model(model.tokenize([a for _, a in batch]))["sentence_embedding"]
        positives = model(model.tokenize([p for p, _ in batch]))["sentence_embedding"]
        sim = (
            torch.nn.functional.normalize(anchors, dim=-1)
            @ torch.nn.functional.normalize(positives, dim=-1).T
        )
        loss = torch.nn.functional.cross_entropy(SCALE * sim, torch.arange(len(batch)))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    return model, time.perf_counter() - started


def load_corpus(set_name: str, cache: Path) -> Corpus:
    """Index the set with the product's ingestion and collect both legs for every question."""
    settings = Settings()
    embedder = load_embedder(settings.index_config())
    paths = bundled_set(set_name)
    questions, ood = load_questions(paths.questions), load_ood(paths.ood)
    queries = [t for q in questions for t in q.phrasings()]
    with indexed_corpus(paths.corpus, settings.index_config(), embedder) as kb:
        snap = kb.indexes.snapshot
        live = set(snap.chunk_ids.tolist())
        rows = kb.store.db.execute("SELECT id, text, content FROM chunks ORDER BY id").fetchall()
        rows = [(int(c), t, b) for c, t, b in rows if int(c) in live]
        headers = [t[: len(t) - len(b)].rstrip("\n") for _, t, b in rows]
        chunks = {c: (h, b) for (c, _, b), h in zip(rows, headers, strict=True)}
        sv = sentence_vectors(embedder, chunks, cache)
        lists_in = [collect(snap, sv, embedder.encode_query(t), t) for t in queries]
        lists_ood = [collect(snap, sv, embedder.encode_query(o.question), o.question) for o in ood]
    correct = [{c for c, _, b in rows if q.needle in b} for q in questions for _ in range(2)]
    return Corpus(
        ids=[c for c, _, _ in rows],
        texts=[t for _, t, _ in rows],
        contents=[b for _, _, b in rows],
        headers=headers,
        correct=correct,
        queries=queries,
        ood=[o.question for o in ood],
        lists_in=lists_in,
        lists_ood=lists_ood,
        sentence_vectors=sv.by_chunk,
    )


@dataclass(frozen=True)
class Vectors:
    """Chunk and question vectors of one model, rows in ``Corpus.ids`` order."""

    chunks: np.ndarray
    queries: np.ndarray
    ood: np.ndarray

    def dense(self, q: int, ood: bool) -> list[tuple[int, float]]:
        """The top DEPTH (row, distance) of question ``q``."""
        sims = self.chunks @ (self.ood if ood else self.queries)[q]
        top = np.argsort(-sims)[:DEPTH]
        return [(int(i), 1.0 - float(sims[i])) for i in top]


Order = Callable[[Corpus, int, bool], list[Candidate]]


def variant(original: Vectors, adapted: Vectors, weights: tuple[float, float] | None) -> Order:
    """An order: ``None`` is the product's; else (original, adapted) dense weights beside BM25."""

    def order(corpus: Corpus, q: int, ood: bool) -> list[Candidate]:
        lists = (corpus.lists_ood if ood else corpus.lists_in)[q]
        row = {c: i for i, c in enumerate(corpus.ids)}
        if weights is None:
            fused = fuse(lists.dense, lists.sparse, FUSION)[:POOL]
        else:
            w_original, w_adapted = weights
            legs = [[(corpus.ids[i], 1.0 - d) for i, d in adapted.dense(q, ood)], lists.sparse]
            wts = [w_adapted, FUSION.sparse]
            if w_original:
                legs.insert(0, [(c, -d) for c, d in lists.dense])
                wts.insert(0, w_original)
            fused = score_fusion(legs, wts)[:POOL]
        vec = (original.ood if ood else original.queries)[q]
        cands = [Candidate(c, 1.0 - float(original.chunks[row[c]] @ vec), s) for c, s in fused]
        return sentence_order(cands, vec, corpus.sentence_vectors, SENTENCE_WEIGHT)

    return order


def dense_only(vectors: Vectors) -> Order:
    """The top POOL of one model's dense leg (distances of that model: ranks only)."""

    def order(corpus: Corpus, q: int, ood: bool) -> list[Candidate]:
        return [Candidate(corpus.ids[i], d, -d) for i, d in vectors.dense(q, ood)[:POOL]]

    return order


def _auc(pos: np.ndarray, neg: np.ndarray) -> float:
    less = (pos[:, None] < neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(less / (pos.size * neg.size))


def gate_separation(vectors: Vectors) -> tuple[float, int]:
    """ROC AUC of the best distance, and in-domain refusals at the cut letting 2 OOD through."""
    best_in = 1.0 - (vectors.queries @ vectors.chunks.T).max(axis=1)
    best_ood = 1.0 - (vectors.ood @ vectors.chunks.T).max(axis=1)
    return _auc(best_in, best_ood), int((best_in >= np.sort(best_ood)[2]).sum())


def measure(set_name: str, cache: Path) -> None:
    """Print the table of one set."""
    settings = Settings()
    engine = settings.engine_config()
    corpus = load_corpus(set_name, cache)
    pairs = training_pairs(corpus)
    _, model_path = resolve_model(settings.embedding_model)
    from sentence_transformers import SentenceTransformer

    def vectors(model: SentenceTransformer) -> Vectors:
        def enc(texts: list[str]) -> np.ndarray:
            return np.asarray(model.encode(texts, batch_size=32, normalize_embeddings=True))

        return Vectors(enc(corpus.texts), enc(corpus.queries), enc(corpus.ood))

    original = vectors(SentenceTransformer(model_path, device="cpu"))
    model, seconds = adapt(model_path, pairs)
    adapted = vectors(model)  # type: ignore[arg-type]
    rows: list[tuple[str, Order]] = [
        ("product", variant(original, adapted, None)),
        ("original dense", dense_only(original)),
        ("adapted dense", dense_only(adapted)),
        ("adapted replaces dense", variant(original, adapted, (0.0, 1.0))),
        ("3 legs a=1 o=1", variant(original, adapted, (1.0, 1.0))),
        ("3 legs a=1 o=0.5", variant(original, adapted, (0.5, 1.0))),
    ]
    n = len(corpus.queries)
    print(
        f"\nSet `{set_name}`: {len(corpus.ids)} chunks, {len(pairs)} training pairs, "
        f"one epoch in {seconds:.0f} s; {n} queries, {len(corpus.ood)} out-of-domain; "
        f"gate at {engine.threshold} on the original model's distances.\n"
    )
    print(
        "| variant | R@1 | R@4 | R@20 | MRR | ticket R@4 | needle kept | refused | bluffs "
        "| R@1 vs product | R@4 vs product | MRR vs product |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    base: list[int | None] = []
    for name, order in rows:
        ranks, kept, refused = [], [], 0
        for q in range(n):
            cands = order(corpus, q, False)
            ranks.append(
                next((k for k, c in enumerate(cands, 1) if c.chunk_id in corpus.correct[q]), None)
            )
            passed = gate(
                cands,
                threshold=engine.threshold,
                top_k=engine.top_k,
                max_kept=engine.max_kept,
                margin=engine.keep_margin,
            )
            kept.append(any(c.chunk_id in corpus.correct[q] for c in passed))
            refused += not passed
        bluffs = sum(
            bool(gate(order(corpus, q, True), threshold=engine.threshold, top_k=engine.top_k))
            for q in range(len(corpus.ood))
        )
        base = base or ranks
        h1, h4, h20 = (hits_at_k(ranks, k) for k in (1, 4, 20))
        lo, hi = wilson_interval(sum(h4), n)
        first = ranks is base
        # A dense leg alone carries its own model's distances: its gate cells would mislead.
        gate_cells = (
            "| - | - | - "
            if name in ALONE
            else f"| {sum(kept)}/{n} | {refused}/{n} | {bluffs}/{len(corpus.ood)} "
        )
        print(
            f"| {name} | {sum(h1) / n:.3f} | {sum(h4) / n:.3f} [{lo:.2f}, {hi:.2f}] "
            f"| {sum(h20) / n:.3f} | {mrr(ranks):.3f} | {sum(h4[1::2]) / (n // 2):.3f} "
            + gate_cells
            + f"| {'' if first else _test(h1, hits_at_k(base, 1))} "
            f"| {'' if first else _test(h4, hits_at_k(base, 4))} "
            f"| {'' if first else _mrr_pairs(ranks, base)} |"
        )
    for label, v in (("original", original), ("adapted", adapted)):
        auc, refused_at_2 = gate_separation(v)
        print(
            f"\ngate on the {label} model's best distance: ROC AUC {auc:.3f}, "
            f"in-domain refused at <= 2 bluffs {refused_at_2}/{n}",
            end="",
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--set", dest="sets", action="append", help="bundled set (default: pip-black)"
    )
    parser.add_argument("--cache", default="/tmp/kb-bench-sentences", help="sentence vectors")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for name in args.sets or [DEFAULT_SET]:
        measure(name, Path(args.cache))


if __name__ == "__main__":
    main()
