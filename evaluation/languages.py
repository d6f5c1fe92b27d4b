"""The language groups ``kb eval`` breaks its figures down by, from the questions' ``lang`` fields.

An in-domain query belongs to the group of its phrasings' language (``lang``)
and, when its needle's document is in another language (``doc_lang``), to the
``cross-lingual`` group as well; an out-of-domain question to its ``lang``'s
group. A row without ``lang`` is in no group, so a set without languages has
no breakdown. Groups hold positions in the evaluation's query order (two
phrasings per question) and in the out-of-domain order; the figures are
counted over them by ``evaluation.results`` (one run) and
``evaluation.compare`` (two runs, paired).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from evaluation.inputs import PHRASINGS

__all__ = ["ALL_PHRASINGS", "CROSS_LINGUAL", "LanguageGroup", "language_groups", "pick"]

CROSS_LINGUAL = "cross-lingual"
"""The group of queries asked in another language than their needle's document's."""
ALL_PHRASINGS = "all"
"""The subset of a group holding both phrasings."""

T = TypeVar("T")


def pick(values: Sequence[T], positions: Sequence[int]) -> list[T]:
    """``values`` at ``positions``, in that order."""
    return [values[i] for i in positions]


@dataclass(frozen=True)
class LanguageGroup:
    """The in-domain queries and out-of-domain questions of one language group.

    Attributes:
        name: an ISO 639-1 code, or ``CROSS_LINGUAL``.
        queries: positions in the query order.
        ood: positions in the out-of-domain order; ``None`` for ``CROSS_LINGUAL``
            (an out-of-domain question has no document).
    """

    name: str
    queries: tuple[int, ...]
    ood: tuple[int, ...] | None

    def by_phrasing(self, phrasings: Sequence[str]) -> list[tuple[str, tuple[int, ...]]]:
        """``(ALL_PHRASINGS, queries)``, then each phrasing's queries (``PHRASINGS`` order).

        Args:
            phrasings: per query of the query order, its phrasing (``doc``, ``ticket``).

        Returns:
            Nothing when the group has no in-domain query.
        """
        if not self.queries:
            return []
        subsets = [(ALL_PHRASINGS, self.queries)]
        for phrasing in PHRASINGS:
            subset = tuple(i for i in self.queries if phrasings[i] == phrasing)
            if subset:
                subsets.append((phrasing, subset))
        return subsets


def language_groups(
    query_langs: Sequence[tuple[str, str]], ood_langs: Sequence[str]
) -> list[LanguageGroup]:
    """One group per language any row names (sorted), then ``CROSS_LINGUAL`` if any query is.

    Args:
        query_langs: per query of the query order, ``(lang, doc_lang)``; ``""``
            for a question without ``lang`` (``doc_lang`` ``""`` means ``lang``).
        ood_langs: per out-of-domain question, its ``lang`` or ``""``.

    Returns:
        The groups; empty when no row has a ``lang``.
    """
    names = sorted({lang for lang, _ in query_langs if lang} | {lang for lang in ood_langs if lang})
    groups = [
        LanguageGroup(
            name,
            tuple(i for i, (lang, _) in enumerate(query_langs) if lang == name),
            tuple(i for i, lang in enumerate(ood_langs) if lang == name),
        )
        for name in names
    ]
    crossing = tuple(
        i for i, (lang, doc) in enumerate(query_langs) if lang and lang != (doc or lang)
    )
    if crossing:
        groups.append(LanguageGroup(CROSS_LINGUAL, crossing, None))
    return groups
