"""Does a bank of unrelated questions give each corpus its own answer threshold?

The bank (``threshold_bank.jsonl`` beside this module) holds several hundred
generic questions an employee might ask that a technical documentation corpus
cannot answer (HR, travel, cooking, finance, sport, health, law, school,
shopping, weather, cars, pets, ...), in Czech, Danish, French, Romanian and
English in equal parts; written for this study, not derived from any bundled
set's ``ood.jsonl`` (which stays the held-out judge).

``collect`` indexes a bundled set once with the product's ingestion and the
configured model into a data dir kept under ``--cache`` (a second run reopens
it), and saves, per query (both phrasings of every in-domain question, then
every out-of-domain question), the fused candidates as ``Engine.ask`` fetches
them, their answer order (``core.selection.PassageSelector``), the needle's
chunks and the question's language. ``bank`` reopens each kept data dir and
searches every bank question the same way (``encode_query``,
``SearchIndex.search``, ``top_k x CANDIDATES_PER_KEPT`` fused candidates),
saving its best distance: what the gate decides on.

``analyse`` derives each corpus's threshold as the ``q``-quantile of the bank's
best distances against it (at most ``q`` of the bank would be answered),
optionally clipped to a band around the shipped value, and replays the gate
(``evaluation.outcomes.Replay``) at it: per set, answered, needle kept (the
needle among the passages given to the model), bluffs on the set's own
``ood.jsonl`` and refused outright, against the shipped threshold, paired on
needle kept (exact sign test). Also per language within the multilingual
sets, and the bluffs by the out-of-domain question's kind (far, adjacent,
near miss); a variant with one threshold per language (from the bank's
questions in that language); a *relative* variant, the shipped threshold moved
by how far the set's quantile sits from the other sets' mean (leave one set
out); ``q`` at 1, 3 and 5 %; and the threshold from each half of the bank
(random halves, each language halved), to see how far it moves. ``bank`` also
saves each bank question's nearest out-of-domain question of any set
(``bank-ood.json``): a check that the bank is not the judge's copy.

Run: python -m studies.threshold_bank collect --cache DIR [--set NAME ...]
     python -m studies.threshold_bank bank --cache DIR [--set NAME ...]
     python -m studies.threshold_bank analyse --cache DIR
"""

from __future__ import annotations

import argparse
import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bot.settings import Settings
from core.gate import CANDIDATES_PER_KEPT
from core.retrieve import Mode
from core.selection import PassageSelector, retrieval_query
from evaluation.inputs import bundled_set, bundled_sets, load_ood, load_questions
from evaluation.outcomes import Outcomes
from evaluation.stats import sign_test
from index.embed import load_embedder
from index.knowledge_base import KnowledgeBase
from studies.gate_latent_sentences import Query, SetData, _replay

BANK = Path(__file__).with_name("threshold_bank.jsonl")
LANGS = ("cs", "da", "fr", "ro", "en")


@dataclass(frozen=True)
class BankQuestion:
    """One question of the bank."""

    id: str
    lang: str
    topic: str
    question: str


