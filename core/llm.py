"""The language model, reached through the ``openai`` package at any OpenAI-compatible endpoint.

This module is the one boundary where the client's exceptions are translated:
whatever goes wrong (no endpoint, refused connection, timeout, 5xx, a
rejected key) becomes ``LLMUnavailable`` with a reason for the log, and the
engine shows the evidence instead of an answer. A cancellation is not a
failure: it goes through untranslated, and a streamed request is closed on the way.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    # The client loads with the first configured model, not with the server: a knowledge
    # base without a model (cited evidence only) never pays for importing it.
    import openai
    from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from core.config import LLMConfig
from core.errors import LLMUnavailable

log = logging.getLogger(__name__)

OnDelta = Callable[[str], Awaitable[None]]
"""Called with the whole text so far while a streamed answer arrives."""


class LLM:
    """Chat completions against one endpoint and model.

    Args:
        config: the endpoint (empty ``base_url``: no model is configured), its
            key (some local servers accept anything), the model name, seconds
            per request, and retries on connection errors, 408/409/429 and 5xx.
    """

    def __init__(self, config: LLMConfig) -> None:
        self.config = config
        # For messages and logs: an endpoint URL may carry credentials (user:password@).
        self.base_url = _without_credentials(config.base_url)
        self.model = config.model
        self._client = _client(config) if config.base_url else None

    @property
    def configured(self) -> bool:
        """Whether an endpoint is set at all."""
        return self._client is not None

    async def aclose(self) -> None:
        """Close the HTTP connections of the client."""
        if self._client is not None:
            await self._client.close()

    async def complete(
        self, messages: Sequence[dict[str, str]], *, on_delta: OnDelta | None = None
    ) -> str:
        """The model's reply to ``messages``; streamed through ``on_delta`` when given.

        The whole answer must arrive within ``deadline`` seconds and, when
        streamed, its first words within ``first_token_timeout``.

        Raises:
            LLMUnavailable: no endpoint; or the endpoint failed, was too slow,
                or sent something that is not a well-formed answer.
        """
        if self._client is None:
            raise LLMUnavailable("No language model is configured (OPENAI_BASE_URL is empty).")
        import openai  # loaded with the client already

        try:
            async with asyncio.timeout(self.config.deadline):
                if on_delta is None:
                    return await self._complete_once(messages)
                return await self._complete_streamed(messages, on_delta)
        except LLMUnavailable:
            raise
        except TimeoutError as exc:
            raise LLMUnavailable(self._too_slow()) from exc
        except openai.APITimeoutError as exc:
            raise LLMUnavailable(f"The model at {self.base_url} timed out.") from exc
        except openai.APIConnectionError as exc:
            raise LLMUnavailable(f"The model at {self.base_url} could not be reached.") from exc
        except openai.APIStatusError as exc:
            raise LLMUnavailable(
                f"The model at {self.base_url} answered HTTP {exc.status_code}."
            ) from exc
        except Exception as exc:  # a 200 that is not an answer: HTML, broken JSON, wrong types
            raise LLMUnavailable(
                f"The model at {self.base_url} sent a reply that is not a well-formed answer "
                f"({type(exc).__name__})."
            ) from exc

    def _too_slow(self) -> str:
        return (
            f"The model at {self.base_url} did not answer within {self.config.deadline:g} s "
            f"(or started later than {self.config.first_token_timeout:g} s)."
        )

    async def _complete_once(self, messages: Sequence[dict[str, str]]) -> str:
        assert self._client is not None
        resp = await self._client.chat.completions.create(
            model=self.model,
            messages=_params(messages),
            temperature=0,
        )
        if not resp.choices:
            raise LLMUnavailable(f"The model at {self.base_url} returned no choices.")
        return _answer_text(resp.choices[0].message.content)

    async def _complete_streamed(
        self, messages: Sequence[dict[str, str]], on_delta: OnDelta
    ) -> str:
        assert self._client is not None
        text = ""
        async with asyncio.timeout(self.config.first_token_timeout) as first_token:
            stream = await self._client.chat.completions.create(
                model=self.model,
                messages=_params(messages),
                temperature=0,
                stream=True,
            )
            try:
                async for chunk in stream:
                    piece = _delta_text(chunk)
                    if not piece:
                        continue
                    first_token.reschedule(None)  # from here on only the deadline applies
                    text += piece
                    await on_delta(text)
            finally:
                # Closed here, even when a deadline cuts the stream short or the caller is
                # cancelled (the asker pressed Stop): the request's connection closes at
                # once and the endpoint stops writing. Left to the garbage collector, it
                # would close late and be logged as an error.
                await stream.close()
        return _answer_text(text)


def _delta_text(chunk: ChatCompletionChunk) -> str:
    """The text a stream chunk adds; an error for a chunk that is not a text delta."""
    if not chunk.choices:
        return ""
    content = chunk.choices[0].delta.content
    if content is not None and not isinstance(content, str):
        raise TypeError(f"stream chunk content is {type(content).__name__}, not text")
    return content or ""


def _answer_text(content: object) -> str:
    """The answer's text; ``LLMUnavailable`` when the reply holds no text at all."""
    if not isinstance(content, str) or not content.strip():
        kind = "an empty answer" if isinstance(content, str | None) else type(content).__name__
        raise LLMUnavailable(f"The model's reply held no answer text ({kind}).")
    return content


def _without_credentials(url: str) -> str:
    """``url`` with any ``user:password@`` part removed."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _params(messages: Sequence[dict[str, str]]) -> list[ChatCompletionMessageParam]:
    return [cast("ChatCompletionMessageParam", m) for m in messages]


def _client(config: LLMConfig) -> openai.AsyncOpenAI:
    import openai

    return openai.AsyncOpenAI(
        base_url=config.base_url,
        api_key=config.api_key or "not-needed",
        timeout=config.timeout,
        max_retries=config.max_retries,
        # The client's own defaults (limits, redirects), with the process's one TLS context.
        http_client=openai.DefaultAsyncHttpxClient(
            base_url=config.base_url, timeout=config.timeout, verify=_tls()
        ),
    )


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS context every client of this process shares, made as the client makes its own.

    Made once: reading the system's CA certificates takes tens of milliseconds, and an
    engine is built per knowledge base, per model switch, per ``kb`` command.
    """
    import httpx2

    return httpx2.create_ssl_context()
