"""Knowledge gaps: what people asked that the knowledge base could not answer, grouped.

An admin deciding which document to write next needs the questions the bot
refused or could only answer with possibly related passages, counted by what
was meant rather than by exact wording. ``knowledge_gaps`` reads those questions
from the query log, embeds them with the knowledge base's own model, and groups
wordings whose vectors are close (``SIMILARITY``), largest groups first.

Work is bounded: at most ``MAX_QUESTIONS`` questions, the newest of the
window, are read, and each distinct wording is embedded once per process
(``_VectorCache``): the first listing after a start embeds them all
(``bench/gaps.py``: about 15 ms a wording on two busy cores); listing them again
costs a query and the clustering (half a second for 2,000 wordings), and a new
question one embedding. When the embedder cannot run (a remote endpoint that
is down) questions are grouped by their normalised wording alone, with a
warning.

The list is for admins: a gap's closest passage may come from a channel's own
documents, so ``Gap.scope`` says whose it is and the view decides.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from core.answer import Outcome
from index.embed import Embedder
from index.errors import KBError
from index.knowledge_base import KnowledgeBase
from index.records import ChunkRow, LoggedQuestion

__all__ = [
    "GAP_OUTCOMES",
    "MAX_QUESTIONS",
    "SIMILARITY",
    "Gap",
    "knowledge_gaps",
    "normalise",
    "similarity_groups",
]

log = logging.getLogger(__name__)

GAP_OUTCOMES: tuple[str, ...] = (Outcome.REFUSED.value, Outcome.RELATED.value)
"""The outcomes that are gaps: nothing passed the gate. An answer, even one citing
nothing (``unsupported``), or evidence shown while the model was down, is not."""

MAX_QUESTIONS = 2000
"""The most questions read from the window: the newest."""

MAX_PER_ASKER = 100
"""The most questions read of one person's (their newest): one person's flood of
refused questions leaves room for at least ``MAX_QUESTIONS / MAX_PER_ASKER`` people."""

SIMILARITY = 0.7
"""The mean cosine similarity between two groups' wordings from which they merge.

