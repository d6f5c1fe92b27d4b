"""Does correcting the distance for passage "hubness" (CSLS) let the gate answer more without bluffing?

Some passages are *hubs*: close to many questions whatever they ask (generic
passages, tables of contents, licence text), and an out-of-domain question
tends to land on one. CSLS (cross-domain similarity local scaling) scores a
question ``q`` against a passage ``p`` as ``2 cos(q, p) - r_q - r_p``, where
``r_p`` is the mean similarity of ``p`` to its ``k`` nearest neighbours and
``r_q`` that of ``q`` to its ``k`` nearest passages. As a distance (lower:
closer, the gate's sense) that is ``d + (r_p + r_q) / 2`` up to a constant.

``collect`` indexes each bundled set once with the configured model
(``evaluation.run.indexed_corpus``: the product's ingestion) and saves, per
query (both phrasings of every in-domain question, then every out-of-domain
question), the fused candidates as ``Engine.ask`` fetches them, their answer
order (``core.selection.PassageSelector``), the needle's chunks and the
question's language and vector; per set, every passage's vector, and the
vectors of a sample of the corpus's own sentences embedded as questions
(pseudo-queries) with the passage each comes from.

``analyse`` derives each passage's ``r_p`` from three kinds of neighbours, all
computable once per passage when it is indexed:

* ``pp``: its ``k`` nearest *other passages*;
* ``sent``: its ``k`` nearest pseudo-queries (the corpus's sentences embedded
  as questions), its own sentences left out;
* ``foreign``: its ``k`` nearest questions of the *other* bundled sets (in-
  and out-of-domain: questions about something else, as a shipped bank of
  generic questions would be);

and from them these gate signals, each the least over the question's 20
fused candidates of a corrected distance (the candidates' order and the
passages given to the model are the product's; only the decision changes):

* ``d1``: the best distance (the gate today);
* ``d + a r_p``: the passage side of CSLS only (``a = 0.5`` is CSLS's weight),
  a per-passage offset;
* ``csls``: ``d + (r_p + r_q) / 2``, with ``r_q`` over the question's 10
  nearest passages;
* ``d + 0.5 (r_p - median)``: the offset, the corpus's median ``r_p`` taken off;
* ``z``: ``(d - mu_p) / sigma_p``, the passage's typical distance to its
  neighbours of that kind as its normaliser (``mu_p``, ``sigma_p`` over all);
* ``r_p ... of the best alone``: how hub-like the closest candidate is.

In-set, the needles kept are paired query by query with ``d1``'s (exact sign
test); ``chosen on the other three`` picks, per held-out set, the signal that
keeps the most needles held out among the other three.

For each: ROC AUC (in-domain queries against out-of-domain questions) with a
95 % paired bootstrap interval of its difference to ``d1``'s, and the needle
kept (the needle among the passages the model is given, as ``core.gate.gate``
keeps them once the decision is made) at the largest cut letting at most 2 of
every 32 out-of-domain questions through: chosen on the other three sets
(leave one set out, held out) and on the set itself (an oracle). A query is
answered when its signal passes the cut and its best distance is within the
related threshold (nothing close: no model call). Per language on the
multilingual sets, at the held-out cut.

Run: python -m studies.hubness collect --cache DIR [--set NAME ...]
     python -m studies.hubness analyse --cache DIR
"""

from __future__ import annotations

import argparse
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bot.settings import Settings
from core.gate import CANDIDATES_PER_KEPT
from core.retrieve import Mode
from core.selection import PassageSelector, retrieval_query
from evaluation.inputs import bundled_set, bundled_sets, load_ood, load_questions
from evaluation.run import indexed_corpus
from evaluation.stats import sign_test
from index.embed import load_embedder
from index.ingest.sentences import sentences
from studies.gate_latent_sentences import (
    Held,
    Query,
    SetData,
    _auc,
    _replay,
    decided,
    shipped,
)

# Pseudo-queries per set: sentences of at least this many words, sampled.
SENTENCE_SAMPLE = 3000
SENTENCE_WORDS = 4
BLUFFS_PER_32 = 2
RESAMPLES = 1000


