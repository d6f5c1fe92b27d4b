"""The web server's connections: a cap, a deadline for each request's head, room made under attack.

aiohttp bounds a request's lines and headers and an idle connection's life
(``bot.server.limits`` sets them explicitly), but not the time a client takes
to send a request's head, nor how many connections are open: 1,100 clients
that each sent half a request held every descriptor of a 1,024-descriptor
server, and ``/healthz`` and Slack's events went unanswered. Here, per
connection (``GuardedHandler``, aiohttp's ``RequestHandler`` with a few hooks):

* **the head's deadline**: a connection gets ``header_timeout`` from its
  opening (or from the first byte of a later request on it) to send a whole
  request head; then it is answered 408 and closed, or just closed when it
  sent nothing. The body's deadline, which depends on the route, is
  ``bot.server.bodies``'.
* **the cap**: at most ``connection_cap`` connections are open. The server
  knows which of them wait on their client (a request's head or body still
  arriving, or idle between two requests) and which it is working for. A new
  connection past the cap takes the place of the one that has waited longest
  on its client: that one is closed (408 if a request had begun), which is what
  its own deadline would do later. Half-sent requests are exactly such
  connections, so under that attack a real client is always let in. Only when
  every connection is the server's work does a new one get a 503 with
  ``Retry-After``, written before anything is read, and closed; except for a
  few (``health_headroom``) that may still send a health check, so that a busy
  server is not taken for a dead one.
* **the descriptors**: ``serve`` raises the process's soft open-file limit to
  its hard limit and keeps ``RESERVED_DESCRIPTORS`` of it out of the cap, so
  ``accept()`` never fails for want of one; should it fail all the same, that
  is one counted log line, not a traceback a connection.

Every client fault here is one log line at most, counted once they repeat
(``bot.server.faults``).
"""

from __future__ import annotations

import asyncio
import enum
import errno
import json
import logging
import os
import resource
import signal
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web, web_protocol
from aiohttp.abc import AbstractAccessLogger, AbstractStreamWriter
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_log import AccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from bot.server.faults import ClientFaults, Fault
from bot.server.limits import HttpLimits, connection_cap

log = logging.getLogger(__name__)

__all__ = [
    "BUSY",
    "REPORTED",
    "ConnectionGuard",
    "GuardedHandler",
    "GuardedRunner",
    "accept_failures",
    "raise_open_file_limit",
    "serve",
]

# The listen backlog: connections the kernel holds before they are accepted, and
# the most one accept burst takes in before the cap can close the extra ones.
BACKLOG = 128
# The request state key marking a request whose fault was logged already: the
# access log leaves it out (one line per fault, counted when they repeat).
REPORTED = web.RequestKey("fault_reported", bool)
# What a client refused because every connection is busy reads (a 503, Retry-After).
BUSY = "The server is busy with other requests: try again shortly."
# Errors accept() fails with for want of a resource (asyncio then retries in a second).
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# aiohttp's own lines about clients' faults go nowhere: ``GuardedHandler`` reports them.
_SILENT = logging.getLogger("bot.server.connections.silenced")
_SILENT.disabled = True


class _Phase(enum.Enum):
    HEAD = "head"  # a request's head is awaited (the deadline runs)
    BODY = "body"  # the head is in, the body still arriving
    WORK = "work"  # the server's turn: handling the request, writing the answer
    IDLE = "idle"  # between two requests (aiohttp's keep-alive timeout runs)


