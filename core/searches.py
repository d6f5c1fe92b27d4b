"""Searches and a switch of the embedding model never overlap.

A search embeds the question with the running model and looks it up in that
model's index, then reads the passages it found; a switch (``/kb-reindex``
moving a knowledge base off the earlier default model, ``index.kept_model``)
replaces the model, its index and the passages at once. Every search holds
the gate from its embedding to its passages (:meth:`SearchGate.enter`); a
switch closes it (:meth:`SearchGate.close`): it waits for the searches under
way to read their passages and holds new ones until it reopens. So a question
is searched on one model, never two, and never meets a half-switched store.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

__all__ = ["SearchGate"]


class SearchGate:
    """Lets searches through together, or a switch alone (on one event loop)."""

    def __init__(self) -> None:
        self._inside = 0
        self._open = asyncio.Event()
        self._open.set()
        self._empty = asyncio.Event()
        self._empty.set()

    async def enter(self) -> Callable[[], None]:
        """Wait until no switch holds the gate and go in; call the result to leave (once counts)."""
        while not self._open.is_set():
            await self._open.wait()
        self._inside += 1
        self._empty.clear()
        left = False

        def leave() -> None:
            nonlocal left
            if left:
                return
            left = True
            self._inside -= 1
            if not self._inside:
                self._empty.set()

        return leave

    @asynccontextmanager
    async def searching(self) -> AsyncIterator[None]:
        """Hold the gate for one search."""
        leave = await self.enter()
        try:
            yield
        finally:
            leave()

    @property
    def closed(self) -> bool:
        """Whether a switch holds the gate (new searches wait)."""
        return not self._open.is_set()

    async def close(self) -> None:
        """Hold new searches back, and return once those under way have left."""
        self._open.clear()
        await self._empty.wait()

    def reopen(self) -> None:
        """Let searches through again."""
        self._open.set()
