"""An embedding model behind an OpenAI-compatible ``/embeddings`` endpoint (``openai:<model>``).

Texts go in batches of ``EmbeddingEndpoint.batch_size``; a batch that meets a
429, a 5xx, 408/409 or a connection error is sent again after an exponential
back-off (a ``Retry-After`` the endpoint sends is honoured), within
``EmbeddingEndpoint.timeout`` seconds for the batch in all. Every reply is
checked before a vector of it is used: one vector per text, all of one size,
finite and not zero. The size is learned from the first reply and stamped on
the documents like any model's, so vectors of another model or size are never
searched together with these.

Tokens are not counted with the remote model's tokenizer, which is not
available here: a text is counted as **one token per UTF-8 byte** plus two
special tokens. No common tokenizer (WordPiece, byte-level BPE, SentencePiece
with byte fallback) makes more tokens than a text has bytes, so a chunk counted
within the window is within it; the cost is that some chunks are split a
little earlier than they would need to be.

Error messages and logs name the endpoint without the credentials a URL may
carry, and never the key.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from index.config import EmbeddingEndpoint
from index.embed.base import (
    DEFAULT_BATCH_SIZE,
    EmbeddingModelUnavailable,
    Prefixes,
    Role,
    chosen_prefixes,
    stamp_name,
)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    # The client loads with the first request: naming a model (``model_name``) does not.
    import openai

REMOTE_PREFIX = "openai:"
SPECIAL_TOKENS = 2
# Back-off before the n-th retry: 0.5 s, 1 s, 2 s, ... at most 8 s.
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 8.0
RETRY_STATUSES = frozenset({408, 409, 429})
# What the first reply is asked for, to learn the vectors' size.
DIMENSION_PROBE = "dimensions"


class RemoteEmbedder:
    """``Embedder`` over an OpenAI-compatible embeddings endpoint.

    Args:
        spec: ``openai:<model>``; documents are stamped with it as it is.
        endpoint: where the endpoint is, its key, batching, time and retry limits.
    """

    def __init__(
        self, spec: str, endpoint: EmbeddingEndpoint, prefixes: Prefixes | None = None
    ) -> None:
        if not spec.startswith(REMOTE_PREFIX) or not spec[len(REMOTE_PREFIX) :].strip():
            raise EmbeddingModelUnavailable(
                f"{spec!r} names no model: use KB_EMBEDDING_MODEL=openai:<model name>."
            )
        self.spec = spec
        self.model = spec[len(REMOTE_PREFIX) :].strip()
        # The endpoint is sent the texts with the family's prefixes (an e5 or
        # nomic model served as is); an endpoint that adds its own is told
        # none with KB_EMBEDDING_QUERY_PREFIX= and KB_EMBEDDING_DOCUMENT_PREFIX=.
        self.prefixes = prefixes or chosen_prefixes(self.model, None, None)
        self.name = stamp_name(spec, self.prefixes)
        self.endpoint = endpoint
        self._dim: int | None = endpoint.dimensions or None
        self._confirmed = False

    @cached_property
    def _client(self) -> openai.OpenAI:
        import openai

        return openai.OpenAI(
            base_url=self.endpoint.base_url or None,
            # Local servers often want no key; the client insists on one.
            api_key=self.endpoint.api_key or "not-needed",
            max_retries=0,  # retried here, within the batch's time limit
        )

    @property
    def where(self) -> str:
        """The endpoint as it may be shown: without credentials."""
        return without_credentials(str(self._client.base_url))

    @property
    def loaded(self) -> bool:
        """Whether the endpoint has answered once (so the vectors' size is known)."""
        return self._confirmed

    @property
    def dim(self) -> int:
        """The vectors' size: configured, stamped on its documents, or learned from a first reply."""
        if self._dim is None:
            self._embed_batch([DIMENSION_PROBE])
        assert self._dim is not None  # set by the first checked reply
        return self._dim

    def expect_dimensions(self, dimensions: int) -> None:
        """See ``Embedder.expect_dimensions``; a configured size (``KB_EMBEDDING_DIMENSIONS``) wins."""
        if self._dim is None:
            self._dim = dimensions

    @property
    def max_tokens(self) -> int:
        """The window assumed for the model (``EmbeddingEndpoint.max_tokens``)."""
        return self.endpoint.max_tokens

    def count_tokens(self, text: str) -> int:
        """An upper bound of the model's tokens for ``text`` as a passage: one per UTF-8 byte
        of it and its prefix, plus the special tokens."""
        return len((self.prefixes.document + text).encode("utf-8")) + SPECIAL_TOKENS

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        """``count_tokens`` of each text."""
        return [self.count_tokens(t) for t in texts]

    def encode(
        self,
        texts: Sequence[str],
        *,
        role: Role = "document",
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Embed ``texts`` (``role``: see ``Embedder.encode``) in batches of
        ``EmbeddingEndpoint.batch_size`` (``batch_size`` is the local model's knob and is
        not used here)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        size = max(1, self.endpoint.batch_size)
        parts = []
        for i in range(0, len(texts), size):
            batch = self.prefixes.add(texts[i : i + size], role)
            parts.append(self._embed_batch(batch))
            if on_batch:
                on_batch(len(batch))
        return np.ascontiguousarray(np.vstack(parts), dtype=np.float32)

    def encode_query(self, text: str) -> np.ndarray:
        """Embed one question as a ``(dim,)`` unit vector."""
        return self.encode([text], role="query")[0]

    def check_runnable(self) -> None:
        """See ``Embedder.check_runnable``: nothing is installed for an endpoint."""

    # ------------------------------------------------------------------ internals

    def _embed_batch(self, batch: list[str]) -> np.ndarray:
        vectors = self._checked(self._request(batch), len(batch))
        if self._dim is None:
            self._dim = int(vectors.shape[1])
        self._confirmed = True
        return vectors

    def _request(self, batch: list[str]) -> Any:
        """The endpoint's JSON reply for ``batch``, retried within the batch's time limit."""
        import openai

        deadline = time.monotonic() + self.endpoint.timeout
        attempts = self.endpoint.max_retries + 1
        reason = "no attempt fitted in the time limit"
        for attempt in range(attempts):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                return self._post(batch, deadline)
            except openai.APIStatusError as exc:
                if not _retryable(exc.status_code):
                    raise self._failure(f"it answered HTTP {exc.status_code}") from exc
                reason, wait = f"HTTP {exc.status_code}", _retry_after(exc.response)
            except openai.APITimeoutError:
                reason, wait = "it did not answer in time", None
            except openai.APIConnectionError:
                reason, wait = "it could not be reached", None
            if attempt + 1 == attempts:
                break
            delay = min(_backoff(attempt, wait), max(0.0, deadline - time.monotonic()))
            log.warning("embeddings endpoint %s: %s; retrying in %.1f s", self.where, reason, delay)
            time.sleep(delay)
        raise self._failure(f"{reason}, after {attempts} attempts")

    def _post(self, batch: list[str], deadline: float) -> Any:
        """The endpoint's JSON reply, read by the ``deadline`` (``time.monotonic()``).

        The client's timeout bounds each read, not the reply: an endpoint sending
        a byte at a time just within it would hold the batch for ever. The body
        is read in pieces and given up once the deadline passes, so the batch
        takes at most its time limit plus one read.
        """
        import openai

        extra: dict[str, Any] = {}
        if self.endpoint.dimensions:
            extra["dimensions"] = self.endpoint.dimensions
        with self._client.embeddings.with_streaming_response.create(
            model=self.model,
            input=batch,
            encoding_format="float",
            timeout=max(0.0, deadline - time.monotonic()),
            **extra,
        ) as raw:
            body = bytearray()
            for piece in raw.iter_bytes():
                body += piece
                if time.monotonic() >= deadline:
                    raise openai.APITimeoutError(request=raw.http_response.request)
        try:
            return json.loads(body)
        except ValueError as exc:
            raise self._failure("its reply is not JSON") from exc

    def _checked(self, body: Any, n: int) -> np.ndarray:
        """``body``'s vectors as unit rows, in input order; an error if anything is off."""
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or len(data) != n:
            got = len(data) if isinstance(data, list) else "no"
            raise self._failure(f"it sent {got} vectors for {n} texts")
        try:
            ordered = sorted(data, key=lambda item: int(item["index"]))
            rows = [np.asarray(item["embedding"], dtype=np.float64) for item in ordered]
            indices = [int(item["index"]) for item in ordered]
        except (KeyError, TypeError, ValueError) as exc:
            raise self._failure("its reply is not a list of embeddings") from exc
        if indices != list(range(n)):
            raise self._failure("its reply numbers the vectors wrongly")
        sizes = {r.shape for r in rows}
        if len(sizes) != 1 or len(rows[0].shape) != 1 or rows[0].size == 0:
            raise self._failure("its vectors are not flat lists of one size")
        matrix = np.vstack(rows)
        expected = self._dim
        if expected is not None and matrix.shape[1] != expected:
            raise self._failure(
                f"it sent vectors of {matrix.shape[1]} dimensions where {expected} were expected; "
                "if the model changed, run `kb reindex`"
            )
        norms = np.linalg.norm(matrix, axis=1)
        if not np.all(np.isfinite(matrix)) or np.any(norms == 0):
            raise self._failure("it sent vectors that are zero or not finite")
        return (matrix / norms[:, None]).astype(np.float32)

    def _failure(self, reason: str) -> EmbeddingModelUnavailable:
        return EmbeddingModelUnavailable(
            f"The embeddings endpoint {self.where} (model {self.model!r}) failed: {reason}. "
            "Check KB_EMBEDDING_BASE_URL, KB_EMBEDDING_API_KEY and KB_EMBEDDING_MODEL."
        )


def _retryable(status: int) -> bool:
    return status in RETRY_STATUSES or status >= 500


def _retry_after(response: Any) -> float | None:
    try:
        value = float(response.headers.get("retry-after", ""))
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _backoff(attempt: int, retry_after: float | None) -> float:
    if retry_after is not None:
        return retry_after
    return float(min(BACKOFF_MAX, BACKOFF_FIRST * 2**attempt))


def without_credentials(url: str) -> str:
    """``url`` without a ``user:password@`` part."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
