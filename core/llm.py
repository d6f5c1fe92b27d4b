"""The language model, reached through the ``openai`` package at any OpenAI-compatible endpoint.

This module is the one boundary where the client's exceptions are translated:
whatever goes wrong (no endpoint, refused connection, timeout, 5xx, a
rejected key) becomes ``LLMUnavailable`` with a reason for the log, and the
engine shows the evidence instead of an answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

import openai
from openai.types.chat import ChatCompletionMessageParam

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
        self.base_url = config.base_url
        self.model = config.model
        self._client = (
            openai.AsyncOpenAI(
                base_url=config.base_url,
                api_key=config.api_key or "not-needed",
                timeout=config.timeout,
                max_retries=config.max_retries,
            )
            if config.base_url
            else None
        )

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

        Raises:
            LLMUnavailable: no endpoint, or the endpoint failed.
        """
        if self._client is None:
            raise LLMUnavailable("No language model is configured (OPENAI_BASE_URL is empty).")
        try:
            if on_delta is None:
                return await self._complete_once(messages)
            return await self._complete_streamed(messages, on_delta)
        except openai.APITimeoutError as exc:
            raise LLMUnavailable(f"The model at {self.base_url} timed out.") from exc
        except openai.APIConnectionError as exc:
            raise LLMUnavailable(f"The model at {self.base_url} could not be reached.") from exc
        except openai.APIStatusError as exc:
            raise LLMUnavailable(
                f"The model at {self.base_url} answered HTTP {exc.status_code}."
            ) from exc
        except openai.OpenAIError as exc:
            raise LLMUnavailable(f"The model call failed: {exc}.") from exc

    async def _complete_once(self, messages: Sequence[dict[str, str]]) -> str:
        assert self._client is not None
        resp = await self._client.chat.completions.create(
            model=self.model,
            messages=_params(messages),
            temperature=0,
        )
        if not resp.choices:
            raise LLMUnavailable("The model returned no choices.")
        return resp.choices[0].message.content or ""

    async def _complete_streamed(
        self, messages: Sequence[dict[str, str]], on_delta: OnDelta
    ) -> str:
        assert self._client is not None
        stream = await self._client.chat.completions.create(
            model=self.model,
            messages=_params(messages),
            temperature=0,
            stream=True,
        )
        text = ""
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                await on_delta(text)
        return text


def _params(messages: Sequence[dict[str, str]]) -> list[ChatCompletionMessageParam]:
    return [cast(ChatCompletionMessageParam, m) for m in messages]
