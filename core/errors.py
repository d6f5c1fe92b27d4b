"""Errors of the answer engine, below ``index.errors.KBError``::

KBError
└── AnswerError
    ├── LLMUnavailable          the model endpoint is missing, refused, timed out or 5xx
    ├── BadLinkToken            a passage link's token is tampered, expired or for another doc
    ├── RerankerUnavailable     (core.rerank) the cross-encoder reranker cannot be loaded or run
    └── LinkSecretUnavailable   the link-signing secret file cannot be read, written, or is empty

``index.errors`` lists every error of the product.
"""

from __future__ import annotations

from index.errors import KBError


class AnswerError(KBError):
    """Base class of the answer engine's errors."""


class LLMUnavailable(AnswerError):
    """The language model could not be reached or answered with a server error."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BadLinkToken(AnswerError):
    """A document link token is invalid, expired or does not name this document."""

    status = 403


class LinkSecretUnavailable(AnswerError):
    """The link-signing secret file cannot be read or created, or is empty."""
