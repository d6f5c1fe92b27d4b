"""MiniLM's dense leg beside e5's: a third leg in the hybrid fusion, replayed per set.

The product (multilingual-e5-small) fuses e5's dense leg and BM25 (min-max
score fusion, ``index.search.fusion.FUSION``), the dense leg ordered by the
query map and searched again from the fused order's first passage
(``FEEDBACK``). The variants add a third leg to that fusion: the bundled
all-MiniLM-L6-v2's nearest passages to the question (its similarities, min-max
normalised as the others are), at weight ``w`` (e5's dense leg weighs 1, BM25
0.5), either for every question or for the questions the product analyses in
English alone (``index.search.tokens.query_languages`` gives ``[None]``: a
knowledge base of English only, or a question detected as English), MiniLM
searching every passage or, for English questions, the English passages
alone (a passage's language as ingestion detected it). Every
candidate keeps e5's distance to the question and e5's nearest passage stays
among the candidates (the product's ``_keeping``), so the gate decides on
what it did without: checked per query below (in-domain and out-of-domain),
not assumed.

``collect`` reopens (or indexes, on first use) a bundled set's kept data dir
with ``studies.english_e5.open_indexed`` (the product's ingestion, default
model), embeds every passage's embedded text (``chunks.text``, the heading
path and the content, as e5 reads it) with MiniLM into a FAISS flat
inner-product index (kept beside the data dir), and searches every query with
the product and each variant, in process: ``index.search.fusion.fuse`` is
replaced, for the variant's questions, by the same score fusion with MiniLM's
list as a fourth (both the first fusion and the feedback's second one call
it). Per in-domain query (both phrasings): the needle's rank in the fused
order (``top_k x CANDIDATES_PER_KEPT`` = 20 candidates: hybrid R@4), in the
answer order (``PassageSelector.ordered``: final R@4) and, replayed at the
shipped thresholds (``evaluation.outcomes.Replay``), whether it is answered,
whether the needle is kept and shown; per out-of-domain question whether it
is bluffed; and each leg's rank of the needle (e5 dense, BM25, MiniLM dense).
``report`` pairs each variant against the product (exact two-sided sign
test) per set, the English sets' weight chosen on one and held out on the
other. A later run on the same kept data dir measures only the variants its
kept results lack. ``cost`` times MiniLM against e5 on the same passages.

Run: python -m studies.minilm_beside_e5 collect --set NAME [--cache DIR]
     python -m studies.minilm_beside_e5 report [--cache DIR]
     python -m studies.minilm_beside_e5 cost [--set NAME] [--cache DIR] [--passages N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import faiss
import numpy as np

import index.search.fusion as fusion_module
from bot.settings import Settings
from core.gate import CANDIDATES_PER_KEPT
from core.retrieve import Mode
from core.selection import PassageSelector, retrieval_query
from evaluation.inputs import bundled_set, load_ood, load_questions
from evaluation.outcomes import Replay
from evaluation.stats import hits_at_k, paired_counts, wilson_interval
from index.embed import load_embedder, passage_encoder
from index.embed.base import Embedder
from index.ingest.sentences import sentence_spans
from index.search import LocalSearchIndex
from index.search.fusion import Fusion, score_fusion
from index.search.tokens import query_languages
from studies.dense_feedback import ENGLISH, MULTILINGUAL, _cell, _hits, _rank
from studies.english_e5 import open_indexed

MINILM = "bundled:all-MiniLM-L6-v2"
WEIGHTS = (0.25, 0.5, 1.0)
MEASURES = ("hybrid", "final", "kept", "shown")
Pairs = list[tuple[int, float]]


@dataclass(frozen=True)
class Variant:
    """MiniLM's leg at ``weight`` in the fusion, for every question or English ones only,
    searching every passage or (``english_passages``) those in English only."""

    weight: float
    english_only: bool
    english_passages: bool = False

    @property
    def name(self) -> str:
        return (
            f"MiniLM {self.weight}"
            + (", English only" if self.english_only else "")
            + (", English passages" if self.english_passages else "")
        )


def variants() -> list[Variant]:
    """Weights 0.25, 0.5 and 1.0, for English questions only and for all; then MiniLM's
    leg kept to the English passages (the same on a knowledge base of English only);
    last a control, MiniLM's leg at weight 0 (the replaced fusion alone)."""
    out = [Variant(w, e) for e in (True, False) for w in WEIGHTS]
    return out + [Variant(w, True, english_passages=True) for w in WEIGHTS] + [Variant(0.0, False)]


