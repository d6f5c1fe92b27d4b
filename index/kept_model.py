"""A knowledge base built on the earlier default model answers on it until ``kb reindex``.

The embedded default became the multilingual preset; all-MiniLM-L6-v2 was the
default before it. A knowledge base whose documents were embedded by MiniLM,
opened with the default model, is not switched under its admins' feet: its
vectors are MiniLM's, so the knowledge base keeps running MiniLM (its
passages, its calibrated thresholds) and says so at start, in ``kb status``,
``/readyz`` and the admins' Home tab. ``kb reindex`` re-embeds every document
with the default and the knowledge base is on it from then on (``/kb-reindex``
in Slack moves the running server too: ``bot.slack.reindex``; every other
server on the store follows: ``core.switch``). One model runs at a time: the
vectors of two models never meet in one search.

The choice is made from the stamps the indexed documents carry
(``Store.stamped_models``) when the knowledge base is opened, and again by a
running server whenever they change (``KnowledgeBase.store_model``):

* the configured model is the default (``multilingual``, set or not), and
* some indexed document is stamped with MiniLM, and
* none is stamped with the multilingual preset (a reindex moved none yet).

An operator who names another model gets that model, as always: documents
stamped otherwise are stale until ``kb reindex``.
"""

from __future__ import annotations

from dataclasses import dataclass

from index.config import DEFAULT_EMBEDDING_MODEL, PREVIOUS_DEFAULT_MODEL
from index.embed import MULTILINGUAL_MODEL_NAME, model_name

__all__ = ["KeptModel", "kept_model"]


@dataclass(frozen=True)
class KeptModel:
    """The earlier default a knowledge base keeps running, and the default it would move to.

    Attributes:
        spec: the ``KB_EMBEDDING_MODEL`` value of the model kept.
        built_on: its short name, for people (``all-MiniLM-L6-v2``).
        default: the default model's ``KB_EMBEDDING_MODEL`` value (``multilingual``).
        documents: indexed documents embedded by the model kept.
    """

    spec: str
    built_on: str
    default: str
    documents: int

    @property
    def note(self) -> str:
        """What an admin is told: the model it answers on, and the one command that moves it."""
        return (
            f"The knowledge base was built on {self.built_on} and answers on it; "
            f"run `kb reindex` to move to {self.default}, the default model "
            "(running servers follow it without a restart; so does `/kb-reindex` in Slack)."
        )

    def to_dict(self) -> dict[str, object]:
        """As ``kb status --json`` and ``/readyz`` report it."""
        return {
            "built_on": self.built_on,
            "default": self.default,
            "documents": self.documents,
            "note": self.note,
        }


def kept_model(configured: str, stamped: dict[str, int]) -> KeptModel | None:
    """The earlier default ``configured`` gives way to, or ``None`` when ``configured`` runs.

    Args:
        configured: the ``KB_EMBEDDING_MODEL`` value.
        stamped: indexed documents per model stamp (``Store.stamped_models``).
    """
    if configured.strip().lower() != DEFAULT_EMBEDDING_MODEL:
        return None
    earlier = model_name(PREVIOUS_DEFAULT_MODEL)
    if any(stamp.startswith(MULTILINGUAL_MODEL_NAME) for stamp in stamped):
        return None
    documents = stamped.get(earlier, 0)
    if not documents:
        return None
    return KeptModel(
        spec=PREVIOUS_DEFAULT_MODEL,
        built_on=earlier.rsplit("/", 1)[-1],
        default=DEFAULT_EMBEDDING_MODEL,
        documents=documents,
    )