@dataclass(frozen=True)
class HubQuery:
    """One query as ``collect`` saves it: the replay's query, its language and vector."""

    query: Query
    lang: str
    vector: np.ndarray


@dataclass(frozen=True)
class HubSet:
    """One bundled set: its queries, every passage's vector, and the pseudo-queries."""

    data: SetData
    queries: list[HubQuery]
    ids: np.ndarray  # chunk ids, aligned with ``passages``
    passages: np.ndarray  # (n, dim) unit vectors
    pseudo: np.ndarray  # (m, dim) sentences embedded as questions
    owners: np.ndarray  # (m,) the chunk id each pseudo-query comes from
    model: str = ""
    extra: dict[str, float] = field(default_factory=dict)


def collect_set(name: str, cache: Path) -> None:
    """Index one bundled set, search every query, save what ``analyse`` needs."""
    paths = bundled_set(name)
    settings = Settings()
    config = settings.index_config()
    embedder = load_embedder(config)
    engine = settings.engine_config()
    questions = load_questions(paths.questions)
    ood = load_ood(paths.ood)
    texts = [(retrieval_query(t), q.needle, True, q.lang) for q in questions for t in q.phrasings()]
    texts += [(retrieval_query(o.question), "", False, o.lang) for o in ood]
    with indexed_corpus(paths.corpus, config, embedder, label=name, progress=True) as kb:
        selector = PassageSelector(kb, engine)
        chunks = {
            int(row["id"]): row["content"]
            for doc in kb.store.documents()
            for row in kb.store.chunk_rows(doc.id)
        }
        rows = list(kb.store.searchable_chunks(kb.indexes.embedding_model, kb.indexes.dimensions))
        ids = np.array([int(r["id"]) for r in rows], dtype=np.int64)
        passages = np.stack([np.frombuffer(r["vector"], dtype=np.float32) for r in rows])
        queries = []
        for text, needle, inside, lang in texts:
            vec = embedder.encode_query(text)
            cands = kb.search_index.search(
                vec, text, None, engine.top_k * CANDIDATES_PER_KEPT, Mode.HYBRID
            )
            best = min((c.distance for c in cands), default=2.0)
            query = Query(
                in_domain=inside,
                candidates=list(cands),
                ordered=selector.ordered(text, vec, cands) if inside else list(cands),
                correct={cid for cid, body in chunks.items() if needle and needle in body},
                signals={"d1": best},
            )
            queries.append(HubQuery(query, lang, np.asarray(vec, dtype=np.float32)))
        pool = [
            (s, cid)
            for cid in ids.tolist()
            for s in sentences(chunks.get(cid, ""))
            if len(s.split()) >= SENTENCE_WORDS
        ]
        rng = np.random.default_rng(0)
        picked = rng.choice(len(pool), min(SENTENCE_SAMPLE, len(pool)), replace=False)
        sample = [pool[i] for i in sorted(picked.tolist())]
        pseudo = embedder.encode([s for s, _ in sample], role="query")
    sizes = {cid: len(body) for cid, body in chunks.items()}
    data = SetData(name, [q.query for q in queries], sizes, engine)
    hub = HubSet(
        data,
        queries,
        ids,
        passages,
        np.asarray(pseudo, dtype=np.float32),
        np.array([cid for _, cid in sample], dtype=np.int64),
        model=config.embedding_model,
    )
    (cache / f"{name}.pickle").write_bytes(pickle.dumps(hub))
    print(f"{name}: {len(queries)} queries, {ids.size} passages, {len(sample)} pseudo-queries")


# The neighbours' counts and weights measured (a grid, so the best of it is
# an optimistic pick: ``chosen on the other three`` is the held-out choice).
KS = (5, 10, 50)
WEIGHTS = (0.5, 1.0, 2.0)
SOURCES = ("pp", "sent", "foreign")
SOURCE_NAMES = {
    "pp": "other passages",
    "sent": "the corpus's sentences as questions",
    "foreign": "other sets' questions",
}