def minilm(cache: Path) -> Embedder:
    """The bundled all-MiniLM-L6-v2 as the product runs it (ONNX), its export kept under ``cache``."""
    config = Settings().index_config()
    return load_embedder(
        replace(config, embedding_model=MINILM, encoder_cache=cache / "encoders")
    )  # fmt: skip


class MiniLMLeg:
    """MiniLM's vectors of a set's passages in a FAISS flat inner-product index (exact cosine)."""

    def __init__(self, embedder: Embedder, ids: Sequence[int], vectors: np.ndarray) -> None:
        self.embedder = embedder
        self.ids = np.asarray(ids, dtype=np.int64)
        self.index = faiss.IndexFlatIP(vectors.shape[1])
        self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def search(self, vector: np.ndarray, k: int) -> Pairs:
        """The ``k`` nearest passages, ``(chunk id, cosine)``, best first."""
        scores, rows = self.index.search(vector.reshape(1, -1).astype(np.float32), k)
        return [
            (int(self.ids[r]), float(s)) for r, s in zip(rows[0], scores[0], strict=True) if r >= 0
        ]


def passage_vectors(embedder: Embedder, texts: Sequence[str], kept: Path) -> np.ndarray:
    """MiniLM's vectors of ``texts``, computed once and kept in ``kept``."""
    if kept.exists():
        vectors = np.load(kept)
        if len(vectors) == len(texts):
            return vectors
    vectors = np.asarray(embedder.encode(list(texts)), dtype=np.float32)
    np.save(kept, vectors)
    return vectors


@contextmanager
def third_leg(extra: Pairs | None, weight: float) -> Iterator[None]:
    """``index.search.fusion.fuse`` with ``extra`` as a third list at ``weight`` (``None``: unchanged).

    The product's score fusion: e5's distances as a decreasing score, BM25 in
    the question's language and in the others, and MiniLM's cosines, each
    min-max normalised over its own list.
    """
    if extra is None:
        yield
        return
    product = fusion_module.fuse

    def fuse(dense: Sequence[tuple[int, float]], sparse: Sequence[tuple[int, float]],
             fusion: Fusion, foreign: Sequence[tuple[int, float]] = ()) -> Pairs:  # fmt: skip
        if fusion.method != "score":
            raise SystemExit("the study adds a leg to the score fusion, the product's")
        similarity = [(cid, -d) for cid, d in dense]
        return score_fusion(
            [similarity, sparse, foreign, extra],
            [fusion.dense, fusion.sparse, fusion.sparse, weight],
        )

    fusion_module.fuse = fuse
    try:
        yield
    finally:
        fusion_module.fuse = product


