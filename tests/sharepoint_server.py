"""A local Microsoft Graph v1.0 and Microsoft identity platform, as their documentation describes them.

One HTTPS server (a certificate made for 127.0.0.1 at start, its CA in
:attr:`MockSharePoint.ca_file`; ``msal`` speaks only https to an authority)
serves both:

* sign-in: ``/{tenant}/v2.0/.well-known/openid-configuration`` and the
  client-credentials grant at ``/{tenant}/oauth2/v2.0/token``: the app's
  client id and secret, and scope ``<graph origin>/.default``; a wrong or
  revoked secret is HTTP 401 ``invalid_client`` (``AADSTS7000215``);
* Graph (``/v1.0``): a site and its default drive; the drive's delta
  (``/drives/{id}/root/delta``): the first call enumerates every item (the root,
  folders, files) page after page with ``@odata.nextLink``, the last page
  carrying ``@odata.deltaLink``; a delta link gives the items changed since,
  deleted ones with a ``deleted`` facet, moved ones with their new
  ``parentReference``; an expired delta link is HTTP 410 ``resyncRequired``;
  ``/items/{id}/content`` is a 302 to a pre-authorised download address;
  a file the test names in :attr:`MockSharePoint.trickle` is sent from there a
  byte at a time, that many seconds apart (a server that trickles);
  ``/items/{id}/permissions`` lists the item's own permissions and those
  inherited from its folders (``inheritedFrom``); ``/groups/{id}/transitiveMembers``
  lists a group's members, nested groups' included;
* a bearer token that was not issued, or was expired by the test, is HTTP 401
  ``InvalidAuthenticationToken``; faults the test queues (429 with
  ``Retry-After``, 5xx, garbage) answer the next requests to a path.

Every request is recorded (method, path, query, whether it carried a token) in
:attr:`MockSharePoint.calls`.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import itertools
import json
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.servers import DEFAULT_SHAREPOINT_CLIENT_SECRET, SHUTDOWN_POLL_S

# Marks an answer sent a byte at a time, its value the seconds between two
# (``MockSharePoint.trickle``); never sent itself.
_TRICKLE = "X-Mock-Trickle"

TENANT = "contoso.onmicrosoft.com"
CLIENT_ID = "6731de76-14a6-49ae-97bc-6eba6914391e"
SITE_HOST = "contoso.sharepoint.com"
SITE_PATH = "/sites/Eng"
SITE_ID = "contoso.sharepoint.com,2c4f3f3e-1b1a-4a4f-9d0e-0f6c2a1b3c4d,7e8f9a0b-1c2d-4e3f-8a9b-0c1d2e3f4a5b"
DRIVE_ID = "b!Ey9vXyz0ENGlibrary"


@dataclass
class Item:
    """One drive item: the root, a folder or a file."""

    id: str
    name: str
    data: bytes = b""
    parent: str | None = "root"
    folder: bool = False
    # Graph permission objects as the item's own (its folders' are inherited).
    grants: list[dict[str, Any]] = field(default_factory=list)
    version: int = 1
    changed: int = 0
    size: int | None = None  # what Graph says its size is, when not len(data)
    web_url: str | None = None  # its webUrl, when not the library's usual address


@dataclass
class Fault:
    """An answer queued for the next requests whose path contains ``path``."""

    path: str
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b'{"error": {"code": "serviceNotAvailable", "message": "Service unavailable"}}'
    times: int = 1


def user(email: str, *, roles: tuple[str, ...] = ("read",), expires: str = "") -> dict[str, Any]:
    """A permission granted to one person; ``expires``: its ``expirationDateTime``."""
    who = {"id": f"id-{email.split('@')[0]}", "displayName": email.split("@")[0], "email": email}
    row: dict[str, Any] = {"roles": list(roles), "grantedToV2": {"user": who}}
    if expires:
        row["expirationDateTime"] = expires
    return row


def group(group_id: str, name: str) -> dict[str, Any]:
    """A permission granted to a Microsoft 365 / security group."""
    return {"roles": ["read"], "grantedToV2": {"group": {"id": group_id, "displayName": name}}}


def site_group(name: str) -> dict[str, Any]:
    """A permission granted to a SharePoint site group (Graph does not list its members)."""
    return {
        "roles": ["read"],
        "grantedToV2": {"siteGroup": {"id": "5", "displayName": name, "loginName": name}},
    }


def link(scope: str, *emails: str, kind: str = "view", expires: str = "") -> dict[str, Any]:
    """A sharing link of ``scope`` (``organization``, ``anonymous``, ``users``...) and type
    ``kind`` (``view``, ``edit``, ``createOnly``...); ``expires``: its ``expirationDateTime``."""
    roles = {"view": ["read"], "edit": ["write"]}.get(kind, ["write"])
    row: dict[str, Any] = {
        "roles": roles,
        "link": {"scope": scope, "type": kind, "webUrl": "https://1drv.ms/x"},
    }
    if expires:
        row["expirationDateTime"] = expires
    if emails:
        row["grantedToIdentitiesV2"] = [{"user": {"email": e, "displayName": e}} for e in emails]
    return row


class MockSharePoint:
    """The server's state; :meth:`serve` runs it."""

    def __init__(self) -> None:
        self.items: dict[str, Item] = {"root": Item("root", "root", parent=None, folder=True)}
        self.tombstones: dict[str, int] = {}  # deleted item id: the change that deleted it
        self.groups: dict[str, list[dict[str, Any]]] = {}
        self.secret = DEFAULT_SHAREPOINT_CLIENT_SECRET
        self.tokens: set[str] = set()
        self.issued = 0
        self.faults: list[Fault] = []
        self.calls: list[tuple[str, str, dict[str, str], bool]] = []
        self.page_cap = 2
        self.sequence = 0
        self.oldest_delta = 0  # delta links older than this change are expired (410)
        self.list_twice: str | None = None  # an item the delta lists twice
        self.redirect_to: str | None = None  # where content redirects, when not the mock
        self.trickle: dict[str, float] = {}  # item id -> seconds between two bytes of it
        self.unreadable: set[str] = set()  # items whose permissions answer 403
        self.base = ""
        self.ca_file = ""
        self._lock = threading.Lock()
        self._counter = itertools.count(1)

    # ------------------------------------------------------------ the test's side

    def add(self, item: Item) -> Item:
        """Add or replace ``item``, as a change."""
        item.changed = self._change()
        self.items[item.id] = item
        return item

    def edit(self, item_id: str, data: bytes, *, name: str | None = None) -> None:
        """A new version of a file's content (and name)."""
        item = self.items[item_id]
        item.data, item.name = data, name or item.name
        item.version += 1
        item.changed = self._change()

    def move(self, item_id: str, parent: str) -> None:
        """Move an item to another folder."""
        self.items[item_id].parent = parent
        self.items[item_id].changed = self._change()

    def delete(self, item_id: str) -> None:
        """Delete an item (the delta shows it with a ``deleted`` facet)."""
        del self.items[item_id]
        self.tombstones[item_id] = self._change()

    def fail(
        self, path: str, status: int, *, retry_after: str | None = None, times: int = 1
    ) -> None:
        """Answer the next ``times`` requests to ``path`` with ``status``."""
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        body = json.dumps({"error": {"code": "failure", "message": "failure"}}).encode()
        self.faults.append(Fault(path, status, headers, body, times))

    def expire_tokens(self) -> None:
        """Every access token issued so far expires."""
        self.tokens.clear()

    def calls_to(self, fragment: str) -> list[tuple[str, str, dict[str, str], bool]]:
        """The calls whose path holds ``fragment``."""
        return [c for c in self.calls if fragment in c[1]]

    @property
    def graph(self) -> str:
        """Graph's base URL on this server."""
        return f"{self.base}/v1.0"

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on https://127.0.0.1; yields the base URL (``https://127.0.0.1:port``)."""
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                mock._answer(self, "GET")

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                mock._answer(self, "POST")

            def log_message(self, *args: Any) -> None:
                pass

        with tempfile.TemporaryDirectory() as directory:
            context = _tls_context(Path(directory))
            self.ca_file = str(Path(directory) / "ca.pem")
            server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            server.socket = context.wrap_socket(server.socket, server_side=True)
            server.daemon_threads = True
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, daemon=True
            )
            thread.start()
            try:
                self.base = f"https://127.0.0.1:{server.server_address[1]}"
                yield self.base
            finally:
                server.shutdown()
                server.server_close()

    # ------------------------------------------------------------ answers

    def _change(self) -> int:
        self.sequence += 1
        return self.sequence

    def _answer(self, request: BaseHTTPRequestHandler, method: str) -> None:
        split = urlsplit(request.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        signed = bool(request.headers.get("Authorization"))
        with self._lock:
            self.calls.append((method, split.path, query, signed))
            status, headers, payload = self._route(request, method, split.path, query, body)
        paced = headers.pop(_TRICKLE, None)
        pause = float(paced) if paced is not None else None
        request.send_response(status)
        request.send_header("Content-Type", headers.pop("Content-Type", "application/json"))
        for name, value in headers.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        if pause is None:
            request.wfile.write(payload)
            return
        try:
            for byte in range(len(payload)):
                request.wfile.write(payload[byte : byte + 1])
                request.wfile.flush()
                time.sleep(pause)  # the hostile server's pace, not the test's clock
        except OSError:
            request.close_connection = True  # the client stopped reading: what it should do

    def _route(
        self,
        request: BaseHTTPRequestHandler,
        method: str,
        path: str,
        query: dict[str, str],
        body: bytes,
    ) -> tuple[int, dict[str, str], bytes]:
        for fault in self.faults:
            if fault.path in path and fault.times > 0:
                fault.times -= 1
                return fault.status, dict(fault.headers), fault.body
        if path.endswith("/v2.0/.well-known/openid-configuration"):
            tenant = path.split("/")[1]
            if tenant != TENANT:
                message = f"AADSTS90002: Tenant '{tenant}' not found."
                return _json(400, {"error": "invalid_tenant", "error_description": message})
            return _json(200, self._openid(tenant))
        if path.endswith("/oauth2/v2.0/token") and method == "POST":
            return self._token(body)
        if path.startswith("/download/"):
            return self._download(unquote(path.removeprefix("/download/")), query)
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or header[7:] not in self.tokens:
            return _error(401, "InvalidAuthenticationToken", "Access token has expired.")
        return self._graph(unquote(path.removeprefix("/v1.0/")), query)

    def _openid(self, tenant: str) -> dict[str, Any]:
        issuer = f"{self.base}/{tenant}/v2.0"
        return {
            "issuer": issuer,
            "authorization_endpoint": f"{self.base}/{tenant}/oauth2/v2.0/authorize",
            "token_endpoint": f"{self.base}/{tenant}/oauth2/v2.0/token",
            "jwks_uri": f"{self.base}/{tenant}/discovery/v2.0/keys",
        }

    def _token(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        form = {k: v[-1] for k, v in parse_qs(body.decode()).items()}
        if form.get("grant_type") != "client_credentials":
            return _json(400, {"error": "unsupported_grant_type"})
        if form.get("client_id") != CLIENT_ID or form.get("client_secret") != self.secret:
            return _json(
                401,
                {
                    "error": "invalid_client",
                    "error_description": "AADSTS7000215: Invalid client secret provided. "
                    "Trace ID: 0000 Correlation ID: 0000",
                    "error_codes": [7000215],
                },
            )
        if form.get("scope") != f"{self.base}/.default":
            return _json(400, {"error": "invalid_scope", "error_description": "AADSTS70011"})
        self.issued += 1
        token = f"graph-access-{self.issued}"
        self.tokens.add(token)
        return _json(200, {"token_type": "Bearer", "expires_in": 3599, "access_token": token})

    def _graph(self, path: str, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if path == f"sites/{SITE_HOST}:{SITE_PATH}":
            return _json(200, {"id": SITE_ID, "webUrl": f"https://{SITE_HOST}{SITE_PATH}"})
        if path == f"sites/{SITE_ID}/drive":
            return _json(200, {"id": DRIVE_ID, "driveType": "documentLibrary"})
        if path.startswith("groups/") and path.endswith("/transitiveMembers"):
            return self._members(path.split("/")[1], query)
        drive = f"drives/{DRIVE_ID}/"
        if not path.startswith(drive):
            return _error(404, "itemNotFound", f"No resource at {path}")
        parts = path.removeprefix(drive).split("/")
        if parts == ["root", "delta"]:
            return self._delta(query)
        if len(parts) == 3 and parts[0] == "items" and parts[2] == "content":
            return self._content(parts[1])
        if len(parts) == 3 and parts[0] == "items" and parts[2] == "permissions":
            return self._permissions(parts[1], query)
        return _error(404, "itemNotFound", "The resource could not be found.")

    def _delta(self, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        # token "s<seq>": changes after change seq; "s<seq>.<offset>": a next page of those.
        token = query.get("token", "s0")
        since_text, _, offset_text = token.removeprefix("s").partition(".")
        if not token.startswith("s") or not since_text.isdigit():
            return _error(400, "invalidRequest", "Invalid delta token.")
        since = int(since_text)
        if "token" in query and since < self.oldest_delta and not offset_text:
            return _error(410, "resyncRequired", "Resync required: the delta token expired.")
        entries = self._changes(since)
        offset = int(offset_text or 0)
        chunk = entries[offset : offset + self.page_cap]
        select = {k: v for k, v in query.items() if k == "$select"}
        base = f"{self.graph}/drives/{DRIVE_ID}/root/delta?"
        answer: dict[str, Any] = {"value": chunk}
        if offset + self.page_cap < len(entries):
            following = {**select, "token": f"s{since}.{offset + self.page_cap}"}
            answer["@odata.nextLink"] = base + urlencode(following)
        else:
            answer["@odata.deltaLink"] = base + urlencode({"token": f"s{self.sequence}"})
        return _json(200, answer)

    def _changes(self, since: int) -> list[dict[str, Any]]:
        items = [i for i in self.items.values() if i.changed > since or since == 0]
        items.sort(key=lambda i: (i.id != "root", i.changed))
        entries = [self._entry(i) for i in items]
        if since:
            entries += [
                {"id": i, "deleted": {"state": "deleted"}, "parentReference": {"driveId": DRIVE_ID}}
                for i, seq in self.tombstones.items()
                if seq > since
            ]
        if self.list_twice is not None and self.list_twice in self.items:
            entries.append(self._entry(self.items[self.list_twice]))
        return entries

    def _entry(self, item: Item) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "id": item.id,
            "name": item.name,
            "eTag": f'"{{{item.id}}},{item.version}"',
            "cTag": f'"c:{{{item.id}}},{item.version}"',
            "size": item.size if item.size is not None else len(item.data),
            "webUrl": item.web_url
            or f"https://{SITE_HOST}{SITE_PATH}/Shared%20Documents/{quote(item.name)}",
            "parentReference": {"driveId": DRIVE_ID, "id": item.parent},
        }
        if item.id == "root":
            entry["root"] = {}
            del entry["parentReference"]
        if item.folder:
            entry["folder"] = {"childCount": 0}
        else:
            entry["file"] = {"mimeType": "application/octet-stream"}
        return entry

    def _content(self, item_id: str) -> tuple[int, dict[str, str], bytes]:
        item = self.items.get(item_id)
        if item is None or item.folder:
            return _error(404, "itemNotFound", "The resource could not be found.")
        where = self.redirect_to or f"{self.base}/download/{quote(item_id)}?tempauth=ey.{item_id}"
        return 302, {"Location": where}, b""

    def _download(self, item_id: str, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        item = self.items.get(item_id)
        if item is None or query.get("tempauth") != f"ey.{item_id}":
            return 401, {}, b"expired"
        headers = {"Content-Type": "application/octet-stream"}
        if item_id in self.trickle:
            headers[_TRICKLE] = str(self.trickle[item_id])
        return 200, headers, item.data

    def _permissions(
        self, item_id: str, query: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        item = self.items.get(item_id)
        if item is None:
            return _error(404, "itemNotFound", "The resource could not be found.")
        if item_id in self.unreadable:
            return _error(403, "accessDenied", "Access denied")
        rows = [{"id": f"own-{n}", **g} for n, g in enumerate(item.grants)]
        parent = self.items.get(item.parent or "")
        while parent is not None:
            rows += [
                {"id": f"{parent.id}-{n}", **g, "inheritedFrom": {"id": parent.id}}
                for n, g in enumerate(parent.grants)
            ]
            parent = self.items.get(parent.parent or "")
        return _json(
            200, self._paged(rows, query, f"drives/{DRIVE_ID}/items/{item_id}/permissions")
        )

    def _members(self, group_id: str, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if group_id not in self.groups:
            return _error(404, "Request_ResourceNotFound", f"Resource '{group_id}' does not exist.")
        return _json(
            200, self._paged(self.groups[group_id], query, f"groups/{group_id}/transitiveMembers")
        )

    def _paged(self, rows: list[Any], query: dict[str, str], path: str) -> dict[str, Any]:
        skip = int(query.get("$skiptoken", "0"))
        answer: dict[str, Any] = {"value": rows[skip : skip + self.page_cap]}
        if skip + self.page_cap < len(rows):
            following = urlencode({"$skiptoken": str(skip + self.page_cap)})
            answer["@odata.nextLink"] = f"{self.graph}/{path}?{following}"
        return answer


def member(email: str, *, mail: bool = True) -> dict[str, Any]:
    """A user in a group's transitive members (``mail`` false: only a userPrincipalName)."""
    row = {"@odata.type": "#microsoft.graph.user", "id": f"id-{email.split('@')[0]}"}
    row["userPrincipalName"] = email
    if mail:
        row["mail"] = email
    return row


def _json(status: int, data: Any) -> tuple[int, dict[str, str], bytes]:
    return status, {}, json.dumps(data).encode()


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    return _json(status, {"error": {"code": code, "message": message}})


def _tls_context(directory: Path) -> ssl.SSLContext:
    """A server context with a self-signed certificate for 127.0.0.1; its PEM is ``ca.pem``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (directory / "ca.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "ca.pem", directory / "key.pem")
    return context