def raw_response(status: int, reason: str, message: str, headers: dict[str, str]) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, as bytes to write to a transport."""
    body = json.dumps({"error": message}).encode()
    head = {
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
        "Connection": "close",
        **headers,
    }
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    return f"HTTP/1.1 {status} {reason}\r\n{lines}\r\n".encode() + body


class ConnectionGuard:
    """Which connections are open, which wait on their client, and who gets a new slot.

    Args:
        limits: the bounds (deadline, headroom, Retry-After).
        cap: connections open at once (``bot.server.limits.connection_cap``).
        faults: where clients' faults are logged.
    """

    def __init__(self, limits: HttpLimits, cap: int, faults: ClientFaults) -> None:
        self.limits = limits
        self.cap = cap
        self.faults = faults
        self.regular: set[GuardedHandler] = set()
        self.headroom: set[GuardedHandler] = set()
        # Connections waiting on their client, longest first (a dict keeps order).
        self.waiting: OrderedDict[GuardedHandler, None] = OrderedDict()
        self.refusal = raw_response(
            503,
            "Service Unavailable",
            BUSY,
            {"Retry-After": str(limits.retry_after)},
        )

    @property
    def open(self) -> int:
        """Connections open now."""
        return len(self.regular) + len(self.headroom)

    def admit(self, conn: GuardedHandler) -> bool | None:
        """Give ``conn`` a slot: ``False`` a regular one, ``True`` one for health checks only,
        ``None`` none (it is to be refused)."""
        if len(self.regular) < self.cap:
            self.regular.add(conn)
            return False
        if self.waiting:
            # The connection that has waited longest on its client makes room.
            victim = next(iter(self.waiting))
            pool = self.headroom if victim in self.headroom else self.regular
            victim.make_room()
            pool.add(conn)
            return pool is self.headroom
        if len(self.headroom) < self.limits.health_headroom:
            self.headroom.add(conn)
            return True
        self.faults.report(Fault.REFUSED, f"{self.open} open")
        return None

    def waits(self, conn: GuardedHandler) -> None:
        """``conn`` now waits on its client (the newest to do so)."""
        self.waiting.pop(conn, None)
        self.waiting[conn] = None

    def works(self, conn: GuardedHandler) -> None:
        """The server is working for ``conn``: it is not to be closed to make room."""
        self.waiting.pop(conn, None)

    def gone(self, conn: GuardedHandler) -> None:
        """``conn`` is closed, or being closed: its slot is free."""
        self.waiting.pop(conn, None)
        self.regular.discard(conn)
        self.headroom.discard(conn)


class GuardedHandler(web_protocol.RequestHandler):
    """aiohttp's connection handler, held to the head's deadline and the connection cap.

    Attributes:
        headroom: admitted past the cap: it may send health checks only
            (``bot.server.bodies`` refuses anything else with 503).
        dropped: the server closed it (a deadline, or to make room), and said so.
    """

    __slots__ = (
        "_guard",
        "_phase",
        "_deadline",
        "_sent",
        "_payload",
        "_refused",
        "headroom",
        "dropped",
    )

    def __init__(self, manager: GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = manager.guard
        self._phase = _Phase.HEAD
        self._deadline: asyncio.TimerHandle | None = None
        self._sent = False
        self._payload: StreamReader | None = None
        self._refused = False
        self.headroom = False
        self.dropped = False

    # ---------------------------------------------------------- the connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Admit the connection, or answer 503 and close it before reading anything."""
        admitted = self._guard.admit(self)
        if admitted is None:
            # Never handed to aiohttp: nothing is read, nothing else is set up.
            self._refused = self.dropped = True
            refused = cast(asyncio.Transport, transport)
            refused.write(self._guard.refusal)
            refused.close()
            return
        self.headroom = admitted
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: BaseException | None) -> None:
        """Free the slot."""
        if self._refused:
            return
        self._cancel_deadline()
        self._guard.gone(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Note a request's first bytes (its head's deadline starts), then let aiohttp parse."""
        if data and not self.dropped:
            if self._phase is _Phase.IDLE:
                self._await_head()
            if self._phase is _Phase.HEAD:
                self._sent = True
        super().data_received(data)

    # ---------------------------------------------------------- a request's life

    def request_started(self, payload: StreamReader) -> None:
        """The request's head is complete and its handler starts: the body may still come."""
        self._cancel_deadline()
        self._payload = payload
        if payload.is_eof():
            self._work()
        else:
            self._phase = _Phase.BODY
            payload.on_eof(self._work)

    async def finish_response(
        self, request: BaseRequest, resp: StreamResponse, start_time: float | None
    ) -> tuple[StreamResponse, bool]:
        """Write the answer; then the connection waits on its client for the next request."""
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            payload = self._payload
            if self.transport is None:
                pass
            elif payload is None or payload.is_eof():
                self._idle()
            else:
                # A body the handler did not read: aiohttp reads and drops the rest
                # (``linger_seconds``) before the next request may start.
                payload.on_eof(self._idle)

    def _idle(self) -> None:
        self._phase = _Phase.IDLE
        self._sent = False
        self._payload = None
        self._guard.waits(self)

    def _await_head(self) -> None:
        self._phase = _Phase.HEAD
        self._sent = False
        self._guard.waits(self)
        self._cancel_deadline()
        self._deadline = asyncio.get_running_loop().call_later(
            self._guard.limits.header_timeout, self._head_late
        )

    def _work(self) -> None:
        self._phase = _Phase.WORK
        self._guard.works(self)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    # ---------------------------------------------------------- closing early

    def _head_late(self) -> None:
        self._deadline = None
        if self._phase is not _Phase.HEAD or self.transport is None:
            return
        seconds = self._guard.limits.header_timeout
        if self._sent:
            self._guard.faults.report(Fault.HEAD_TIMEOUT, self._peer())
            self._drop(f"The request's head did not arrive within {seconds:g} s.")
        else:
            self._guard.faults.report(Fault.SENT_NOTHING, self._peer())
            self._drop(None)

    def make_room(self) -> None:
        """Close this connection, which waits on its client, for a new one."""
        self._guard.faults.report(Fault.MADE_ROOM, self._peer())
        begun = self._phase is _Phase.BODY or (self._phase is _Phase.HEAD and self._sent)
        self._drop(
            "The server needed this connection for another client: send the request again, at once."
            if begun
            else None
        )

    def _drop(self, message: str | None) -> None:
        """Say 408 with ``message`` (when a request had begun), then close at once."""
        self._guard.gone(self)
        self._cancel_deadline()
        self.dropped = True
        if message is not None and self.transport is not None:
            self.transport.write(raw_response(408, "Request Timeout", message, {}))
        # No lingering: the client has had its time. A handler reading the body
        # gets a ConnectionResetError, which bot.server.bodies knows is ours.
        self.force_close()

    def _peer(self) -> str:
        peer = self.peername
        return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown peer"

    # ---------------------------------------------------------- aiohttp's own logging

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        """aiohttp's answer to a request it could not parse (400) or a failed handler (500);
        a client's malformed request is one counted line, not a traceback."""
        if status >= 500 or not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        # Only the kind: the request line (a citation link's token) is not repeated.
        self._guard.faults.report(Fault.MALFORMED, f"{type(exc).__name__} from {self._peer()}")
        request[REPORTED] = True
        own, self.logger = self.logger, _SILENT
        try:
            return super().handle_error(request, status, exc, message)
        finally:
            self.logger = own

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """A client's fault aiohttp meets outside a handler (a body that ends badly while the
        rest of it is read and dropped) is one counted line; anything else keeps its traceback."""
        exc = kw.get("exc_info")
        # (A malformed request comes here from handle_error, which reported it already
        # and silenced the logger.)
        if isinstance(exc, ConnectionError) or self.dropped:
            self._guard.faults.report(Fault.GONE, type(exc).__name__)
            return
        super().log_exception(*args, **kw)