def collect(name: str, cache: Path) -> None:
    """Search every query of the set with the product and each variant; save the per-query outcomes."""
    settings = Settings()
    engine = settings.engine_config()
    kb = open_indexed(name, cache, settings)
    paths = bundled_set(name)
    questions = load_questions(paths.questions)
    ood = load_ood(paths.ood)
    index = kb.search_index
    if not isinstance(index, LocalSearchIndex):
        raise SystemExit("the study searches the local engine: unset KB_SEARCH_ENGINE")
    rows_db = [row for doc in kb.store.documents() for row in kb.store.chunk_rows(doc.id)]
    chunks = {int(row["id"]): row["content"] for row in rows_db}
    mini = minilm(cache)
    started = time.perf_counter()
    vectors_mini = passage_vectors(
        mini, [row["text"] for row in rows_db], cache / f"{name}.minilm.npy"
    )
    print(f"{name}: {len(rows_db)} passages embedded with MiniLM in "
          f"{time.perf_counter() - started:.1f}s", flush=True)  # fmt: skip
    leg = MiniLMLeg(mini, [int(row["id"]) for row in rows_db], vectors_mini)
    in_english = [i for i, row in enumerate(rows_db) if row["language"] in (None, "en")]
    leg_en = MiniLMLeg(mini, [int(rows_db[i]["id"]) for i in in_english], vectors_mini[in_english])
    rows = [
        (retrieval_query(t), q.needle, q.lang or "en", phrasing)
        for q in questions
        for phrasing, t in zip(("doc", "ticket"), q.phrasings(), strict=True)
    ]
    correct = [{cid for cid, body in chunks.items() if needle in body} for _, needle, _, _ in rows]
    language = {int(row["id"]): row["language"] for row in rows_db}
    texts = [text for text, *_ in rows]
    ood_texts = [retrieval_query(o.question) for o in ood]
    every = texts + ood_texts
    vectors = [kb.embedder.encode_query(t) for t in every]
    corpus = index.indexes.snapshot.corpus_languages
    english = [query_languages(t, corpus) == [None] for t in every]
    k = engine.top_k * CANDIDATES_PER_KEPT
    depth = max(k, index.depth)
    mini_vectors = [mini.encode_query(t) for t in every]
    extra = [leg.search(v, depth) for v in mini_vectors]
    extra_en = [leg_en.search(v, depth) for v in mini_vectors]
    selector = PassageSelector(kb, engine)
    sizes = {cid: len(body) for cid, body in chunks.items()}
    n = len(texts)
    out: dict[str, object] = {
        "langs": [lang for _, _, lang, _ in rows],
        "phrasing": [p for *_, p in rows],
        "english": english[:n],
        "ood_english": english[n:],
        "needle_langs": [sorted({language[cid] or "" for cid in ids}) for ids in correct],
        "legs": {
            "e5 dense": [
                _rank(index.search(v, t, None, k, Mode.DENSE), ids)
                for t, v, ids in zip(texts, vectors[:n], correct, strict=True)
            ],
            "BM25": [
                _rank(index.search(v, t, None, k, Mode.BM25), ids)
                for t, v, ids in zip(texts, vectors[:n], correct, strict=True)
            ],
            "MiniLM dense": [
                next((i for i, (c, _) in enumerate(e[:k], 1) if c in ids), None)
                for e, ids in zip(extra[:n], correct, strict=True)
            ],
        },  # fmt: skip
        "variants": {},
    }
    kept = cache / f"{name}.minilm.json"
    done = json.loads(kept.read_text())["variants"] if kept.exists() else {}
    for variant in [None, *variants()]:
        vname = "product" if variant is None else variant.name
        if vname in done:  # measured by an earlier run on the same kept data dir
            out["variants"][vname] = done[vname]  # type: ignore[index]
            continue
        started = time.perf_counter()
        cands = []
        for i, (t, v) in enumerate(zip(every, vectors, strict=True)):
            applies = variant is not None and (english[i] or not variant.english_only)
            weight = variant.weight if variant is not None else 0.0
            leg_of = extra_en if variant is not None and variant.english_passages else extra
            with third_leg(leg_of[i] if applies else None, weight):
                cands.append(index.search(v, t, None, k, Mode.HYBRID))
        in_cands, ood_cands = cands[:n], cands[n:]
        ordered = [
            selector.ordered(t, v, c) for t, v, c in zip(texts, vectors[:n], in_cands, strict=True)
        ]
        replay = Replay(
            in_domain=in_cands,
            ood=ood_cands,
            correct=correct,
            sizes=sizes,
            top_k=engine.top_k,
            max_kept=engine.max_kept,
            margin=engine.keep_margin,
            kept_order=ordered,
        )
        outcomes = replay.outcomes(engine.threshold, engine.related_threshold)
        out["variants"][vname] = {  # type: ignore[index]
            "hybrid": [_rank(c, ids) for c, ids in zip(in_cands, correct, strict=True)],
            "final": [_rank(c, ids) for c, ids in zip(ordered, correct, strict=True)],
            "answered": outcomes.answered,
            "hard_refused": outcomes.hard_refused,
            "kept": outcomes.kept_needle,
            "shown": outcomes.shown,
            "bluffs": outcomes.bluffs,
            "best": [min((c.distance for c in cs), default=2.0) for cs in cands],
            "ood_related": [[c.chunk_id for c in replay.kept(cs, engine.threshold,
                                                               engine.related_threshold)]
                            for cs in ood_cands],
        }  # fmt: skip
        print(f"{name} {vname}: {time.perf_counter() - started:.1f}s", flush=True)
    kb.store.close()
    kept.write_text(json.dumps(out))


