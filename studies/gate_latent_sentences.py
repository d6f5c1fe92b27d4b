"""Do the latent terms' overlap or the best sentence's distance make a gate that holds on other sets?

Reads the local engine's stored sentence vectors and latent terms
(``Store.sentence_vectors``, ``Store.latent_terms``), so it runs on the
product's own ingestion with the configured model (the study ran
``KB_EMBEDDING_MODEL=multilingual``).

``collect`` indexes each bundled set once (``evaluation.run.indexed_corpus``)
and saves, per query (both phrasings of every in-domain question, then every
out-of-domain question), the fused candidates as ``Engine.ask`` fetches them,
their answer order (``core.selection.PassageSelector``), the needle's chunks,
the chunks' sizes, and these signals, all known before any model call:

* ``d1``: the best candidate's distance (the gate today), ``margin``: the
  second's minus the best's;
* ``bm25``: ``1 / BM25 rank`` of the dense leg's best passage (0: BM25 did not
  find it in its first 100);
* ``latent``: the similarity of the question's latent terms to the best
  candidate's (``LatentTerms.similarity``), ``latent_max``: the largest over
  the first four candidates by distance;
* ``sentence``: ``1 -`` the best candidate's best sentence similarity (its own
  when it has no sentence vectors), ``sentence_min``: the least such distance
  over all candidates;
* how far the best stands out among the question's own candidates, derived
  from the saved distances when ``analyse`` loads them: ``z``, the rest's mean
  distance minus the best's over the rest's standard deviation; ``gap5``, the
  fifth's distance minus the best's; ``spread``, the last's minus the best's.

``analyse`` replays the gate on the saved candidates (``evaluation.outcomes.Replay``)
leave one set out: a logistic score (balanced classes, in-domain queries
against out-of-domain questions) fitted on three sets, its cut chosen there as
the lowest letting at most 5 % of their out-of-domain questions through,
applied to the fourth. A query is answered when its score passes the cut and
its best distance is within the related threshold; its passages are those the
gate keeps once the best has passed (``core.gate.gate``). Reported per
held-out set: needle kept (the needle among the passages the model is given)
and bluffs, against the shipped threshold; also with the cut at the shipped
threshold's own bluffs on the three, within each set two-fold by question (a
per-corpus calibration, held out), and fitted and cut on each set itself
(not held out: the most the signals separate there). Before the tables, each
signal's ROC AUC per set against the distance's.

Run: python -m studies.gate_latent_sentences collect --cache DIR [--set NAME ...]
     python -m studies.gate_latent_sentences analyse --cache DIR
"""

from __future__ import annotations

import argparse
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bot.settings import Settings
from core.config import EngineConfig
from core.gate import CANDIDATES_PER_KEPT
from core.retrieve import Candidate, Mode
from core.selection import PassageSelector, retrieval_query
from evaluation.inputs import bundled_set, bundled_sets, load_ood, load_questions
from evaluation.outcomes import Replay
from evaluation.run import indexed_corpus
from index.embed import LatentEncoder, latent_encoder, load_embedder
from index.knowledge_base import KnowledgeBase

BM25_DEPTH = 100
LATENT_TOP = 4
MAX_BLUFF_SHARE = 0.05
RESAMPLES = 1000
WITHIN_REPEATS = 5

SIGNALS = ("d1", "margin", "bm25", "latent", "latent_max", "sentence", "sentence_min")
# Derived from the saved candidates' distances when loaded (``_standing_out``).
STANDING_OUT = ("z", "gap5", "spread")
# The signals that are larger for in-domain queries (the others: smaller).
HIGHER_INSIDE = frozenset({"margin", "bm25", "latent", "latent_max", *STANDING_OUT})


@dataclass(frozen=True)
class Query:
    """One query's candidates and signals, as saved by ``collect``."""

    in_domain: bool
    candidates: list[Candidate]
    ordered: list[Candidate]
    correct: set[int]
    signals: dict[str, float]


@dataclass(frozen=True)
class SetData:
    """One bundled set's saved queries and what its replay needs."""

    name: str
    queries: list[Query]
    sizes: dict[int, int]
    engine: EngineConfig