class GuardedServer(web.Server):
    """aiohttp's low-level server making ``GuardedHandler``s, told when each request starts."""

    def __init__(
        self,
        handler: Callable[[BaseRequest], Awaitable[StreamResponse]],
        *,
        guard: ConnectionGuard,
        request_factory: Any,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, request_factory=request_factory, **kwargs)
        self.guard = guard
        self._handler_kwargs = kwargs
        self._handler_loop = asyncio.get_running_loop()
        made = self.request_factory

        def started(
            message: RawRequestMessage,
            payload: StreamReader,
            protocol: web_protocol.RequestHandler,
            writer: AbstractStreamWriter,
            task: asyncio.Task[None],
        ) -> BaseRequest:
            if isinstance(protocol, GuardedHandler):
                protocol.request_started(payload)
            return made(message, payload, protocol, writer, task)

        self.request_factory = started

    def __call__(self) -> GuardedHandler:
        """A handler for one new connection (the protocol factory ``create_server`` calls)."""
        return GuardedHandler(self, loop=self._handler_loop, **self._handler_kwargs)


class GuardedRunner(web.AppRunner):
    """``web.AppRunner`` whose connections are ``GuardedHandler``s under ``limits``.

    Args:
        app: the application.
        limits: the bounds; aiohttp's own (keep-alive, line and header sizes,
            lingering) are passed to every connection.
        faults: where clients' faults are logged.
        open_files: the process's (soft) open-file limit, which may lower the
            cap (``bot.server.limits.connection_cap``).
        access_log_class: the access log.

    Attributes:
        guard: the connections, and the cap they are held to (``guard.cap``).
    """

    def __init__(
        self,
        app: web.Application,
        *,
        limits: HttpLimits,
        faults: ClientFaults,
        open_files: int,
        access_log_class: type[AbstractAccessLogger] = AccessLogger,
        **kwargs: Any,
    ) -> None:
        handler_args: dict[str, Any] = {**limits.handler_args(), **kwargs}
        super().__init__(app, access_log_class=access_log_class, **handler_args)
        self.guard = ConnectionGuard(limits, connection_cap(limits, open_files), faults)
        self._handler_args = {**handler_args, "access_log_class": access_log_class}

    async def _make_server(self) -> web.Server:
        # aiohttp's AppRunner starts the application and makes its server; the same
        # server is made again here with the guarded handler (nothing else differs).
        made = await super()._make_server()
        return GuardedServer(
            made.request_handler,
            guard=self.guard,
            request_factory=made.request_factory,
            **self._handler_args,
        )