Measured by ``bench/gaps.py`` with the bundled all-MiniLM-L6-v2 on the bundled
evaluation sets, clustering every question's documentation wording, its
support-ticket wording and the out-of-domain questions together. At 0.7, 4 of
98 (pip-black) and 6 of 116 (prometheus) questions end up hidden in another
question's group, against 8 and 10 at 0.65 and 15 and 17 at 0.6; at 0.75, 0 and
4. Ticket wordings are deliberately far from the documentation's (median
similarity 0.47), so few such pairs group at any threshold that keeps questions
apart (4 of 68 and 8 of 84 at 0.7); plain rewordings are much closer (0.84 to
0.96 in the tests). Merging two gaps hides one of them, while two lines for one
gap only cost a line, so the threshold leans to keeping questions apart.
"""

MAX_EXAMPLES = 3
_CACHE_SIZE = (
    2 * MAX_QUESTIONS
)  # a window of distinct wordings and as many since (6 MB at 384 dimensions)
_BATCH = 64


@dataclass(frozen=True)
class Gap:
    """Questions meaning the same thing that the knowledge base did not answer.

    Attributes:
        question: the most recent wording.
        examples: up to ``MAX_EXAMPLES`` other distinct wordings, most recent first.
        count: how many times it was asked (every wording).
        outcomes: ``(outcome, times)`` for each gap outcome that happened, in
            ``GAP_OUTCOMES`` order (``("refused", 3), ("related", 1)``).
        closest: the closest passage when it was asked (from the query log, of
            the most recent asking that logged one: the related passages shown,
            or a refusal's nearest miss); ``None`` when none was logged or that
            passage is no longer indexed.
        distance: its cosine distance to that question (``None`` with no passage).
        last_asked: when it was last asked (Unix time).
        scope: ``closest``'s document scope (``index.models.EVERYONE`` or a
            channel id): not every admin may read every channel's documents.
        asked_in: the conversations it was asked in (Slack channel ids, most
            recent first): a question asked in a private channel or a DM is
            that conversation's words.
        people: how many people asked it (an asking with no known asker counts
            as one person): gaps are ranked by it, so that one person asking
            over and over does not put their words first.
    """

    question: str
    examples: tuple[str, ...]
    count: int
    outcomes: tuple[tuple[str, int], ...]
    closest: ChunkRow | None
    distance: float | None
    last_asked: float
    scope: str | None = None
    asked_in: tuple[str, ...] = ()
    people: int = 0


def knowledge_gaps(kb: KnowledgeBase, *, since: float, limit: int = 50) -> list[Gap]:
    """The questions refused or answered only with related passages since ``since``, grouped.

    Reads at most ``MAX_QUESTIONS`` of them (the newest), groups wordings by the
    similarity of their embeddings, and returns at most ``limit`` gaps: the
    most asked first, then the most recently asked.
    """
    questions = kb.queries.by_outcome(
        GAP_OUTCOMES, since=since, limit=MAX_QUESTIONS, per_user=MAX_PER_ASKER
    )
    if not questions or limit <= 0:
        return []
    wordings = _wordings(questions)
    groups = _group(wordings, _vectors(kb.embedder, wordings))
    ranked = sorted(
        groups, key=lambda g: (-_people(g.asked), -len(g.asked), -g.asked[0].created_at)
    )
    gaps = ranked[:limit]
    closest = _closest_passages(kb, gaps)
    return [_gap(g, closest) for g in gaps]


def normalise(question: str) -> str:
    """The wording with case, punctuation and spacing differences removed."""
    return " ".join(_WORD.findall(question.casefold()))


_WORD = re.compile(r"\w+")


# ---------------------------------------------------------------------- grouping


@dataclass
class _Wording:
    """One normalised wording and its askings, newest first."""

    key: str
    asked: list[LoggedQuestion]


@dataclass
class _Group:
    """Wordings meaning the same thing, and all their askings, newest first."""

    wordings: list[_Wording]
    asked: list[LoggedQuestion] = field(default_factory=list)


def _wordings(questions: Sequence[LoggedQuestion]) -> list[_Wording]:
    """Questions by normalised wording, in order of their newest asking (questions come newest first)."""
    by_key: dict[str, _Wording] = {}
    for q in questions:
        key = normalise(q.question) or q.question.strip()
        by_key.setdefault(key, _Wording(key, [])).asked.append(q)
    return list(by_key.values())


def similarity_groups(vectors: np.ndarray, similarity: float = SIMILARITY) -> list[int]:
    """A group label for each row of ``vectors`` (unit vectors), by average-linkage clustering.

    Two groups merge while the mean cosine similarity between their members is
    at least ``similarity``: unlike a greedy pass, the result does not depend on
    the order the rows come in, and a vector near only one member of a group (a
    neighbouring question) stays out of it.
    """
    if len(vectors) < 2:
        return list(range(len(vectors)))
    # SciPy loads with the first grouping (`kb gaps`, the Home tab's gaps), not with the
    # server: importing it costs about half a second of every `kb serve` start.
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    unit = np.asarray(vectors, dtype=np.float64)
    # Clipped: rounding can put a distance a hair under 0 or over 2.
    distances = np.clip(1.0 - unit @ unit.T, 0.0, 2.0)
    np.fill_diagonal(distances, 0.0)
    tree = linkage(squareform(distances, checks=False), method="average")
    return [int(x) for x in fcluster(tree, t=1.0 - similarity, criterion="distance")]


def _group(wordings: Sequence[_Wording], vectors: np.ndarray | None) -> list[_Group]:
    """Wordings grouped by ``similarity_groups``; without vectors each wording is a group."""
    labels = list(range(len(wordings))) if vectors is None else similarity_groups(vectors)
    groups: dict[int, _Group] = {}
    for label, wording in zip(labels, wordings, strict=True):
        groups.setdefault(label, _Group([])).wordings.append(wording)
    for group in groups.values():
        group.asked = sorted(
            (q for w in group.wordings for q in w.asked), key=lambda q: (-q.created_at, -q.id)
        )
    return list(groups.values())


# ---------------------------------------------------------------------- vectors


class _VectorCache:
    """Vectors of wordings already embedded, by model and wording (least recently used dropped)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()

    def get(self, model: str, key: str) -> np.ndarray | None:
        with self._lock:
            vector = self._vectors.get((model, key))
            if vector is not None:
                self._vectors.move_to_end((model, key))
            return vector

    def put(self, model: str, key: str, vector: np.ndarray) -> None:
        with self._lock:
            self._vectors[(model, key)] = vector
            self._vectors.move_to_end((model, key))
            while len(self._vectors) > self._size:
                self._vectors.popitem(last=False)