def _signals(
    kb: KnowledgeBase,
    latent: LatentEncoder | None,
    text: str,
    vec: np.ndarray,
    cands: Sequence[Candidate],
) -> dict[str, float]:
    backend = kb.search_index
    by_distance = sorted(cands, key=lambda c: c.distance)
    d = [c.distance for c in by_distance]
    dense = backend.search(vec, text, None, 1, Mode.DENSE)
    sparse = backend.search(vec, text, None, BM25_DEPTH, Mode.BM25)
    rank = next(
        (i for i, c in enumerate(sparse, 1) if dense and c.chunk_id == dense[0].chunk_id), 0
    )
    ids = [c.chunk_id for c in by_distance]
    out = {
        "d1": d[0] if d else 2.0,
        "margin": (d[1] - d[0]) if len(d) > 1 else 0.0,
        "bm25": 1.0 / rank if rank else 0.0,
    }
    stored = kb.store.latent_terms(ids[:LATENT_TOP])
    mine = latent.encode_latent([text], role="query") if latent is not None else None
    sims = [mine[0].similarity(stored[i]) if mine and i in stored else 0.0 for i in ids]
    out["latent"] = sims[0] if sims else 0.0
    out["latent_max"] = max(sims[:LATENT_TOP], default=0.0)
    sentences = kb.store.sentence_vectors(ids)
    best = [
        1.0 - float((sentences[c.chunk_id] @ vec).max()) if c.chunk_id in sentences else c.distance
        for c in by_distance
    ]
    out["sentence"] = best[0] if best else 2.0
    out["sentence_min"] = min(best, default=2.0)
    return out


def collect_set(name: str, cache: Path) -> None:
    """Index one bundled set, search every query, save what ``analyse`` replays."""
    paths = bundled_set(name)
    settings = Settings()
    config = settings.index_config()
    embedder = load_embedder(config)
    engine = settings.engine_config()
    questions = load_questions(paths.questions)
    ood = load_ood(paths.ood)
    texts = [(retrieval_query(t), q.needle, True) for q in questions for t in q.phrasings()]
    texts += [(retrieval_query(o.question), "", False) for o in ood]
    with indexed_corpus(paths.corpus, config, embedder, label=name, progress=True) as kb:
        latent = latent_encoder(embedder)
        selector = PassageSelector(kb, engine)
        chunks = {
            int(row["id"]): row["content"]
            for doc in kb.store.documents()
            for row in kb.store.chunk_rows(doc.id)
        }
        queries = []
        for text, needle, inside in texts:
            vec = embedder.encode_query(text)
            cands = kb.search_index.search(
                vec, text, None, engine.top_k * CANDIDATES_PER_KEPT, Mode.HYBRID
            )
            queries.append(
                Query(
                    in_domain=inside,
                    candidates=list(cands),
                    ordered=selector.ordered(text, vec, cands) if inside else list(cands),
                    correct={cid for cid, body in chunks.items() if needle and needle in body},
                    signals=_signals(kb, latent, text, vec, cands),
                )
            )
    sizes = {cid: len(body) for cid, body in chunks.items()}
    data = SetData(name, queries, sizes, engine)
    (cache / f"{name}.pickle").write_bytes(pickle.dumps(data))
    print(f"{name}: {len(queries)} queries saved")


# The combinations measured: the study before's best (distance, margin, BM25
# agreement) and each new signal alone, beside the distance, and beside both.
COMBINATIONS: dict[str, tuple[str, ...]] = {
    "distance alone": ("d1",),
    "distance + BM25 agreement": ("d1", "bm25"),
    "distance + margin + BM25 agreement": ("d1", "margin", "bm25"),
    "latent overlap alone": ("latent",),
    "latent overlap, best of 4 alone": ("latent_max",),
    "best sentence alone": ("sentence",),
    "best sentence, any candidate, alone": ("sentence_min",),
    "distance + latent overlap": ("d1", "latent"),
    "distance + latent overlap, best of 4": ("d1", "latent_max"),
    "distance + best sentence": ("d1", "sentence"),
    "distance + best sentence, any candidate": ("d1", "sentence_min"),
    "distance + BM25 + latent overlap": ("d1", "bm25", "latent"),
    "distance + BM25 + best sentence": ("d1", "bm25", "sentence"),
    "distance + BM25 + latent + best sentence": ("d1", "bm25", "latent", "sentence"),
    "all seven": SIGNALS,
    "distance + z": ("d1", "z"),
    "distance + gap to the fifth + BM25": ("d1", "gap5", "bm25"),
    "distance + z + margin + BM25": ("d1", "z", "margin", "bm25"),
}


