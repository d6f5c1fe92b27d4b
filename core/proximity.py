"""How closely together a passage holds a question's terms: a ranking signal BM25 lacks.

BM25 scores each term on its own, so a chunk that mentions *scrape* in its
first line and *interval* in its last scores as high as one that says "scrape
interval". Term proximity (the best short window's share of the question's
terms) tells them apart. It orders the candidates of a question the gate has
passed (``core.retrieve.answer_order``); it never decides a refusal.

Each term counts by its rarity among the candidates themselves, not the whole
corpus: a word every candidate shares tells nothing about which one answers,
and the candidates are all there is to read, on every search engine.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from index.tokens import ANALYZER

# Terms (stop words included) a window spans: about two sentences.
WINDOW = 24


def term_proximity(question: str, texts: Sequence[str], window: int = WINDOW) -> list[float]:
    """Per text, the weight of the question's distinct terms found together within ``window`` terms.

    A term weighs ``log(1 + (n - df + 0.5) / (df + 0.5))`` where ``df`` of the
    ``n`` texts hold it (BM25's IDF, over ``texts``). Texts are analysed as the
    BM25 leg analyses chunks, the question as it analyses questions.
    """
    wanted = set(ANALYZER.query_terms(question))
    if not wanted or not texts:
        return [0.0] * len(texts)
    terms = [ANALYZER.document_terms(text) for text in texts]
    df = Counter(t for doc in terms for t in wanted.intersection(doc))
    n = len(texts)
    weight = {t: math.log1p((n - d + 0.5) / (d + 0.5)) for t, d in df.items()}
    return [_best_window(doc, weight, window) for doc in terms]


def _best_window(terms: Sequence[str], weight: dict[str, float], window: int) -> float:
    """The largest total weight of distinct weighted terms inside any ``window`` consecutive terms."""
    hits = [(i, t) for i, t in enumerate(terms) if t in weight]
    inside: Counter[str] = Counter()
    total = best = 0.0
    first = 0
    for pos, term in hits:
        if inside[term] == 0:
            total += weight[term]
        inside[term] += 1
        while pos - hits[first][0] >= window:
            old = hits[first][1]
            inside[old] -= 1
            if inside[old] == 0:
                total -= weight[old]
            first += 1
        best = max(best, total)
    return best
