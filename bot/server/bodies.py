"""Request bodies: the size each route takes, checked before reading, and the time a body may take.

One middleware, in front of every route (the viewer, ``/slack/events``,
``/mcp``, sign-in, health), so that no handler can forget it:

* a body announced (``Content-Length``) over the route's size is answered 413
  before a byte of it is read; one sent without a length (chunked, or
  compressed and inflating) is read no further than that size (the request the
  handler gets carries it as aiohttp's ``client_max_size``);
* the body must have arrived whole ``body_timeout`` after the request's head,
  however the handler reads it and whenever it starts to: past that, the read
  fails, the client gets 408 and the connection is closed (no lingering). A
  handler that refuses a request before reading its body (an MCP call without a
  valid token) answers at once all the same;
* a connection admitted past the cap only for health checks
  (``bot.server.connections``) gets 503 for anything else;
* a client that went away is one counted log line, never a traceback.

A route takes ``DEFAULT_MAX_BODY`` unless it says otherwise with
``limit_body`` (Slack's events 1 MiB, MCP 64 KiB), and may shape the refusals
its clients read (MCP answers JSON-RPC errors). ``setup`` puts the limits and
the fault log in the app.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestPayloadError

from bot.server.connections import BUSY, REPORTED, GuardedHandler
from bot.server.faults import ClientFaults, Fault
from bot.server.limits import HttpLimits

__all__ = [
    "DEFAULT_MAX_BODY",
    "FAULTS",
    "HEALTH_PATHS",
    "LIMITS",
    "BodyTimeout",
    "Refusal",
    "limit_body",
    "middleware",
    "setup",
]

# Forms and small JSON: a route that takes more says so (limit_body).
DEFAULT_MAX_BODY = 64 * 1024
# What a connection admitted past the cap for health checks may ask.
HEALTH_PATHS = frozenset({"/healthz", "/readyz"})

LIMITS = web.AppKey("http_limits", HttpLimits)
FAULTS = web.AppKey("client_faults", ClientFaults)

Refusal = Callable[[int, str, Mapping[str, str]], web.Response]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BodyTimeout(TimeoutError):
    """A request's body did not arrive whole in time.

    A ``TimeoutError``: should aiohttp meet it while it reads and drops the rest
    of a body nobody read, it stops there quietly.
    """


def json_refusal(status: int, message: str, headers: Mapping[str, str]) -> web.Response:
    """The default shape of a refusal: ``{"error": message}``."""
    return web.json_response({"error": message}, status=status, headers=dict(headers))


@dataclass(frozen=True)
class _Door:
    max_bytes: int
    refuse: Refusal


_DOORS: web.AppKey[dict[str, _Door]] = web.AppKey("body_doors")
_DEFAULT = _Door(DEFAULT_MAX_BODY, json_refusal)


def setup(app: web.Application, limits: HttpLimits, faults: ClientFaults | None = None) -> None:
    """Hold ``app``'s requests to ``limits``, their faults logged to ``faults`` (a new log)."""
    app[LIMITS] = limits
    app[FAULTS] = faults or ClientFaults()


def limit_body(
    app: web.Application, path: str, max_bytes: int, refuse: Refusal = json_refusal
) -> None:
    """Let the route at ``path`` take bodies up to ``max_bytes``, refusals shaped by ``refuse``."""
    app.setdefault(_DOORS, {})[path] = _Door(max_bytes, refuse)


def _door(request: web.Request) -> _Door:
    resource = request.match_info.route.resource
    doors = request.app.get(_DOORS, {})
    return doors.get(resource.canonical, _DEFAULT) if resource is not None else _DEFAULT


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Check the body's size before reading, bound its time, and answer clients' faults."""
    limits = request.app.get(LIMITS) or HttpLimits()
    faults = request.app.get(FAULTS) or ClientFaults()
    door = _door(request)
    protocol = request.protocol
    if isinstance(protocol, GuardedHandler) and protocol.headroom and not _health(request):
        faults.report(Fault.REFUSED, f"{request.method} {request.path}")
        request[REPORTED] = True
        refusal = door.refuse(
            503,
            BUSY,
            {"Retry-After": str(limits.retry_after)},
        )
        refusal.force_close()
        return refusal
    length = request.content_length
    if length is not None and length > door.max_bytes:
        return _too_large(request, door, faults)
    timer = None
    if not request.content.is_eof():
        timer = asyncio.get_running_loop().call_later(
            limits.body_timeout, _late, request.content, limits.body_timeout
        )
    try:
        return await handler(request.clone(client_max_size=door.max_bytes))
    except BodyTimeout as exc:
        return await _timed_out(request, door, faults, str(exc))
    except web.HTTPRequestEntityTooLarge:
        return _too_large(request, door, faults)
    except RequestPayloadError as exc:
        # A chunked or compressed body that does not decode: the client's fault.
        faults.report(Fault.MALFORMED, f"{type(exc).__name__}: {exc}")
        request[REPORTED] = True
        return door.refuse(400, "The request body could not be read: it is malformed.", {})
    except Exception:
        # Whatever reading a closed connection raises (ConnectionResetError, or
        # RuntimeError when it closed before the read began); with the connection
        # still open, the failure is the server's own and keeps its traceback.
        if request.transport is not None and not request.transport.is_closing():
            raise
        if not (isinstance(protocol, GuardedHandler) and protocol.dropped):
            faults.report(Fault.GONE, f"{request.method} {request.path}")
        request[REPORTED] = True
        # Nobody will read it: the connection is gone.
        return web.Response(status=400)
    finally:
        if timer is not None:
            timer.cancel()


def _health(request: web.Request) -> bool:
    return request.method in ("GET", "HEAD") and request.path in HEALTH_PATHS


def _late(body: StreamReader, seconds: float) -> None:
    if not body.is_eof():
        body.set_exception(BodyTimeout(f"The request body did not arrive within {seconds:g} s."))


def _too_large(request: web.Request, door: _Door, faults: ClientFaults) -> web.Response:
    faults.report(Fault.TOO_LARGE, f"{request.method} {request.path} over {_size(door.max_bytes)}")
    request[REPORTED] = True
    return door.refuse(413, f"The request is over {_size(door.max_bytes)}: send a smaller one.", {})


async def _timed_out(
    request: web.Request, door: _Door, faults: ClientFaults, message: str
) -> web.StreamResponse:
    """Answer 408, then close the connection at once: the client has had its time."""
    faults.report(Fault.BODY_TIMEOUT, f"{request.method} {request.path}")
    request[REPORTED] = True
    response = door.refuse(408, message, {})
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n // 1024} KiB"