def raise_open_file_limit() -> tuple[int, int]:
    """Raise this process's soft open-file limit to its hard limit; both, as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def accept_failures(
    faults: ClientFaults,
) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """The event loop's exception handler: accept() out of resources is one counted line."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCES:
            faults.report(
                Fault.ACCEPT_FAILED, f"{os.strerror(exc.errno or 0)}; retried in a second"
            )
            return
        loop.default_exception_handler(context)

    return handle


async def serve(
    app: web.Application,
    *,
    limits: HttpLimits,
    faults: ClientFaults,
    port: int,
    host: str | None = None,
    access_log_class: type[AbstractAccessLogger] | None = None,
) -> None:
    """Serve ``app`` until SIGINT or SIGTERM, every connection held to ``limits``.

    Args:
        app: the application.
        limits: the bounds.
        faults: where clients' faults are logged.
        port: the TCP port.
        host: the address to listen on; every address by default.
        access_log_class: the access log.
    """
    loop = asyncio.get_running_loop()
    soft, hard = raise_open_file_limit()
    kwargs: dict[str, Any] = (
        {} if access_log_class is None else {"access_log_class": access_log_class}
    )
    runner = GuardedRunner(app, limits=limits, faults=faults, open_files=soft, **kwargs)
    cap = runner.guard.cap
    log.info(
        "open files: soft limit %d, hard limit %d; at most %d connections at once%s",
        soft,
        hard,
        cap,
        ""
        if cap == limits.max_connections
        else f" (KB_HTTP_MAX_CONNECTIONS={limits.max_connections} lowered to keep descriptors "
        "for the server's own files; raise the hard open-file limit to serve more)",
    )
    loop.set_exception_handler(accept_failures(faults))
    await runner.setup()
    stop = asyncio.Event()
    try:
        await web.TCPSite(runner, host, port, backlog=BACKLOG).start()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await runner.cleanup()
        faults.close()