_CACHE = _VectorCache(_CACHE_SIZE)


def _vectors(embedder: Embedder, wordings: Sequence[_Wording]) -> np.ndarray | None:
    """Unit vectors of the wordings (one row each), or ``None`` when the embedder fails."""
    # A model's name plus its size: a changed model never reuses an old vector.
    model = f"{embedder.name}/{embedder.dim}"
    cached = [_CACHE.get(model, w.key) for w in wordings]
    missing = [i for i, v in enumerate(cached) if v is None]
    if missing:
        try:
            fresh = embedder.encode(
                [wordings[i].asked[0].question for i in missing], batch_size=_BATCH
            )
        except KBError as exc:
            log.warning("knowledge gaps grouped by wording only: %s", exc)
            return None
        for i, vector in zip(missing, fresh, strict=True):
            vector = np.asarray(vector, dtype=np.float32)
            _CACHE.put(model, wordings[i].key, vector)
            cached[i] = vector
    return np.stack([v for v in cached if v is not None]).astype(np.float32, copy=False)


# ---------------------------------------------------------------------- passages


@dataclass(frozen=True)
class _Kept:
    """The closest passage an asking kept, and its distance to that question."""

    chunk_id: int
    distance: float


def _closest_kept(group: _Group) -> _Kept | None:
    """The closest passage of the most recent asking that logged one.

    A related reply logs the passages it showed; a refusal logs only its
    nearest miss (``nearest``; absent from questions logged before it was).
    """
    for q in group.asked:
        if q.kept:
            chunk_id, distance = min(q.kept, key=lambda k: k[1])
            return _Kept(chunk_id, distance)
        if q.nearest:
            return _Kept(*q.nearest)
    return None


def _closest_passages(kb: KnowledgeBase, groups: Sequence[_Group]) -> dict[_Kept, ChunkRow]:
    """The groups' closest kept passages that are still indexed.

    Chunk ids are never reused (``AUTOINCREMENT``) and a reindex writes new
    ones, so an id that resolves is the passage the question kept.
    """
    kept = [k for k in map(_closest_kept, groups) if k is not None]
    rows = kb.chunks_by_id(sorted({k.chunk_id for k in kept}))
    return {k: rows[k.chunk_id] for k in kept if k.chunk_id in rows}


def _gap(group: _Group, passages: dict[_Kept, ChunkRow]) -> Gap:
    latest = group.asked[0]
    seen = {normalise(latest.question) or latest.question.strip()}
    examples: list[str] = []
    for q in group.asked[1:]:
        key = normalise(q.question) or q.question.strip()
        if key not in seen and len(examples) < MAX_EXAMPLES:
            seen.add(key)
            examples.append(q.question)
    counts = {o: sum(1 for q in group.asked if q.outcome == o) for o in GAP_OUTCOMES}
    kept = _closest_kept(group)
    row = passages.get(kept) if kept else None
    return Gap(
        question=latest.question,
        examples=tuple(examples),
        count=len(group.asked),
        outcomes=tuple((o, n) for o, n in counts.items() if n),
        closest=row,
        distance=kept.distance if kept and row else None,
        last_asked=latest.created_at,
        scope=row.scope if row else None,
        asked_in=tuple(dict.fromkeys(q.channel for q in group.asked if q.channel)),
        people=_people(group.asked),
    )


def _people(asked: Sequence[LoggedQuestion]) -> int:
    """How many people asked: distinct askers, and each asking with no known asker."""
    return len({q.user or f"#{q.id}" for q in asked})
