"""Whether the running embedding model reads the languages the knowledge base holds.

all-MiniLM-L6-v2 (a named choice, the default before the multilingual model) is
an English model: on Czech, Danish, French or Romanian passages its vectors are
near noise (studies/2026-12-03-multilingual-preset.md), so the gate
refuses answerable questions and passes unrelated ones. Nothing fails
visibly; this check is what tells an admin (``kb ingest``, ``kb status``,
``/readyz``, App Home), with each language's share of the passages and the one
change to make.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from index.embed import MULTILINGUAL_PRESET
from index.languages import ENGLISH

__all__ = ["MIN_OTHER_SHARE", "LanguageFit", "english_only", "language_fit"]

# Below this share of passages in other languages (a few quoted lines, a
# translated glossary) the English model is still the right one.
MIN_OTHER_SHARE = 0.05
# Models trained on English text only (their model cards say so).
_ENGLISH_ONLY = re.compile(
    r"all-minilm|all-mpnet|bge-(small|base|large)-en|arctic-embed-(xs|s|m|l)(-long)?(-v1\.5)?$"
    r"|mxbai-embed-large|nomic-embed-text-v1|gte-(small|base|large)$|(?<!multilingual-)e5-(small|base|large)(-v2)?$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class LanguageFit:
    """The knowledge base's languages against its model.

    Attributes:
        shares: each language's share of the searchable passages (told ones), largest first.
        untold: passages whose language could not be told.
        model: the running model's name.
        english_only: whether that model reads English only.
        advice: what to change, for an admin; ``None`` when the model fits.
    """

    shares: dict[str, float]
    untold: int
    model: str
    english_only: bool
    advice: str | None

    def to_dict(self) -> dict[str, object]:
        """As ``kb status --json`` and ``/readyz`` report it."""
        return {
            "shares": {code: round(share, 4) for code, share in self.shares.items()},
            "untold_passages": self.untold,
            "english_only_model": self.english_only,
            "advice": self.advice,
        }


def english_only(model: str) -> bool:
    """Whether ``model`` (a stamp or a ``KB_EMBEDDING_MODEL`` value) is known to read only English."""
    return bool(_ENGLISH_ONLY.search(model.split(" [")[0]))


def language_fit(counts: dict[str | None, int], model: str) -> LanguageFit:
    """How ``counts`` (passages per language, ``Store.language_counts``) fit ``model``."""
    told = {code: n for code, n in counts.items() if code}
    whole = sum(told.values())
    shares = (
        {code: n / whole for code, n in sorted(told.items(), key=lambda kv: -kv[1])}
        if whole
        else {}
    )
    other = sum(share for code, share in shares.items() if code != ENGLISH)
    narrow = english_only(model)
    advice = None
    if narrow and other >= MIN_OTHER_SHARE:
        listed = ", ".join(f"{code} {share:.0%}" for code, share in shares.items())
        advice = (
            f"{other:.0%} of the passages are not in English ({listed}), but the embedding "
            f"model {model} reads English only, so questions about them are refused or "
            f"answered from unrelated passages. Set KB_EMBEDDING_MODEL={MULTILINGUAL_PRESET} "
            "and run `kb reindex`."
        )
    return LanguageFit(shares, counts.get(None, 0), model, narrow, advice)