@dataclass(frozen=True)
class Hubness:
    """One set's per-passage hubness figures, aligned with ``HubSet.ids``."""

    r: dict[tuple[str, int], np.ndarray]  # (source, k) -> mean similarity to the k nearest
    mu: dict[str, np.ndarray]  # source -> mean distance to all its neighbours
    sigma: dict[str, np.ndarray]
    row: dict[int, int]  # chunk id -> row


def _top_mean(sims: np.ndarray, k: int) -> np.ndarray:
    """Per row, the mean of its ``k`` largest entries (``-inf`` entries never among them)."""
    k = min(k, sims.shape[1])
    return np.partition(sims, sims.shape[1] - k, axis=1)[:, -k:].mean(axis=1)


def _masked_stats(sims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the mean and standard deviation of ``1 - sims`` over its finite entries."""
    ok = np.isfinite(sims)
    d = np.where(ok, 1.0 - sims, 0.0)
    n = ok.sum(axis=1)
    mean = d.sum(axis=1) / n
    var = (np.where(ok, (d - mean[:, None]) ** 2, 0.0)).sum(axis=1) / n
    return mean, np.sqrt(var) + 1e-6


def hubness(hub: HubSet, foreign: np.ndarray) -> Hubness:
    """Each passage's neighbours among passages, pseudo-queries and foreign questions."""
    p = hub.passages.astype(np.float64)
    neighbours = {
        "pp": p @ p.T,
        "sent": p @ hub.pseudo.astype(np.float64).T,
        "foreign": p @ foreign.astype(np.float64).T,
    }
    np.fill_diagonal(neighbours["pp"], -np.inf)
    # A passage's own sentences are not its neighbours.
    neighbours["sent"][hub.ids[:, None] == hub.owners[None, :]] = -np.inf
    r = {(src, k): _top_mean(sims, k) for src, sims in neighbours.items() for k in KS}
    stats = {src: _masked_stats(sims) for src, sims in neighbours.items()}
    return Hubness(
        r,
        {s: m for s, (m, _) in stats.items()},
        {s: sd for s, (_, sd) in stats.items()},
        {int(c): i for i, c in enumerate(hub.ids.tolist())},
    )


# A signal: from one set's hubness, one query and its candidates' rows and
# distances, a number, lower meaning in-domain.
Signal = Callable[[Hubness, HubQuery, np.ndarray, np.ndarray, np.ndarray], float]


def _offset(src: str, k: int, weight: float) -> Signal:
    return lambda h, q, rows, d, rq: float((d + weight * h.r[(src, k)][rows]).min())


def _csls(src: str, k: int) -> Signal:
    return lambda h, q, rows, d, rq: float((d + 0.5 * (h.r[(src, k)][rows] + rq[k])).min())


def _z(src: str) -> Signal:
    return lambda h, q, rows, d, rq: float(((d - h.mu[src][rows]) / h.sigma[src][rows]).min())


def _centred(src: str, k: int, weight: float) -> Signal:
    """``d + weight (r_p - the corpus's median r_p)``: the offset, its level per corpus removed."""

    def signal(h: Hubness, q: HubQuery, rows: np.ndarray, d: np.ndarray, rq: np.ndarray) -> float:
        r = h.r[(src, k)]
        return float((d + weight * (r[rows] - np.median(r))).min())

    return signal


def signals() -> dict[str, Signal]:
    """Every signal measured, by label."""
    out: dict[str, Signal] = {"d1 (the gate)": lambda h, q, rows, d, rq: float(d.min())}
    for src in SOURCES:
        for k in KS:
            for w in WEIGHTS:
                out[f"d + {w:g} r_p[{src}, k={k}]"] = _offset(src, k, w)
    for src in SOURCES:
        out[f"d + 0.5 (r_p - median)[{src}, k=10]"] = _centred(src, 10, 0.5)
        out[f"csls[{src}, k=10]"] = _csls(src, 10)
        out[f"z[{src}]"] = _z(src)
    for src in SOURCES:
        out[f"r_p[{src}, k=10] of the best alone"] = _hub_of_best(src, 10)
    return out


def _hub_of_best(src: str, k: int) -> Signal:
    """How hub-like the closest candidate is, alone (higher: more of a hub)."""
    return lambda h, q, rows, d, rq: float(h.r[(src, k)][rows[np.argmin(d)]])


@dataclass(frozen=True)
class Scored:
    """One set's queries with every signal computed, lower meaning in-domain."""

    hub: HubSet
    values: dict[str, np.ndarray]
    inside: np.ndarray
    near: np.ndarray
    langs: np.ndarray
    hub_best: dict[str, np.ndarray] = field(default_factory=dict)


def score(hub: HubSet, h: Hubness, table: dict[str, Signal]) -> Scored:
    """Every signal of every query of ``hub``."""
    p = hub.passages.astype(np.float64)
    values: dict[str, list[float]] = {label: [] for label in table}
    best_r: list[float] = []
    for q in hub.queries:
        cands = [c for c in q.query.candidates if c.chunk_id in h.row]
        rows = np.array([h.row[c.chunk_id] for c in cands], dtype=np.int64)
        d = np.array([c.distance for c in cands], dtype=np.float64)
        sims = p @ q.vector.astype(np.float64)
        rq = {k: float(np.sort(sims)[-k:].mean()) for k in KS}
        rq_arr = np.zeros(max(KS) + 1)
        for k, v in rq.items():
            rq_arr[k] = v
        for label, fn in table.items():
            values[label].append(fn(h, q, rows, d, rq_arr) if rows.size else 2.0)
        best_r.append(float(h.r[("pp", 10)][rows[np.argmin(d)]]) if rows.size else 0.0)
    related = hub.data.engine.related_threshold
    return Scored(
        hub,
        {label: np.array(v) for label, v in values.items()},
        np.array([q.query.in_domain for q in hub.queries]),
        np.array([q.query.signals["d1"] <= related for q in hub.queries]),
        np.array([q.lang for q in hub.queries]),
        {"pp10": np.array(best_r)},
    )


def _allowed(ood: int) -> int:
    return (BLUFFS_PER_32 * ood) // 32


def _cut(values: np.ndarray, inside: np.ndarray, near: np.ndarray, allowed: int) -> float:
    """The largest cut (answered: ``value <= cut``) letting at most ``allowed`` out-of-domain
    questions with something near through."""
    ood = np.sort(values[~inside & near])
    if allowed >= ood.size:
        return np.inf
    return float(np.nextafter(ood[allowed], -np.inf))


def _decide(s: Scored, label: str, cut: float) -> Held:
    return decided(s.hub.data, (s.values[label] <= cut) & s.near)


def kept_mask(s: Scored, passes: np.ndarray) -> np.ndarray:
    """Per in-domain query, whether its needle is given to the model when ``passes`` are answered."""
    data = s.hub.data
    replay = _replay(data)
    answer, near = data.engine.threshold, data.engine.related_threshold
    out: list[bool] = []
    for q, ok in zip(data.queries, passes, strict=True):
        if not q.in_domain:
            continue
        chosen = replay.kept(q.ordered, max(answer, q.signals["d1"]), near) if ok else []
        out.append(replay.holds_needle(len(out), chosen))
    return np.array(out, dtype=bool)


def in_set_masks(s: Scored, label: str) -> np.ndarray:
    """``kept_mask`` at the in-set cut of ``label``."""
    cut = _cut(s.values[label], s.inside, s.near, _allowed(int((~s.inside).sum())))
    return kept_mask(s, (s.values[label] <= cut) & s.near)


def held_out(sets: Sequence[Scored], label: str) -> dict[str, tuple[Held, float]]:
    """Per set, the needle kept and bluffs at the cut chosen on the other three pooled."""
    out = {}
    for held in sets:
        others = [s for s in sets if s is not held]
        values = np.concatenate([s.values[label] for s in others])
        inside = np.concatenate([s.inside for s in others])
        near = np.concatenate([s.near for s in others])
        cut = _cut(values, inside, near, _allowed(int((~inside).sum())))
        out[held.hub.data.name] = (_decide(held, label, cut), cut)
    return out


def in_set(sets: Sequence[Scored], label: str) -> dict[str, Held]:
    """Per set, the needle kept at the largest cut with at most 2 bluffs per 32 there (oracle)."""
    out = {}
    for s in sets:
        cut = _cut(s.values[label], s.inside, s.near, _allowed(int((~s.inside).sum())))
        out[s.hub.data.name] = _decide(s, label, cut)
    return out


def chosen_held_out(sets: Sequence[Scored], labels: Sequence[str]) -> dict[str, tuple[Held, str]]:
    """Per set, the signal that keeps the most needles on the other three (each at its own
    held-out cut there, within the bluffs allowed), applied to it at the cut chosen on them."""
    out = {}
    for held in sets:
        others = [s for s in sets if s is not held]

        def merit(label: str, others: list[Scored] = others) -> tuple[int, int]:
            results = held_out(others, label)
            # Pooled over the three: needles kept, and no more bluffs than allowed.
            bluffs = sum(r.bluffs for r, _ in results.values())
            ood = sum(r.ood for r, _ in results.values())
            kept = sum(r.needle_kept for r, _ in results.values())
            return (int(bluffs <= _allowed(ood)), kept)

        best = max(labels, key=merit)
        values = np.concatenate([s.values[best] for s in others])
        inside = np.concatenate([s.inside for s in others])
        near = np.concatenate([s.near for s in others])
        cut = _cut(values, inside, near, _allowed(int((~inside).sum())))
        out[held.hub.data.name] = (_decide(held, best, cut), best)
    return out


def auc_cells(s: Scored, label: str, mask: np.ndarray | None = None, seed: int = 0) -> str:
    """AUC of ``label`` and its difference to d1's with a 95 % paired bootstrap interval."""
    inside = s.inside if mask is None else s.inside[mask]
    v = s.values[label] if mask is None else s.values[label][mask]
    base = s.values["d1 (the gate)"] if mask is None else s.values["d1 (the gate)"][mask]
    auc = _auc(v, inside)
    if label.startswith("d1"):
        return f"{auc:.3f}"
    rng = np.random.default_rng(seed)
    pos, neg = np.flatnonzero(inside), np.flatnonzero(~inside)
    diffs = []
    for _ in range(RESAMPLES):
        i = np.concatenate([rng.choice(pos, pos.size), rng.choice(neg, neg.size)])
        diffs.append(_auc(v[i], inside[i]) - _auc(base[i], inside[i]))
    low, high = np.percentile(diffs, [2.5, 97.5])
    mark = "**" if low > 0 else ""
    return f"{mark}{auc:.3f} [{low:+.3f}, {high:+.3f}]{mark}"


def _held_cell(h: Held) -> str:
    return f"{h.needle_kept}, {h.bluffs}/{h.ood}"


def _load(path: Path) -> HubSet:
    with path.open("rb") as f:
        hub: HubSet = _Unpickler(f).load()
    return hub


class _Unpickler(pickle.Unpickler):
    """Finds this module's classes whether the cache was saved under ``-m`` or an import."""

    def find_class(self, module: str, name: str) -> type:
        if module == "__main__" and name in ("HubQuery", "HubSet"):
            return {"HubQuery": HubQuery, "HubSet": HubSet}[name]
        return super().find_class(module, name)


def analyse(cache: Path) -> None:
    """Print the tables."""
    hubs = [_load(p) for p in sorted(cache.glob("*.pickle"))]
    table = signals()
    sets = []
    for hub in hubs:
        foreign = np.concatenate(
            [q.vector[None, :] for o in hubs if o is not hub for q in o.queries]
        )
        sets.append(score(hub, hubness(hub, foreign), table))
    names = [s.hub.data.name for s in sets]
    print(f"model: {hubs[0].model}")
    print("\n## How hub-like the best passage is\n")
    print(
        "| set | passages | pseudo-queries | r_p[pp, k=10] of the best: in-domain | out-of-domain |"
    )
    print("|---|---|---|---|---|")
    for s in sets:
        r = s.hub_best["pp10"]
        print(
            f"| {s.hub.data.name} | {s.hub.ids.size} | {s.hub.pseudo.shape[0]} | "
            f"{np.median(r[s.inside]):.3f} | {np.median(r[~s.inside]):.3f} |"
        )
    print("\n## ROC AUC and its difference to d1's (95 % paired bootstrap)\n")
    print("| signal | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for label in table:
        print(f"| {label} | " + " | ".join(auc_cells(s, label) for s in sets) + " |")
    base_ship = {s.hub.data.name: shipped(s.hub.data) for s in sets}
    print("\n## Needle kept, bluffs at <= 2 per 32\n")
    header = " | ".join(f"{n} held out | {n} in-set" for n in names)
    print(f"| signal | {header} | held out, all | in-set, all |")
    print("|---" * (2 * len(names) + 3) + "|")
    ship = " | ".join(f"{_held_cell(base_ship[n])} | " for n in names)
    total = sum(h.needle_kept for h in base_ship.values())
    print(f"| shipped threshold | {ship} | {total} | |")
    base_held = held_out(sets, "d1 (the gate)")
    for label in table:
        ho, ins = held_out(sets, label), in_set(sets, label)
        cells = " | ".join(f"{_held_cell(ho[n][0])} | {_held_cell(ins[n])}" for n in names)
        kept = sum(ho[n][0].needle_kept for n in names)
        bluffs = sum(ho[n][0].bluffs for n in names)
        kept_in = sum(ins[n].needle_kept for n in names)
        mine = np.concatenate([in_set_masks(s, label) for s in sets])
        base = np.concatenate([in_set_masks(s, "d1 (the gate)") for s in sets])
        more, fewer = int((mine & ~base).sum()), int((~mine & base).sum())
        paired = f" (+{more}/-{fewer}, p={sign_test(more, fewer):.2g})" if more or fewer else ""
        wins = all(
            ho[n][0].needle_kept >= base_held[n][0].needle_kept
            and ho[n][0].bluffs <= max(base_held[n][0].bluffs, _allowed(ho[n][0].ood))
            for n in names
        ) and kept > sum(base_held[n][0].needle_kept for n in names)
        mark = " **(never worse held out)**" if wins and not label.startswith("d1") else ""
        print(f"| {label}{mark} | {cells} | {kept} ({bluffs} bluffs) | {kept_in}{paired} |")
    if len(sets) < 3:
        return
    chosen = chosen_held_out(sets, list(table))
    cells = " | ".join(f"{_held_cell(chosen[n][0])} ({chosen[n][1]}) | " for n in names)
    print(
        f"| chosen on the other three | {cells} | "
        f"{sum(chosen[n][0].needle_kept for n in names)} | |"
    )
    print("\n## Held-out cuts of d1 per set:", end=" ")
    print({n: round(c, 4) for n, (_, c) in base_held.items()})
    _per_language(sets, table)


def _per_language(sets: Sequence[Scored], table: dict[str, Signal]) -> None:
    """Per language of the multilingual sets: AUC, and needle kept and bluffs at the held-out cut."""
    picks = (
        ["d1 (the gate)"]
        + [f"d + 0.5 r_p[{src}, k=10]" for src in SOURCES]
        + [f"csls[{src}, k=10]" for src in SOURCES]
    )
    for s in sets:
        langs = sorted(set(s.langs.tolist()) - {""})
        if len(langs) < 2:
            continue
        name = s.hub.data.name
        print(f"\n## {name} per language: AUC; needle kept, bluffs at the held-out cut\n")
        print("| signal | " + " | ".join(langs) + " |")
        print("|---" * (len(langs) + 1) + "|")
        for label in picks:
            _, cut = held_out(sets, label)[name]
            passes = (s.values[label] <= cut) & s.near
            cells = []
            for lang in langs:
                mask = s.langs == lang
                kept = _lang_kept(s, passes, mask)
                cells.append(
                    f"{auc_cells(s, label, mask)}; {kept}/{int((mask & s.inside).sum())}, "
                    f"{int((passes & mask & ~s.inside).sum())}/{int((mask & ~s.inside).sum())}"
                )
            print(f"| {label} | " + " | ".join(cells) + " |")


def _lang_kept(s: Scored, passes: np.ndarray, mask: np.ndarray) -> int:
    """Needles kept among the in-domain queries of ``mask`` when ``passes`` are answered."""
    only = passes & mask
    return decided(s.hub.data, only).needle_kept


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