def load_bank(path: Path = BANK) -> list[BankQuestion]:
    """The bank's questions, in file order."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            obj = json.loads(line)
            out.append(BankQuestion(obj["id"], obj["lang"], obj["topic"], obj["question"]))
    return out


def open_indexed(name: str, cache: Path, settings: Settings) -> KnowledgeBase:
    """The set's knowledge base under ``cache``, indexed with the product's ingestion on first use."""
    config = settings.index_config()
    data = cache / "data" / name
    fresh = not data.exists()
    kb = KnowledgeBase(
        replace(config, data_dir=data, database_url=""), embedder=load_embedder(config)
    )
    if fresh:
        kb.ingest_paths([bundled_set(name).corpus], uploader="study")
    return kb


def collect_set(name: str, cache: Path) -> None:
    """Index one bundled set, search every query of the set, save what ``analyse`` replays."""
    paths = bundled_set(name)
    settings = Settings()
    engine = settings.engine_config()
    questions = load_questions(paths.questions)
    ood = load_ood(paths.ood)
    texts = [(retrieval_query(t), q.needle, True, q.lang) for q in questions for t in q.phrasings()]
    texts += [(retrieval_query(o.question), "", False, o.lang) for o in ood]
    kb = open_indexed(name, cache, settings)
    try:
        selector = PassageSelector(kb, engine)
        chunks = {
            int(row["id"]): row["content"]
            for doc in kb.store.documents()
            for row in kb.store.chunk_rows(doc.id)
        }
        queries = []
        for text, needle, inside, _ in texts:
            vec = kb.embedder.encode_query(text)
            cands = kb.search_index.search(
                vec, text, None, engine.top_k * CANDIDATES_PER_KEPT, Mode.HYBRID
            )
            queries.append(
                Query(
                    in_domain=inside,
                    candidates=list(cands),
                    ordered=selector.ordered(text, vec, cands) if inside else list(cands),
                    correct={cid for cid, body in chunks.items() if needle and needle in body},
                    signals={"d1": min((c.distance for c in cands), default=2.0)},
                )
            )
        model = settings.index_config().embedding_model
    finally:
        kb.store.close()
    sizes = {cid: len(body) for cid, body in chunks.items()}
    # Pickled as a dict of the shared module's classes: readable whether saved under ``-m`` or not.
    saved = {
        "data": SetData(name, queries, sizes, engine),
        "langs": [t[3] or "en" for t in texts],
        "model": model,
    }
    (cache / f"{name}.pickle").write_bytes(pickle.dumps(saved))
    print(f"{name}: {len(queries)} queries saved, {len(sizes)} passages")


def bank_set(name: str, cache: Path) -> None:
    """Search every bank question in the set's kept knowledge base; save each one's best distance."""
    settings = Settings()
    engine = settings.engine_config()
    bank = load_bank()
    kb = open_indexed(name, cache, settings)
    try:
        best = []
        for q in bank:
            text = retrieval_query(q.question)
            vec = kb.embedder.encode_query(text)
            cands = kb.search_index.search(
                vec, text, None, engine.top_k * CANDIDATES_PER_KEPT, Mode.HYBRID
            )
            best.append(min((c.distance for c in cands), default=2.0))
    finally:
        kb.store.close()
    out = {q.id: d for q, d in zip(bank, best, strict=True)}
    (cache / f"{name}.bank.json").write_text(json.dumps(out, indent=0))
    print(f"{name}: {len(out)} bank questions searched, median best {np.median(best):.3f}")


def ood_neighbours(cache: Path) -> None:
    """Per bank question, its cosine distance to the nearest out-of-domain question of any set.

    A check that the bank is not a copy of the judge: saved as ``bank-ood.json``.
    """
    settings = Settings()
    embedder = load_embedder(settings.index_config())
    bank = load_bank()
    ood = [o.question for name in bundled_sets() for o in load_ood(bundled_set(name).ood)]
    b = np.vstack([embedder.encode_query(retrieval_query(q.question)) for q in bank])
    o = np.vstack([embedder.encode_query(retrieval_query(t)) for t in ood])
    sims = b @ o.T
    nearest = sims.argmax(axis=1)
    out = {
        q.id: {"distance": float(1.0 - sims[i, j]), "ood": ood[j]}
        for i, (q, j) in enumerate(zip(bank, nearest.tolist(), strict=True))
    }
    (cache / "bank-ood.json").write_text(json.dumps(out, indent=0, ensure_ascii=False))
    print(f"{len(out)} bank questions against {len(ood)} out-of-domain questions")


# --- analyse -----------------------------------------------------------------

QUANTILES = (0.01, 0.03, 0.05)
MAIN_Q = 0.03
BANDS = (0.01, 0.02)
HALVES = 200
KINDS = ("far", "adjacent", "near_miss")
KIND_NAMES = {"far": "far", "adjacent": "adj", "near_miss": "near"}
# The promise: at most 2 bluffs per 32 out-of-domain questions.
BLUFFS_PER_32 = 2


@dataclass(frozen=True)
class Corpus:
    """One set's saved queries, their languages, and the bank's best distances against it."""

    data: SetData
    langs_in: list[str]
    langs_ood: list[str]
    kinds: list[str]  # per out-of-domain question: far, adjacent, near_miss
    bank: dict[str, float]

    @property
    def name(self) -> str:
        return self.data.name


@dataclass(frozen=True)
class Result:
    """Per query, what a gate gives on one set."""

    threshold: str  # for the table: the threshold(s) used
    answered: list[bool]
    kept: list[bool]
    hard_refused: list[bool]
    bluffs: list[bool]


def load(cache: Path) -> list[Corpus]:
    """Every set ``collect`` and ``bank`` saved under ``cache``."""
    out = []
    for path in sorted(cache.glob("*.pickle")):
        if not path.with_suffix(".bank.json").exists():
            continue  # collected, the bank not yet searched
        saved = pickle.loads(path.read_bytes())
        data: SetData = saved["data"]
        langs = saved["langs"]
        inside = [q.in_domain for q in data.queries]
        bank = json.loads((cache / f"{data.name}.bank.json").read_text())
        out.append(
            Corpus(
                data,
                [lang for lang, i in zip(langs, inside, strict=True) if i],
                [lang for lang, i in zip(langs, inside, strict=True) if not i],
                [o.kind for o in load_ood(bundled_set(data.name).ood)],
                bank,
            )
        )
    return out


def quantile_threshold(distances: np.ndarray, q: float) -> float:
    """The largest threshold answering at most ``q`` of ``distances`` (best distances of the bank)."""
    d = np.sort(distances)
    k = int(np.floor(q * d.size + 1e-9))
    return float(d[-1]) if k >= d.size else float(np.nextafter(d[k], -np.inf))


def run_gate(c: Corpus, t_in: Sequence[float], t_ood: Sequence[float]) -> Result:
    """Replay the gate with one answer threshold per query (the related threshold shipped)."""
    replay = _replay(c.data)
    related = c.data.engine.related_threshold
    cache: dict[float, Outcomes] = {}

    def at(t: float) -> Outcomes:
        if t not in cache:
            cache[t] = replay.outcomes(t, related)
        return cache[t]

    answered, kept, hard = [], [], []
    for i, t in enumerate(t_in):
        o = at(t)
        answered.append(o.answered[i])
        kept.append(o.kept_needle[i])
        hard.append(o.hard_refused[i])
    bluffs = [at(t).bluffs[i] for i, t in enumerate(t_ood)]
    label = f"{t_in[0]:.3f}" if len(set(t_in) | set(t_ood)) == 1 else "per language"
    return Result(label, answered, kept, hard, bluffs)


def bank_distances(c: Corpus, bank: Sequence[BankQuestion], lang: str = "") -> np.ndarray:
    return np.array([c.bank[q.id] for q in bank if not lang or q.lang == lang])


def gates(
    c: Corpus, bank: Sequence[BankQuestion], others: Sequence[Corpus] = ()
) -> dict[str, Result]:
    """Every gate measured on one set: the shipped threshold and the bank's variants.

    ``others``: the other sets, whose bank quantiles place the shipped threshold
    (the relative variant: the shipped threshold moved by how far this corpus's
    bank quantile sits from theirs).
    """
    shipped_t = c.data.engine.threshold
    n_in, n_ood = len(c.langs_in), len(c.langs_ood)

    def one(t: float) -> Result:
        return run_gate(c, [t] * n_in, [t] * n_ood)

    out = {"shipped": one(shipped_t)}
    d = bank_distances(c, bank)
    for q in QUANTILES:
        out[f"bank, q = {q:.0%}"] = one(quantile_threshold(d, q))
    for band in BANDS:
        t = float(np.clip(quantile_threshold(d, MAIN_Q), shipped_t - band, shipped_t + band))
        out[f"bank, q = {MAIN_Q:.0%}, within +-{band}"] = one(t)
    if others:
        for q in QUANTILES:
            ref = float(np.mean([quantile_threshold(bank_distances(o, bank), q) for o in others]))
            t = shipped_t + quantile_threshold(d, q) - ref
            out[f"relative: shipped + (bank q {q:.0%} - other sets' mean)"] = one(t)
    for q in QUANTILES:
        per = {lang: quantile_threshold(bank_distances(c, bank, lang), q) for lang in LANGS}
        out[f"bank per language, q = {q:.0%}"] = run_gate(
            c, [per[lang] for lang in c.langs_in], [per[lang] for lang in c.langs_ood]
        )
    return out


def allowed_bluffs(n_ood: int) -> int:
    """The promise's bluffs on ``n_ood`` out-of-domain questions: at most 2 per 32."""
    return int(np.floor(BLUFFS_PER_32 * n_ood / 32 + 1e-9))