def report(cache: Path) -> None:
    """Per set, every variant paired against the product; the gate's decisions; the weight held out."""
    data = {
        name: json.loads((cache / f"{name}.minilm.json").read_text())
        for name in (*ENGLISH, *MULTILINGUAL)
        if (cache / f"{name}.minilm.json").exists()
    }
    print("\n## The gate's decision per query against the product's\n")
    for name, d in data.items():
        base = d["variants"]["product"]
        changed = [
            f"{vname} {what}"
            for vname, v in d["variants"].items()
            for what in ("answered", "hard_refused", "bluffs", "best")
            if v[what] != base[what]
        ]
        related = sum(
            a != b
            for v in d["variants"].values()
            for a, b in zip(v["ood_related"], base["ood_related"], strict=True)
        )
        n_ood = len(base["bluffs"])
        print(f"* {name}: {len(d['english'])} in-domain queries ({sum(d['english'])} English), "
              f"{n_ood} out-of-domain ({sum(d['ood_english'])} English); "
              f"changed: {', '.join(changed) or 'nothing'}; out-of-domain passages shown "
              f"differ in {related} (question, variant) pairs")  # fmt: skip
    print("\n## Each leg's R@4, and which legs hold the needle in their first four\n")
    print("| set | e5 dense | BM25 | MiniLM dense | e5 or BM25 | any of the three | MiniLM only |")
    print("|---|---|---|---|---|---|---|")
    for name, d in data.items():
        e5, bm, mi = (hits_at_k(d["legs"][x], 4) for x in ("e5 dense", "BM25", "MiniLM dense"))
        n = len(e5)
        two = [a or b for a, b in zip(e5, bm, strict=True)]
        three = [a or c for a, c in zip(two, mi, strict=True)]
        only = sum(c and not a for a, c in zip(two, mi, strict=True))
        print(f"| {name} | {sum(e5)}/{n} | {sum(bm)}/{n} | {sum(mi)}/{n} | {sum(two)} | "
              f"{sum(three)} | {only} |")  # fmt: skip
    print("\n## Every variant against the product, per set\n")
    print("| set | variant | " + " | ".join(MEASURES) + " | answered |")
    print("|---|---|" + "---|" * (len(MEASURES) + 1))
    for name, d in data.items():
        base = d["variants"]["product"]
        for vname, v in d["variants"].items():
            cells = [_cell(_hits(v, m), _hits(base, m)) for m in MEASURES]
            answered = sum(bool(x) for x in v["answered"])
            print(f"| {name} | {vname} | " + " | ".join(cells) + f" | {answered} |")
    print("\n## Final R@4 per set with its 95 % interval (Wilson), and each group of sets summed\n")
    names = list(next(iter(data.values()))["variants"])
    groups: list[tuple[str, Sequence[str]]] = [(s, (s,)) for s in data]
    groups += [("English", ENGLISH), ("multilingual", MULTILINGUAL)]
    present = [(g, [s for s in sets if s in data]) for g, sets in groups]
    present = [(g, sets) for g, sets in present if sets]
    print("| variant | " + " | ".join(g for g, _ in present) + " |")
    print("|---|" + "---|" * len(present))
    for vname in names:
        cells = []
        for _, sets in present:
            a = [h for s in sets for h in _hits(data[s]["variants"][vname], "final")]
            b = [h for s in sets for h in _hits(data[s]["variants"]["product"], "final")]
            low, high = wilson_interval(sum(a), len(a))
            cells.append(
                f"{sum(a) / len(a):.3f} [{low:.2f}, {high:.2f}] "
                + _cell(a, b)[len(str(sum(a))) + 1 :]
            )
        print(f"| {vname} | " + " | ".join(cells) + " |")
    english = [s for s in ENGLISH if s in data]
    if len(english) == 2:
        print(
            "\n## The weight chosen on one English set (final R@4 wins - losses), held out on the other\n"
        )
        for chosen_on, held_out in (english, english[::-1]):
            best = max(
                (v for v in variants() if v.english_only),
                key=lambda v: _margin(data[chosen_on], v.name, "final"),
            )
            d = data[held_out]
            cells = [_cell(_hits(d["variants"][best.name], m), _hits(d["variants"]["product"], m))
                     for m in MEASURES]  # fmt: skip
            print(f"* chosen on {chosen_on}: {best.name}; on {held_out}: " + ", ".join(
                f"{m} {c}" for m, c in zip(MEASURES, cells, strict=True)))  # fmt: skip
    for name, d in data.items():
        langs = sorted(set(d["langs"]))
        if len(langs) < 2:
            continue
        print(f"\n## {name} per question language (final R@4)\n")
        print(
            "| variant | "
            + " | ".join(f"{lang} ({d['langs'].count(lang)})" for lang in langs)
            + " |"
        )
        print("|---|" + "---|" * len(langs))
        base = d["variants"]["product"]
        for vname, v in d["variants"].items():
            cells = []
            for lang in langs:
                mask = [x == lang for x in d["langs"]]
                a = [h for h, m in zip(_hits(v, "final"), mask, strict=True) if m]
                b = [h for h, m in zip(_hits(base, "final"), mask, strict=True) if m]
                cells.append(_cell(a, b))
            print(f"| {vname} | " + " | ".join(cells) + " |")
    print(
        "\n## English questions of the multilingual sets, by their needle's language (final R@4)\n"
    )
    for name, d in data.items():
        if "needle_langs" not in d or len(set(d["langs"])) < 2:
            continue
        base = d["variants"]["product"]
        for label, same in (("needle in English", True), ("needle in another language", False)):
            mask = [
                e and (n == ["en"]) == same
                for e, n in zip(d["english"], d["needle_langs"], strict=True)
            ]
            for vname, v in d["variants"].items():
                a = [h for h, m in zip(_hits(v, "final"), mask, strict=True) if m]
                b = [h for h, m in zip(_hits(base, "final"), mask, strict=True) if m]
                print(f"* {name}, {label} ({sum(mask)}): {vname} {_cell(a, b)}")
    print("\n## Ticket phrasings alone (final R@4)\n")
    for name, d in data.items():
        mask = [p == "ticket" for p in d["phrasing"]]
        base = d["variants"]["product"]
        for vname in d["variants"]:
            if vname == "product":
                continue
            a = [h for h, m in zip(_hits(d["variants"][vname], "final"), mask, strict=True) if m]
            b = [h for h, m in zip(_hits(base, "final"), mask, strict=True) if m]
            print(f"* {name} {vname}: {_cell(a, b)} of {sum(mask)}")


