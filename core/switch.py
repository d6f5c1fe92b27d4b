"""The switch of a running server to another embedding model, its searches held.

Two things move a server: ``/kb-reindex`` in it moving the knowledge base off
the earlier default model (``bot.slack.reindex``: the knowledge base changes
model inside :meth:`ModelSwitch.holding`), and another process moving the
store's documents (``kb reindex`` from a shell, another replica's
``/kb-reindex``): the server notices the stamps changed while it follows the
store's generation, or a question's search notices first (``Engine.follow_store``),
and runs the model they call for (:meth:`ModelSwitch.follow`), as a restart
would (``index.kept_model``). Both close the engine's search gate
(``core.searches``) for the change, then give the engine the knowledge base's
new index and that model's thresholds, log once, and reopen: no question is
searched on two models or a half-moved store. The new model's query map is not
waited for: it is fitted after, in the background (``index.search.query_map``),
and the searches use none, or the one stored for that model, until then.
``/readyz`` and the Home tab read
the knowledge base, so they say what it runs from then on.

A model the store moved to that cannot be loaded here leaves the server
refusing every question with the reason (``StoreModelUnavailable``, and
``/readyz`` 503), never answering from the earlier model's index; it is tried
again every :data:`RETRY_SECONDS`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from core.answer import Engine
from core.config import EngineConfig
from index.embed import StoreModelUnavailable

log = logging.getLogger(__name__)

__all__ = ["MOVE_POLL_SECONDS", "RETRY_SECONDS", "SWITCH_WAIT_SECONDS", "ModelSwitch"]

# How long a switch waits for the searches under way to end, or a move in another
# process to finish writing the documents, before it goes on.
SWITCH_WAIT_SECONDS = 300.0
# How often a model the store moved to, which could not be loaded, is tried again.
RETRY_SECONDS = 30.0
# How often a follower looks whether another process's move is still writing documents.
MOVE_POLL_SECONDS = 0.2


class ModelSwitch:
    """Moves ``engine`` with its knowledge base to another embedding model, searches held.

    Args:
        engine: the engine answering from the knowledge base.
        config_for: the engine's configuration for a model (``KB_EMBEDDING_MODEL``
            value), with that model's thresholds.
        clock: monotonic seconds (tests give a recorded clock).
    """

    def __init__(
        self,
        engine: Engine,
        config_for: Callable[[str], EngineConfig],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        # A search that finds the store moved before this server noticed follows it at once.
        engine.follow_store = self.follow
        self.config_for = config_for
        self.clock = clock
        # One switch at a time in this process: the in-process move or the follower.
        self._one = asyncio.Lock()
        self._failed_at: float | None = None
        self._told: str | None = None

    @property
    def busy(self) -> bool:
        """Whether a switch of this process is under way (``follow`` would not look now)."""
        return self._one.locked()

    @contextmanager
    def holding(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        """From a worker thread: hold the searches while the knowledge base changes model inside.

        Raises:
            TimeoutError: the searches under way did not end in time (nothing changed yet).
        """
        # Entered in the reindex's worker thread; the gate and the lock live on the event loop.
        attempt = _Closing(self)
        closing = asyncio.run_coroutine_threadsafe(attempt.close(), loop)
        try:
            # Searches under way end within their own timeouts; past this bound (the loop
            # stopping, say) the reindex stops before it has changed anything.
            closing.result(timeout=SWITCH_WAIT_SECONDS)
        except BaseException:
            closing.cancel()  # stops waiting for the lock or the gate
            if not loop.is_closed():
                # The gate may have closed just as the wait gave up: given back on the loop.
                loop.call_soon_threadsafe(attempt.abandon)
            raise
        try:
            held = self.clock()
            yield
            self._switched(held)
        finally:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._reopen)

    async def follow(self) -> bool:
        """Run the model the store's documents call for, if they moved; whether this server moved.

        Cheap when nothing moved (one read of the stamps); the caller asks when
        the store's generation changed, or while a refused model waits to be
        tried again. A model that cannot be loaded is logged once and refused
        for every question until it loads.
        """
        kb = self.engine.kb
        if self._failed_at is not None and self.clock() - self._failed_at < RETRY_SECONDS:
            return False
        if self.busy:
            return False
        if not await asyncio.to_thread(kb.store_model):
            if kb.unfollowed is not None:
                # Moved back to the model this server runs: its searches match the store again.
                kb.unfollowed = self._failed_at = self._told = None
                log.info("the store is back on %s: answering again", kb.embedder.name)
            return False
        await self._close()
        try:
            held = self.clock()
            # The move's documents are written one by one: the searches wait until all are.
            while await asyncio.to_thread(kb.moving_off):
                if self.clock() - held > SWITCH_WAIT_SECONDS:
                    break
                await asyncio.sleep(MOVE_POLL_SECONDS)
            spec = await asyncio.to_thread(kb.store_model)  # the move may have been undone
            if spec is None:
                return False
            try:
                await asyncio.to_thread(kb.follow_store_model, spec)
            except StoreModelUnavailable as exc:
                self._failed_at = self.clock()
                if str(exc) != self._told:
                    self._told = str(exc)
                    log.error("%s; every question is refused until it loads", exc)
                return False
            self._failed_at = self._told = None
            self._switched(held)
            return True
        finally:
            self._reopen()

    def _switched(self, held: float) -> None:
        """After the knowledge base changed model: the engine on its index, at its thresholds."""
        kb = self.engine.kb
        self.engine.follow_model(self.config_for(kb.config.embedding_model))
        log.info(
            "answering on %s from now on; new searches waited %.1f s for the change",
            kb.embedder.name,
            self.clock() - held,
        )

    async def _close(self) -> None:
        """Take the one switch of this process, then the search gate (given back if cancelled)."""
        await self._one.acquire()
        try:
            await self.engine.searches.close()
        except BaseException:
            self._reopen()
            raise

    def _reopen(self) -> None:
        """Let searches through again, and another switch."""
        self.engine.searches.reopen()
        self._one.release()


class _Closing:
    """One attempt to close the searches for a switch, which its waiter may give up on.

    ``close`` and ``abandon`` both run on the event loop, one after the other in
    either order: whichever comes second gives the gate and the lock back.
    """

    def __init__(self, switch: ModelSwitch) -> None:
        self.switch = switch
        self.closed = False
        self.abandoned = False

    async def close(self) -> None:
        await self.switch._close()
        if self.abandoned:
            self.switch._reopen()
            raise TimeoutError("the switch was given up while the searches were closing")
        self.closed = True

    def abandon(self) -> None:
        self.abandoned = True
        if self.closed:
            self.closed = False
            self.switch._reopen()