def _kinds(r: Result, kinds: Sequence[str]) -> str:
    counts = {k: sum(b for b, x in zip(r.bluffs, kinds, strict=True) if x == k) for k in KINDS}
    return ", ".join(f"{KIND_NAMES[k]} {n}" for k, n in counts.items())


def _paired(r: Result, base: Result) -> tuple[int, int]:
    """Queries whose needle ``r`` keeps and ``base`` does not, and the other way."""
    wins = sum(a and not b for a, b in zip(r.kept, base.kept, strict=True))
    return wins, sum(b and not a for a, b in zip(r.kept, base.kept, strict=True))


def _cell(r: Result, base: Result, kinds: Sequence[str]) -> str:
    wins, losses = _paired(r, base)
    paired = f"+{wins}/-{losses}, p {sign_test(wins, losses):.2g}" if wins or losses else "="
    return (
        f"{r.threshold} | {sum(r.answered)}/{len(r.answered)} | {sum(r.kept)} ({paired}) | "
        f"{sum(r.bluffs)}/{len(r.bluffs)} ({_kinds(r, kinds)}) | {sum(r.hard_refused)}"
    )


def distances_table(sets: Sequence[Corpus], bank: Sequence[BankQuestion]) -> list[str]:
    """Per set: where the bank's best distances sit against the set's own questions."""
    lines = [
        "| set | bank median best | bank answered at shipped | own ood median best: far, "
        "adjacent, near miss | in-domain median best | q 1 % | q 3 % | q 5 % | "
        "oracle (<= 2 of 32 of its own) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sets:
        d = bank_distances(c, bank)
        inside = [q.signals["d1"] for q in c.data.queries if q.in_domain]
        ood = [q.signals["d1"] for q in c.data.queries if not q.in_domain]
        by_kind = ", ".join(
            f"{np.median([x for x, k in zip(ood, c.kinds, strict=True) if k == kind]):.3f}"
            for kind in KINDS
        )
        answered = int((d <= c.data.engine.threshold).sum())
        qs = " | ".join(f"{quantile_threshold(d, q):.3f}" for q in QUANTILES)
        lines.append(
            f"| {c.name} | {np.median(d):.3f} | {answered}/{d.size} | {by_kind} | "
            f"{np.median(inside):.3f} | {qs} | "
            f"{quantile_threshold(np.array(ood), allowed_bluffs(len(ood)) / len(ood)):.3f} |"
        )
    lines += ["", "per language of the bank (q 3 %, median best):", ""]
    lines.append("| set | " + " | ".join(LANGS) + " |")
    lines.append("|---" * (len(LANGS) + 1) + "|")
    for c in sets:
        cells = [
            f"{quantile_threshold(bank_distances(c, bank, lang), MAIN_Q):.3f} "
            f"({np.median(bank_distances(c, bank, lang)):.3f})"
            for lang in LANGS
        ]
        lines.append(f"| {c.name} | " + " | ".join(cells) + " |")
    return lines


def gates_table(sets: Sequence[Corpus], bank: Sequence[BankQuestion]) -> list[str]:
    """Per set and gate: threshold, answered, needle kept (paired with shipped), bluffs, refused."""
    lines = [
        "| gate | set | threshold | answered | needle kept (paired with shipped) | bluffs | "
        "refused outright |",
        "|---|---|---|---|---|---|---|",
    ]
    per_set = {c.name: gates(c, bank, [o for o in sets if o is not c]) for c in sets}
    labels = list(next(iter(per_set.values())))
    for label in labels:
        kept = wins = losses = bluffs = ood = 0
        ok = True
        for c in sets:
            r, base = per_set[c.name][label], per_set[c.name]["shipped"]
            lines.append(f"| {label} | {c.name} | {_cell(r, base, c.kinds)} |")
            kept += sum(r.kept)
            w, l_ = _paired(r, base)
            wins, losses = wins + w, losses + l_
            bluffs += sum(r.bluffs)
            ood += len(r.bluffs)
            ok &= sum(r.bluffs) <= allowed_bluffs(len(r.bluffs))
            ok &= sum(r.bluffs) <= sum(base.bluffs) + 1
        verdict = "passes the rule" if ok and wins > losses else "fails the rule"
        lines.append(
            f"| {label} | **all** | | | {kept} (+{wins}/-{losses}, p "
            f"{sign_test(wins, losses):.2g}) | {bluffs}/{ood} | {verdict} |"
        )
    return lines


def languages_table(sets: Sequence[Corpus], bank: Sequence[BankQuestion]) -> list[str]:
    """Per multilingual set and language: needle kept and bluffs, shipped against the bank's."""
    lines = [
        "| set | lang | in-domain | ood | shipped: kept, bluffs | bank 3 %: kept, bluffs | "
        "bank per language 3 %: threshold, kept, bluffs |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in sets:
        if len(set(c.langs_in)) < 2:
            continue
        g = gates(c, bank)
        per = {lang: quantile_threshold(bank_distances(c, bank, lang), MAIN_Q) for lang in LANGS}
        for lang in LANGS:
            ins = [i for i, x in enumerate(c.langs_in) if x == lang]
            outs = [i for i, x in enumerate(c.langs_ood) if x == lang]

            def kb(r: Result, ins: list[int] = ins, outs: list[int] = outs) -> str:
                return f"{sum(r.kept[i] for i in ins)}, {sum(r.bluffs[i] for i in outs)}"

            lines.append(
                f"| {c.name} | {lang} | {len(ins)} | {len(outs)} | {kb(g['shipped'])} | "
                f"{kb(g[f'bank, q = {MAIN_Q:.0%}'])} | {per[lang]:.3f}, "
                f"{kb(g[f'bank per language, q = {MAIN_Q:.0%}'])} |"
            )
    return lines


def halves_table(sets: Sequence[Corpus], bank: Sequence[BankQuestion]) -> list[str]:
    """How far the threshold moves between random halves of the bank (each language halved)."""
    rng = np.random.default_rng(0)
    by_lang = {lang: [q for q in bank if q.lang == lang] for lang in LANGS}
    splits = []
    for _ in range(HALVES):
        a: list[BankQuestion] = []
        b: list[BankQuestion] = []
        for qs in by_lang.values():
            order = rng.permutation(len(qs))
            a += [qs[i] for i in order[: len(qs) // 2]]
            b += [qs[i] for i in order[len(qs) // 2 :]]
        splits.append((a, b))
    lines = [
        "| set | q | whole bank | halves: 5th-95th percentile | mean abs(A - B) | "
        "needle kept, 5th-95th | bluffs, min-max |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in sets:
        replay_cache: dict[float, Result] = {}

        def at(t: float, c: Corpus = c, cache: dict[float, Result] = replay_cache) -> Result:
            if t not in cache:
                cache[t] = run_gate(c, [t] * len(c.langs_in), [t] * len(c.langs_ood))
            return cache[t]

        for q in QUANTILES:
            ta = np.array([quantile_threshold(bank_distances(c, bank=a), q) for a, _ in splits])
            tb = np.array([quantile_threshold(bank_distances(c, bank=b), q) for _, b in splits])
            kept = np.array([sum(at(t).kept) for t in ta])
            bluffs = np.array([sum(at(t).bluffs) for t in ta])
            lo, hi = np.percentile(ta, [5, 95])
            klo, khi = np.percentile(kept, [5, 95])
            whole = quantile_threshold(bank_distances(c, bank), q)
            lines.append(
                f"| {c.name} | {q:.0%} | {whole:.3f} | {lo:.3f}-{hi:.3f} | "
                f"{np.abs(ta - tb).mean():.4f} | {klo:.0f}-{khi:.0f} | {bluffs.min()}-{bluffs.max()} |"
            )
    return lines


def leakage_lines(cache: Path, sets: Sequence[Corpus], bank: Sequence[BankQuestion]) -> list[str]:
    """How close the bank comes to the judge, and the threshold without its closest tenth."""
    path = cache / "bank-ood.json"
    if not path.exists():
        return ["(no bank-ood.json: run the `bank` step)"]
    near = json.loads(path.read_text())
    d = np.array([near[q.id]["distance"] for q in bank])
    lines = [
        f"bank question to its nearest out-of-domain question (cosine distance): min {d.min():.3f}, "
        f"5th percentile {np.percentile(d, 5):.3f}, median {np.median(d):.3f}",
        "",
        "closest pairs:",
        "",
    ]
    for i in np.argsort(d)[:8].tolist():
        lines.append(f"- {d[i]:.3f}: {bank[i].question!r} ~ {near[bank[i].id]['ood']!r}")
    keep = [q for q, x in zip(bank, d, strict=True) if x > np.percentile(d, 10)]
    lines += [
        "",
        f"threshold at q 3 % without the closest tenth ({len(bank) - len(keep)} dropped):",
        "",
    ]
    for c in sets:
        lines.append(
            f"- {c.name}: {quantile_threshold(bank_distances(c, bank), MAIN_Q):.3f} -> "
            f"{quantile_threshold(bank_distances(c, keep), MAIN_Q):.3f}"
        )
    return lines


def analyse(cache: Path) -> None:
    """Print the study's tables."""
    sets = load(cache)
    bank = load_bank()
    print(
        f"bank: {len(bank)} questions, "
        + ", ".join(f"{lang} {sum(q.lang == lang for q in bank)}" for lang in LANGS)
    )
    for title, lines in (
        ("Where the bank's best distances sit", distances_table(sets, bank)),
        ("The gate at each threshold", gates_table(sets, bank)),
        ("Per language (multilingual sets)", languages_table(sets, bank)),
        ("Bank halves", halves_table(sets, bank)),
        ("The bank against the judge", leakage_lines(cache, sets, bank)),
    ):
        print(f"\n## {title}\n")
        print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("step", choices=["collect", "bank", "analyse"])
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--set", dest="sets", action="append", help="bundled set (default: all)")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    names: list[str] = args.sets or sorted(bundled_sets())
    if args.step == "collect":
        for name in names:
            if not (args.cache / f"{name}.pickle").exists():
                collect_set(name, args.cache)
    elif args.step == "bank":
        for name in names:
            bank_set(name, args.cache)
        ood_neighbours(args.cache)
    else:
        analyse(args.cache)


if __name__ == "__main__":
    main()
