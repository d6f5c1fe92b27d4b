"""What one HTTP client may hold of the server: time to send a request, bytes, connections.

Anyone who can reach the port is a client before anything proves who they are,
so each of these is bounded before a request is read: the time a request's head
and body may take to arrive, the size of its lines, headers and body, how long
an idle connection is kept, and how many connections are open at once (a share
of the process's open-file limit, so that the server never runs out of
descriptors for its own files). Built from the settings
(``bot.settings.Settings.http_limits``); tests build it directly with small values.
``bot.server.connections`` holds connections to these, ``bot.server.bodies`` bodies.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_KEEPALIVE_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "RESERVED_DESCRIPTORS",
    "HttpLimits",
    "connection_cap",
]

# A request's head is a few hundred bytes: a client that has not sent it whole in
# this long is not going to, or holds the connection on purpose (slowloris).
DEFAULT_HEADER_TIMEOUT = 10.0
# The largest body a route takes is 1 MiB (Slack's interactivity payloads): seconds
# even on a slow link. Slack itself gives up on a request after 3 s.
DEFAULT_BODY_TIMEOUT = 10.0
# Longer than the idle timeout of the proxies put in front of servers (60 s for
# nginx's upstream keep-alive and AWS's load balancers), so that a proxy never
# sends a request on a connection this server is closing at that moment.
DEFAULT_KEEPALIVE_TIMEOUT = 75.0
DEFAULT_MAX_CONNECTIONS = 1000
# Descriptors kept for the process's own work whatever the clients do: the
# database and index files, the model, the connections to Slack and the model
# endpoint, the readers' pipes, and the connections accepted in one burst before
# the cap can close them (up to the listen backlog, 128).
RESERVED_DESCRIPTORS = 384
# aiohttp's own limits on a request's head, set explicitly: 8190 bytes for the
# request line (a citation link with its token is a few hundred) and for one
# header (a browser's Cookie line included), at most 64 headers (browsers send
# about 15, a chain of proxies adds a dozen). A head past them gets 400.
MAX_LINE_BYTES = 8190
MAX_FIELD_BYTES = 8190
MAX_HEADERS = 64
# A client whose body did not all arrive before the answer may still be sending;
# after an answer that did not read the body, the rest is read and dropped this
# long at most (so the client reads the answer rather than a reset), then the
# connection is closed.
LINGER_SECONDS = 2.0
# Connections past the cap that may still send a health check (/healthz,
# /readyz), when every connection under the cap is busy with a request.
HEALTH_HEADROOM = 8
# Retry-After of the 503 a connection past the cap gets.
RETRY_AFTER_SECONDS = 5


@dataclass(frozen=True)
class HttpLimits:
    """The bounds every client of the web server is held to.

    Attributes:
        header_timeout: seconds from a connection's opening (or from the first
            byte of a later request on it) until the request's head is complete;
            then it is answered 408 and closed (closed without a word if it
            sent nothing).
        body_timeout: seconds from a request's head until its whole body has
            arrived; then it is answered 408 and closed.
        keepalive_timeout: seconds an idle connection is kept between two requests.
        max_connections: connections open at once, at most; the process's
            open-file limit may lower it (``connection_cap``).
        health_headroom: connections past the cap that may still send a health
            check while every connection under it is busy.
        max_line_bytes: longest request line.
        max_field_bytes: longest header.
        max_headers: most headers in one request.
        linger_seconds: how long the rest of a body nobody read is read and dropped.
        retry_after: the ``Retry-After`` of the 503 past the cap, in seconds.
    """

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    health_headroom: int = HEALTH_HEADROOM
    max_line_bytes: int = MAX_LINE_BYTES
    max_field_bytes: int = MAX_FIELD_BYTES
    max_headers: int = MAX_HEADERS
    linger_seconds: float = LINGER_SECONDS
    retry_after: int = RETRY_AFTER_SECONDS

    def handler_args(self) -> dict[str, float | int]:
        """aiohttp's own settings for each connection (``RequestHandler``'s arguments)."""
        return {
            "keepalive_timeout": self.keepalive_timeout,
            "max_line_size": self.max_line_bytes,
            "max_field_size": self.max_field_bytes,
            "max_headers": self.max_headers,
            "lingering_time": self.linger_seconds,
        }


def connection_cap(limits: HttpLimits, open_files: int) -> int:
    """The connections the server keeps open at once, given the process's open-file limit.

    ``limits.max_connections``, lowered when the limit would not leave
    ``RESERVED_DESCRIPTORS`` for the process's own files (and the health
    headroom): a server whose every descriptor is a client's cannot open its
    database, and ``accept()`` fails in a loop. Half the limit at least, for a
    limit too small to keep the whole reserve.
    """
    for_clients = max(open_files - RESERVED_DESCRIPTORS, open_files // 2) - limits.health_headroom
    return max(1, min(limits.max_connections, for_clients))