def _margin(d: dict, vname: str, measure: str) -> int:
    w, lo = paired_counts(
        _hits(d["variants"][vname], measure), _hits(d["variants"]["product"], measure)
    )
    return w - lo


def cost(name: str, cache: Path, count: int) -> None:
    """Passages per second of MiniLM and of e5 on the same ``count`` passages: median of 3 runs each.

    e5 is timed as ingestion runs it (one pass for the vector, the sentence
    spans and the latent terms) and as a plain ``encode``; MiniLM as a plain
    ``encode`` (its vector is all a third leg needs). One query's encoding is
    timed too (median of the questions' first 50), and the passages each model truncates counted.
    """
    settings = Settings()
    kb = open_indexed(name, cache, settings)
    rows = [row for doc in kb.store.documents() for row in kb.store.chunk_rows(doc.id)][:count]
    texts = [row["text"] for row in rows]
    spans = [sentence_spans(row["text"], row["content"]) for row in rows]
    questions = [
        retrieval_query(q.phrasings()[0]) for q in load_questions(bundled_set(name).questions)
    ][:50]
    e5 = kb.embedder
    mini = minilm(cache)
    one_pass = passage_encoder(e5)
    mini.encode(texts[:8])
    e5.encode(texts[:8])
    runs: dict[str, list[float]] = {"MiniLM encode": [], "e5 encode": [], "e5 ingestion pass": []}
    for _ in range(3):
        for label, call in (
            ("MiniLM encode", lambda: mini.encode(texts)),
            ("e5 encode", lambda: e5.encode(texts)),
            ("e5 ingestion pass", lambda: one_pass.encode_passages(texts, spans, latent=True)
             if one_pass is not None else None),
        ):  # fmt: skip
            started = time.perf_counter()
            call()
            runs[label].append(time.perf_counter() - started)
            print(f"{label}: {len(texts) / runs[label][-1]:.1f} passages/s  "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)  # fmt: skip
    for label, times in runs.items():
        print(f"* {label}: median {len(texts) / statistics.median(times):.1f} passages/s "
              f"({', '.join(f'{len(texts) / t:.1f}' for t in times)})")  # fmt: skip
    every = [row["text"] for doc in kb.store.documents() for row in kb.store.chunk_rows(doc.id)]
    for label, embedder in (("MiniLM", mini), ("e5", e5)):
        over = sum(n > embedder.max_tokens for n in embedder.count_tokens_many(every))
        print(f"* {label}: {over} of the set's {len(every)} passages exceed its "
              f"{embedder.max_tokens} tokens (truncated)")  # fmt: skip
    for label, embedder in (("MiniLM", mini), ("e5", e5)):
        times = []
        for q in questions:
            started = time.perf_counter()
            embedder.encode_query(q)
            times.append(time.perf_counter() - started)
        print(f"* {label} one query: median {1000 * statistics.median(times):.1f} ms")
    kb.store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--set", dest="sets", action="append", required=True)
    c.add_argument("--cache", type=Path, default=Path("/tmp/english-cache"))
    r = sub.add_parser("report")
    r.add_argument("--cache", type=Path, default=Path("/tmp/english-cache"))
    t = sub.add_parser("cost")
    t.add_argument("--set", dest="name", default="pip-black")
    t.add_argument("--cache", type=Path, default=Path("/tmp/english-cache"))
    t.add_argument("--passages", type=int, default=300)
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.command == "collect":
        for name in args.sets:
            collect(name, args.cache)
    elif args.command == "report":
        report(args.cache)
    else:
        cost(args.name, args.cache, args.passages)


if __name__ == "__main__":
    main()
