"""How closely a passage holds a question's terms together: a ranking signal BM25 lacks.

BM25 scores each term on its own, so a chunk that names *cache* in its first
line and *server* in its last scores as high as one that says "the cache of
the build server". Term proximity (the best short window's share of the
question's terms) tells them apart. It orders the candidates of a question
the gate has passed (``core.retrieve.answer_order``); it never decides a
refusal.

Each term counts by its rarity among the candidates themselves, not the whole
corpus: a word every candidate holds tells nothing about which one answers,
and the candidates are all there is to read, on every search engine.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from index.search import ANALYZER, query_languages

# Terms (stop words included) a window spans: about two sentences of prose,
# less where a word makes several terms (identifiers, CJK characters and pairs).
WINDOW = 24


def term_proximity(
    question: str,
    texts: Sequence[str],
    window: int = WINDOW,
    languages: Sequence[str | None] | None = None,
) -> list[float]:
    """Per text, the share of the question's term weight its best ``window`` terms hold.

    A term weighs ``log(1 + (n - df + 0.5) / (df + 0.5))`` where ``df`` of the
    ``n`` texts hold it (BM25's IDF, over ``texts``); the share is of the
    weight of the question's terms any text holds, so 1 is every one of them
    together and a term all texts share moves a score by little. Texts are
    analysed as the BM25 leg analyses chunks (each in its own language of
    ``languages``, when given), the question as it analyses questions (in the
    languages the texts are written in, ``query_languages``).

    Raises:
        ValueError: ``window`` is under 1.
    """
    if window < 1:
        raise ValueError(f"a proximity window spans at least 1 term, not {window}")
    per_text = list(languages) if languages is not None else [None] * len(texts)
    corpus = {code for code in per_text if code}
    wanted = set(ANALYZER.query_terms(question, query_languages(question, corpus)))
    terms = (
        [ANALYZER.document_terms(t, c) for t, c in zip(texts, per_text, strict=True)]
        if wanted
        else []
    )
    df = Counter(t for doc in terms for t in wanted.intersection(doc))
    n = len(texts)
    weight = {t: math.log1p((n - d + 0.5) / (d + 0.5)) for t, d in df.items()}
    total = sum(weight.values())
    if not total:
        return [0.0] * n
    # Rounded: a running sum drifts in its last digits, and ties must stay ties.
    return [round(_best_window(doc, weight, window) / total, 9) for doc in terms]


def _best_window(terms: Sequence[str], weight: dict[str, float], window: int) -> float:
    """The largest weight of distinct weighted terms within ``window`` consecutive terms."""
    hits = [(i, t) for i, t in enumerate(terms) if t in weight]
    inside: Counter[str] = Counter()
    held = best = 0.0
    first = 0
    for pos, term in hits:
        if inside[term] == 0:
            held += weight[term]
        inside[term] += 1
        while pos - hits[first][0] >= window:
            old = hits[first][1]
            inside[old] -= 1
            if inside[old] == 0:
                held -= weight[old]
            first += 1
        best = max(best, held)
    return best