def _features(queries: Sequence[Query], names: Sequence[str]) -> np.ndarray:
    return np.array([[q.signals[n] for n in names] for q in queries], dtype=np.float64)


def _fit(x: np.ndarray, inside: np.ndarray, steps: int = 50, l2: float = 1e-3) -> np.ndarray:
    """Logistic regression weights (last: the intercept), classes weighted to balance.

    Newton's method on the standardised features; higher score = in-domain.
    """
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-9
    z = np.hstack([(x - mean) / std, np.ones((len(x), 1))])
    y = inside.astype(np.float64)
    weight = np.where(inside, 0.5 / max(1, inside.sum()), 0.5 / max(1, (~inside).sum()))
    w = np.zeros(z.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(z @ w)))
        grad = z.T @ (weight * (p - y)) + l2 * w
        hess = (z * (weight * p * (1 - p))[:, None]).T @ z + l2 * np.eye(len(w))
        w -= np.linalg.solve(hess, grad)
    scale = np.append(1.0 / std, 0.0)
    return np.append(w[:-1] * scale[:-1], w[-1] - float(np.dot(w[:-1], mean / std)))


def _score(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x @ w[:-1] + w[-1]


def _cut(score: np.ndarray, inside: np.ndarray, near: np.ndarray, allowed: int) -> float:
    """The lowest cut letting at most ``allowed`` out-of-domain questions through.

    Only questions with something within the related threshold (``near``) can pass.
    """
    ood = np.sort(score[~inside & near])[::-1]
    if allowed >= ood.size:
        return -np.inf
    return float(np.nextafter(ood[allowed], np.inf))


@dataclass(frozen=True)
class Held:
    """What a gate gives on one set: needle kept and bluffs."""

    needle_kept: int
    in_domain: int
    bluffs: int
    ood: int


def _replay(data: SetData) -> Replay:
    inside = [q for q in data.queries if q.in_domain]
    return Replay(
        [q.candidates for q in inside],
        [q.candidates for q in data.queries if not q.in_domain],
        [q.correct for q in inside],
        data.sizes,
        top_k=data.engine.top_k,
        max_kept=data.engine.max_kept,
        margin=data.engine.keep_margin,
        kept_order=[q.ordered for q in inside],
    )


def shipped(data: SetData) -> Held:
    """Needle kept and bluffs at the shipped thresholds."""
    o = _replay(data).outcomes(data.engine.threshold, data.engine.related_threshold)
    return Held(sum(o.kept_needle), len(o.kept_needle), sum(o.bluffs), len(o.bluffs))


def decided(data: SetData, passes: np.ndarray) -> Held:
    """Needle kept and bluffs when the queries ``passes`` marks are answered."""
    replay = _replay(data)
    answer, near = data.engine.threshold, data.engine.related_threshold
    kept = bluffs = 0
    i = 0
    for q, ok in zip(data.queries, passes, strict=True):
        if not q.in_domain:
            bluffs += int(ok)
            continue
        if ok:
            # The decision is made: the best passes, as do those the shipped threshold passes.
            chosen = replay.kept(q.ordered, max(answer, q.signals["d1"]), near)
            kept += int(replay.holds_needle(i, chosen))
        i += 1
    return Held(kept, i, bluffs, len(data.queries) - i)


def _near(data: SetData, queries: Sequence[Query]) -> np.ndarray:
    return np.array([q.signals["d1"] <= data.engine.related_threshold for q in queries])


def leave_one_out(
    sets: Sequence[SetData], names: Sequence[str], share: float | None
) -> dict[str, Held]:
    """Per held-out set, what the score fitted and cut on the other sets gives.

    The cut lets through at most ``share`` of the other sets' out-of-domain
    questions; ``None``: as many as the shipped threshold lets through there.
    """
    out = {}
    for held in sets:
        others = [s for s in sets if s is not held]
        train = [q for s in others for q in s.queries]
        inside = np.array([q.in_domain for q in train])
        allowed = (
            sum(shipped(s).bluffs for s in others)
            if share is None
            else int(np.floor(share * (~inside).sum()))
        )
        x = _features(train, names)
        w = _fit(x, inside)
        cut = _cut(_score(x, w), inside, _near(held, train), allowed)
        score = _score(_features(held.queries, names), w)
        out[held.name] = decided(held, (score >= cut) & _near(held, held.queries))
    return out


def in_set(sets: Sequence[SetData], names: Sequence[str]) -> dict[str, Held]:
    """Per set, the score fitted and cut on that set itself at its shipped bluffs (an oracle)."""
    out = {}
    for data in sets:
        inside = np.array([q.in_domain for q in data.queries])
        x = _features(data.queries, names)
        w = _fit(x, inside)
        near = _near(data, data.queries)
        cut = _cut(_score(x, w), inside, near, shipped(data).bluffs)
        out[data.name] = decided(data, (_score(x, w) >= cut) & near)
    return out


def _folds(data: SetData, rng: np.random.Generator) -> np.ndarray:
    """Each query's fold (0 or 1): a question's two phrasings together, halves of each class."""
    inside = np.array([q.in_domain for q in data.queries])
    n_in = int(inside.sum())
    questions = rng.permutation(n_in // 2) % 2
    ood = rng.permutation(int((~inside).sum())) % 2
    return np.concatenate([np.repeat(questions, 2), ood])


def within_set(sets: Sequence[SetData], names: Sequence[str], repeats: int) -> dict[str, Held]:
    """Per set, two-fold by question: fitted and cut on one half, applied to the other.

    The cut lets through the shipped threshold's share of the half's
    out-of-domain questions (rounded down), as a per-corpus calibration would.
    Needle kept and bluffs are summed over both halves and averaged over
    ``repeats`` random splits (rounded).
    """
    rng = np.random.default_rng(0)
    out = {}
    for data in sets:
        base = shipped(data)
        inside = np.array([q.in_domain for q in data.queries])
        x = _features(data.queries, names)
        near = _near(data, data.queries)
        kept, bluffs = [], []
        for _ in range(repeats):
            fold = _folds(data, rng)
            passes = np.zeros(len(data.queries), dtype=bool)
            for f in (0, 1):
                train, test = fold != f, fold == f
                w = _fit(x[train], inside[train])
                allowed = int(np.floor(base.bluffs / base.ood * (~inside[train]).sum()))
                cut = _cut(_score(x[train], w), inside[train], near[train], allowed)
                passes[test] = (_score(x[test], w) >= cut) & near[test]
            held = decided(data, passes)
            kept.append(held.needle_kept)
            bluffs.append(held.bluffs)
        out[data.name] = Held(
            round(float(np.mean(kept))), base.in_domain, round(float(np.mean(bluffs))), base.ood
        )
    return out


def _signed(data: SetData, name: str) -> np.ndarray:
    """One signal per query, signed so that lower means in-domain."""
    s = np.array([q.signals[name] for q in data.queries])
    return -s if name in HIGHER_INSIDE else s


def _auc(s: np.ndarray, inside: np.ndarray) -> float:
    """ROC AUC of a signal that is lower for in-domain queries (1: a perfect separation)."""
    pos, neg = s[inside], s[~inside]
    less = (pos[:, None] < neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(less / (pos.size * neg.size))


def auc_table(sets: Sequence[SetData]) -> list[str]:
    """Per set and signal: AUC, and its difference to the distance's with a 95 % bootstrap interval."""
    rng = np.random.default_rng(0)
    lines = [
        "| signal | " + " | ".join(s.name for s in sets) + " |",
        "|---" * (len(sets) + 1) + "|",
    ]
    draws = {}
    for data in sets:
        inside = np.array([q.in_domain for q in data.queries])
        pos, neg = np.flatnonzero(inside), np.flatnonzero(~inside)
        draws[data.name] = [
            np.concatenate([rng.choice(pos, pos.size), rng.choice(neg, neg.size)])
            for _ in range(RESAMPLES)
        ]
    for sig in (*SIGNALS, *STANDING_OUT):
        cells = []
        for data in sets:
            inside = np.array([q.in_domain for q in data.queries])
            s, base = _signed(data, sig), _signed(data, "d1")
            auc = _auc(s, inside)
            if sig == "d1":
                cells.append(f"{auc:.3f}")
                continue
            diffs = [_auc(s[i], inside[i]) - _auc(base[i], inside[i]) for i in draws[data.name]]
            low, high = np.percentile(diffs, [2.5, 97.5])
            cells.append(f"{auc:.3f} [{low:+.3f}, {high:+.3f}]")
        lines.append(f"| {sig} | " + " | ".join(cells) + " |")
    return lines


class _Unpickler(pickle.Unpickler):
    """Finds this module's classes whether the cache was saved under ``-m`` or an import."""

    def find_class(self, module: str, name: str) -> type:
        if module == "__main__" and name in ("Query", "SetData"):
            return {"Query": Query, "SetData": SetData}[name]
        return super().find_class(module, name)


def _standing_out(q: Query) -> dict[str, float]:
    """How far the best distance stands out among the query's own candidates."""
    d = np.sort(np.array([c.distance for c in q.candidates] or [2.0]))
    rest = d[1:] if d.size > 1 else d
    return {
        "z": float((rest.mean() - d[0]) / (rest.std() + 1e-6)),
        "gap5": float(d[min(4, d.size - 1)] - d[0]),
        "spread": float(d[-1] - d[0]),
    }


def _load(path: Path) -> SetData:
    with path.open("rb") as f:
        data: SetData = _Unpickler(f).load()
    for q in data.queries:
        q.signals.update(_standing_out(q))
    return data


def analyse(cache: Path) -> None:
    """Print the leave-one-set-out tables."""
    sets = [_load(p) for p in sorted(cache.glob("*.pickle"))]
    names = [s.name for s in sets]
    print("ROC AUC, in-domain queries against out-of-domain questions, and its difference")
    print("to the best distance's (95 % paired bootstrap interval)\n")
    print("\n".join(auc_table(sets)))
    base = {s.name: shipped(s) for s in sets}
    tables = {
        f"leave one set out, cut at <= {MAX_BLUFF_SHARE:.0%} bluffs on the other three": (
            lambda combo: leave_one_out(sets, combo, MAX_BLUFF_SHARE)
        ),
        "leave one set out, cut at the shipped threshold's bluffs on the other three": (
            lambda combo: leave_one_out(sets, combo, None)
        ),
        "within each set, two-fold by question, cut at the shipped bluff share (mean of 5 splits)": (
            lambda combo: within_set(sets, combo, WITHIN_REPEATS)
        ),
        "fitted and cut on the set itself at its shipped bluffs (not held out)": (
            lambda combo: in_set(sets, combo)
        ),
    }
    ceiling = {s.name: decided(s, np.array([q.in_domain for q in s.queries])) for s in sets}
    print("\nevery in-domain query answered, no out-of-domain question (the most any gate gives)\n")
    print(_row("no gate", ceiling, base, names))
    for title, run in tables.items():
        print(f"\n{title}\n")
        header = " | ".join(f"{n} kept, bluffs" for n in names)
        print(f"| gate | {header} | needle kept, all | bluffs, all |")
        print("|---" * (len(names) + 3) + "|")
        rows = {"shipped threshold": base} | {
            label: run(combo) for label, combo in COMBINATIONS.items()
        }
        for label, held in rows.items():
            print(_row(label, held, base, names))


def _row(label: str, held: dict[str, Held], base: dict[str, Held], names: Sequence[str]) -> str:
    cells = " | ".join(
        f"{held[n].needle_kept}/{held[n].in_domain}, {held[n].bluffs}/{held[n].ood}" for n in names
    )
    kept = sum(h.needle_kept for h in held.values())
    total = sum(h.in_domain for h in held.values())
    bluffs = sum(h.bluffs for h in held.values())
    ood = sum(h.ood for h in held.values())
    holds = all(held[n].bluffs <= base[n].bluffs for n in names)
    more = kept > sum(b.needle_kept for b in base.values())
    mark = " **(holds, more)**" if holds and more else " (holds)" if holds else ""
    return f"| {label}{mark} | {cells} | {kept}/{total} | {bluffs}/{ood} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["collect", "analyse"])
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--set", dest="sets", action="append", help="bundled set (default: all)")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.step == "collect":
        for name in args.sets or bundled_sets():
            if not (args.cache / f"{name}.pickle").exists():
                collect_set(name, args.cache)
    else:
        analyse(args.cache)


if __name__ == "__main__":
    main()
