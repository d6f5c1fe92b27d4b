"""A local Google Drive API v3, Admin SDK Directory API and OAuth token endpoint, as documented.

Files in shared drives or folders, their permissions (a shared drive's members
inherited by every file in it), the changes log, and groups with members.
What it follows of Google's documented behaviour:

* tokens: a service account posts a JWT signed with its private key to the
  key file's ``token_uri`` (RFC 7523); the signature, issuer, audience and
  scopes are checked, and an access token good for an hour comes back. A key
  the test revoked is ``400 invalid_grant``; a revoked access token is ``401``
  on every API call (the client then asks for a new one);
* scopes: Drive answers only tokens with ``drive.readonly``, the Directory API
  only tokens with ``admin.directory.group.member.readonly`` (else ``403
  insufficientPermissions``);
* ``files.list``: ``q`` (``'ID' in parents``, ``trashed = false``),
  ``corpora=drive`` + ``driveId`` (which need ``includeItemsFromAllDrives`` and
  ``supportsAllDrives``), ``pageSize`` capped by :attr:`MockDrive.page_cap`,
  opaque ``pageToken``/``nextPageToken``;
* a file in a shared drive is ``404`` to ``files.get`` or ``permissions.list``
  without ``supportsAllDrives=true``; ``files.get`` ``alt=media`` of a Google
  Doc is ``403 fileNotDownloadable``; ``files.export`` of anything else is
  ``403 fileNotExportable``, to a type Google does not export to ``400``;
* ``files.get`` ``alt=media`` honours a ``Range`` of bytes (``bytes=a-b``,
  ``bytes=a-``) as Drive does: ``206`` with ``Content-Range``, ``416`` past the
  end; the bytes of content sent are counted (:attr:`MockDrive.served`), and a
  file the test names in :attr:`MockDrive.trickle` is sent one byte at a time,
  each moving the test's clock on (a server that trickles, on the test's time);
* ``changes.getStartPageToken`` and ``changes.list``: every change the test
  makes is one entry of a log; a page token is a position in it; the last
  page gives ``newStartPageToken``; a deleted file's change is ``removed``; a
  change of a file's sharing (its permissions, however the test changed them)
  is a change of the file, its ``version`` one higher; a change of the shared
  drive's members is not a change of each file in it;
* ``permissions.list`` gives only the fields ``fields`` names (a partial
  response), ``allowFileDiscovery`` for ``domain`` and ``anyone`` permissions,
  ``expirationTime`` for a user or group one that has it, ``view`` for one of a
  view, and ``inheritedPermissionsDisabled`` (true on every permission of a file
  whose inherited ones are disabled: a folder with limited access);
* ``drives.get`` of the shared drive: its ``restrictions`` (``driveMembersOnly``:
  only its members reach its files, whatever else a file is shared with);
* ``permissions.list`` of the shared drive itself (its id as ``fileId``, with
  ``supportsAllDrives=true``): its members;
* ``members.list`` with ``includeDerivedMembership`` (nested groups' members
  too), ``maxResults``, ``pageToken``;
* faults queued by the test: any status (429 with ``Retry-After``, 500s, 403
  ``rateLimitExceeded``), a body that is not JSON, or a connection dropped
  halfway through its answer (:data:`DROP`).

Every API request is recorded (method, path, query) in :attr:`MockDrive.calls`.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.clocks import Waits, send_answer
from tests.servers import DEFAULT_GDRIVE_TOKEN, threaded_http_server

ACCOUNT = "kb-sync@example-project.iam.gserviceaccount.com"
DRIVE = "0AEngDrive000Uk9PVA"
DRIVE_SCOPE = "https://www.googleapis.com/auth/drive.readonly"
GROUPS_SCOPE = "https://www.googleapis.com/auth/admin.directory.group.member.readonly"
DOC = "application/vnd.google-apps.document"
SHEET = "application/vnd.google-apps.spreadsheet"
SLIDES = "application/vnd.google-apps.presentation"
FOLDER = "application/vnd.google-apps.folder"
_EXPORTS = {
    DOC: {"text/html", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"},
    SHEET: {"application/vnd.openxmlformats-officedocument.spreadsheetml.sheet", "text/csv"},
    SLIDES: {"application/vnd.openxmlformats-officedocument.presentationml.presentation"},
}


# A fault's status that drops the connection halfway through a 200 instead of answering.
DROP = 0


@functools.cache
def _private_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class Permission:
    """One permission of a file (``type`` user, group, domain or anyone).

    ``discoverable``: ``allowFileDiscovery``, which Drive gives for ``domain`` and
    ``anyone`` only (false: found through its link alone); ``expires``: its
    ``expirationTime`` (RFC 3339), set on user and group permissions only;
    ``view``: the view it belongs to (``published``: a published reader).
    """

    type: str
    role: str = "reader"
    email: str = ""
    domain: str = ""
    deleted: bool = False
    discoverable: bool = True
    expires: str = ""
    view: str = ""

    def as_json(self, index: int, inherited: bool, limited: bool = False) -> dict[str, Any]:
        """As ``permissions.list`` gives it; ``limited``: its file has inherited permissions
        disabled (in a folder with limited access), which every permission of it says."""
        row: dict[str, Any] = {"kind": "drive#permission", "id": f"p{index}", "type": self.type}
        row["role"] = self.role
        if self.email:
            row["emailAddress"] = self.email
        if self.domain:
            row["domain"] = self.domain
        if self.deleted:
            row["deleted"] = True
        if self.type in ("domain", "anyone"):
            row["allowFileDiscovery"] = self.discoverable
        if self.expires and self.type in ("user", "group"):
            row["expirationTime"] = self.expires
        if self.view:
            row["view"] = self.view
        row["inheritedPermissionsDisabled"] = limited
        row["permissionDetails"] = [
            {"permissionType": "member" if inherited else "file", "role": self.role,
             "inherited": inherited}
        ]  # fmt: skip
        return row


@dataclass
class File:
    """One file or folder."""

    id: str
    name: str
    mime: str
    content: bytes = b""
    parents: list[str] = field(default_factory=lambda: [DRIVE])
    drive: str | None = DRIVE
    trashed: bool = False
    permissions: list[Permission] = field(default_factory=list)
    version: int = 1
    limited: bool = False  # inherited permissions disabled (in a folder with limited access)
    web_view_link: str | None = None
    size: int | None = None  # what Drive says it is, when not the content's length

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "kind": "drive#file",
            "id": self.id,
            "name": self.name,
            "mimeType": self.mime,
            "trashed": self.trashed,
            "parents": list(self.parents),
            "version": str(self.version),
            "webViewLink": self.web_view_link
            or f"https://docs.google.com/document/d/{self.id}/edit?usp=drivesdk",
        }
        if self.drive:
            row["driveId"] = self.drive
        if not self.mime.startswith("application/vnd.google-apps."):
            row["size"] = str(self.size if self.size is not None else len(self.content))
        return row


@dataclass
class Fault:
    """An answer queued for the next requests whose path contains ``path``."""

    path: str
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    times: int = 1


class MockDrive:
    """The server's state; :meth:`serve` runs it."""

    def __init__(self) -> None:
        self.files: dict[str, File] = {}
        self.drive_members: list[Permission] = []  # inherited by every file of the drive
        self.groups: dict[str, list[dict[str, str]]] = {}
        self.hidden_permissions: set[str] = set()  # files whose permissions are 403
        self.hidden_groups: set[str] = set()  # groups the Directory API will not list
        self.changes: list[tuple[str, bool]] = []  # (file id, removed)
        self.faults: list[Fault] = []
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.tokens: dict[str, set[str]] = {}  # access token -> its scopes
        self.key_revoked = False
        self.page_cap = 2
        self.list_twice: str | None = None  # a file id files.list gives twice
        # files.list answers this many empty pages first, each with a fresh nextPageToken
        # (Drive may while it searches; more than a few is hostile).
        self.empty_pages = 0
        self.served: dict[str, int] = {}  # bytes of each file's content sent
        # Files whose content is sent a byte at a time, each moving ``trickle_clock`` on by
        # ``trickle_seconds`` (hostile: a download that never quite stops).
        self.trickle: set[str] = set()
        self.trickle_clock: Waits | None = None
        self.trickle_seconds = 5.0
        self.hidden_drive_members = False  # the shared drive's own permissions are 403
        self.drive_members_only = False  # restrictions.driveMembersOnly of the shared drive
        self._sharing: dict[str, str] = {}  # each file's permissions as last logged
        self.base = ""
        self.key_id = "k1"
        self._lock = threading.Lock()

    # ------------------------------------------------------------ the test's side

    def key_file(self, *, subject_ok: bool = True) -> str:
        """The service account's JSON key, its ``token_uri`` this server."""
        pem = _private_key().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return json.dumps(
            {
                "type": "service_account",
                "project_id": "example-project",
                "private_key_id": self.key_id,
                "private_key": pem.decode(),
                "client_email": ACCOUNT,
                "client_id": "1234567890",
                "token_uri": f"{self.base}/token",
            }
        )

    def put(self, file: File) -> File:
        """Add or replace ``file``: one change."""
        self.files[file.id] = file
        self.changes.append((file.id, False))
        self._sharing[file.id] = repr(file.permissions)
        return file

    def edit(self, file_id: str, **changes: Any) -> None:
        """Change a file's fields (its version goes up): one change."""
        file = self.files[file_id]
        for name, value in changes.items():
            setattr(file, name, value)
        file.version += 1
        self.changes.append((file_id, False))
        self._sharing[file_id] = repr(file.permissions)

    def delete(self, file_id: str) -> None:
        """Delete a file for good: a ``removed`` change."""
        del self.files[file_id]
        self.changes.append((file_id, True))

    def revoke_tokens(self) -> None:
        """Every access token given so far expires."""
        self.tokens.clear()

    def fail(
        self,
        path: str,
        status: int,
        *,
        retry_after: str | None = None,
        times: int = 1,
        reason: str = "backendError",
    ) -> None:
        """Answer the next ``times`` requests to ``path`` with ``status``."""
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        self.faults.append(Fault(path, status, headers, _error(status, reason), times))

    def calls_to(self, fragment: str) -> list[tuple[str, str, dict[str, str]]]:
        """The calls whose path holds ``fragment``."""
        return [c for c in self.calls if fragment in c[1]]

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on 127.0.0.1; yields the API base (``http://127.0.0.1:port``)."""
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                mock._answer(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                mock._answer(self, "POST")

            def log_message(self, *args: Any) -> None:
                pass

        with threaded_http_server(Handler) as port:
            self.base = f"http://127.0.0.1:{port}"
            yield self.base

    # ------------------------------------------------------------ answers

    def _answer(self, request: BaseHTTPRequestHandler, method: str) -> None:
        split = urlsplit(request.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        with self._lock:
            if split.path == "/token" and method == "POST":
                status, headers, data = self._token(body)
            else:
                self.calls.append((method, split.path, query))
                status, headers, data = self._route(request, split.path, query)
        if status == DROP:  # the connection drops halfway through the answer
            request.send_response(200)
            request.send_header("Content-Length", "100")
            request.end_headers()
            request.wfile.write(b'{"files": [')
            request.close_connection = True
            return
        trickled = headers.pop(_TRICKLE, None) is not None
        send_answer(
            request,
            status,
            headers,
            data,
            trickled=trickled,
            clock=self.trickle_clock,
            step=self.trickle_seconds,
        )

    def _token(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        form = {k: v[-1] for k, v in parse_qs(body.decode()).items()}
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return _oauth_error("unsupported_grant_type", "Invalid grant_type.")
        claims = self._verified(form.get("assertion", ""))
        if claims is None or self.key_revoked:
            return _oauth_error("invalid_grant", "Invalid JWT Signature.")
        if claims.get("exp", 0) < time.time():
            return _oauth_error("invalid_grant", "Invalid JWT: Token must be a short-lived token.")
        token = f"{DEFAULT_GDRIVE_TOKEN}-{len(self.tokens) + 1}"
        self.tokens[token] = set(str(claims.get("scope", "")).split())
        return (
            200,
            {},
            json.dumps(
                {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}
            ).encode(),
        )

    def _verified(self, assertion: str) -> dict[str, Any] | None:
        try:
            head, payload, signature = assertion.split(".")
            _private_key().public_key().verify(
                _unb64(signature),
                f"{head}.{payload}".encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
            claims: dict[str, Any] = json.loads(_unb64(payload))
        except (ValueError, InvalidSignature):
            return None
        # Google's token endpoint takes its own address as the audience (google-auth sends it).
        audiences = {"https://oauth2.googleapis.com/token", f"{self.base}/token"}
        if claims.get("iss") != ACCOUNT or claims.get("aud") not in audiences:
            return None
        return claims

    def _route(
        self, request: BaseHTTPRequestHandler, path: str, query: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        auth = request.headers.get("Authorization", "")
        scopes = (
            self.tokens.get(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None
        )
        if scopes is None:
            return 401, {}, _error(401, "authError", "UNAUTHENTICATED")
        self._log_sharing_changes()
        for fault in self.faults:
            if fault.path in path and fault.times > 0:
                fault.times -= 1
                return fault.status, dict(fault.headers), fault.body
        if path.startswith("/admin/directory/v1/"):
            if GROUPS_SCOPE not in scopes:
                return 403, {}, _error(403, "insufficientPermissions", "PERMISSION_DENIED")
            return self._members(path.split("/"), query)
        if DRIVE_SCOPE not in scopes:
            return 403, {}, _error(403, "insufficientPermissions", "PERMISSION_DENIED")
        parts = path.removeprefix("/drive/v3/").split("/")
        if parts == ["files"]:
            return self._list(query)
        if parts == ["changes", "startPageToken"]:
            return _json(
                {"kind": "drive#startPageToken", "startPageToken": str(len(self.changes) + 1)}
            )
        if parts == ["changes"]:
            return self._changes(query)
        if parts[:1] == ["drives"] and len(parts) == 2:
            return self._drive(unquote(parts[1]))
        if parts[:1] == ["files"] and parts[2:] == ["permissions"] and unquote(parts[1]) == DRIVE:
            return self._drive_permissions(query)
        if parts[0] == "files" and len(parts) >= 2:
            file = self.files.get(unquote(parts[1]))
            if file is None or (file.drive and query.get("supportsAllDrives") != "true" and
                                parts[2:] != ["export"]):  # fmt: skip
                return 404, {}, _error(404, "notFound", "NOT_FOUND", f"File not found: {parts[1]}.")
            if parts[2:] == []:
                return self._get(file, query, request.headers.get("Range"))
            if parts[2:] == ["export"]:
                return self._export(file, query)
            if parts[2:] == ["permissions"]:
                return self._permissions(file, query)
        return 404, {}, _error(404, "notFound", "NOT_FOUND")

    def _list(self, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if query.get("corpora") == "drive" and not (
            query.get("driveId")
            and query.get("includeItemsFromAllDrives") == "true"
            and query.get("supportsAllDrives") == "true"
        ):
            return 400, {}, _error(400, "invalid", "INVALID_ARGUMENT")
        found = [f for f in self.files.values() if _matches(query.get("q", ""), f)]
        if query.get("corpora") == "drive":
            found = [f for f in found if f.drive == query["driveId"]]
        if self.list_twice in self.files:
            found.append(self.files[self.list_twice])
        if (searching := self._searching(query)) is not None:
            return searching
        start, limit = self._window(query)
        answer: dict[str, Any] = {
            "kind": "drive#fileList",
            "incompleteSearch": False,
            "files": [f.as_json() for f in found[start : start + limit]],
        }
        if start + limit < len(found):
            answer["nextPageToken"] = _b64(str(start + limit).encode())
        return _json(answer)

    def _get(
        self, file: File, query: dict[str, str], byte_range: str | None
    ) -> tuple[int, dict[str, str], bytes]:
        if query.get("alt") != "media":
            return _json(file.as_json())
        if file.mime.startswith("application/vnd.google-apps."):
            return 403, {}, _error(403, "fileNotDownloadable", "PERMISSION_DENIED")
        status, headers, body = 200, {"Content-Type": file.mime}, file.content
        wanted = _RANGE.fullmatch(byte_range or "")
        total = len(file.content)
        if wanted:
            first = int(wanted[1])
            last = min(int(wanted[2]) if wanted[2] else total - 1, total - 1)
            if first >= total:
                return 416, {"Content-Range": f"bytes */{total}"}, _error(416, "badRange")
            status, body = 206, file.content[first : last + 1]
            headers["Content-Range"] = f"bytes {first}-{last}/{total}"
        self.served[file.id] = self.served.get(file.id, 0) + len(body)
        if file.id in self.trickle:
            headers[_TRICKLE] = ""
        return status, headers, body

    def _export(self, file: File, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if file.mime not in _EXPORTS:
            return 403, {}, _error(403, "fileNotExportable", "PERMISSION_DENIED")
        wanted = query.get("mimeType", "")
        if wanted not in _EXPORTS[file.mime]:
            return 400, {}, _error(400, "badRequest", "INVALID_ARGUMENT")
        if len(file.content) > 10 * 2**20:
            return 403, {}, _error(403, "exportSizeLimitExceeded", "PERMISSION_DENIED")
        return 200, {"Content-Type": wanted}, file.content

    def _permissions(self, file: File, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if file.id in self.hidden_permissions:
            return 403, {}, _error(403, "insufficientFilePermissions", "PERMISSION_DENIED")
        rows = [p.as_json(i, False, file.limited) for i, p in enumerate(file.permissions)]
        if file.drive:
            members = enumerate(self.drive_members, start=len(rows))
            rows += [p.as_json(i, True, file.limited) for i, p in members]
        return self._permission_page(rows, query)

    def _searching(self, query: dict[str, str]) -> tuple[int, dict[str, str], bytes] | None:
        """An empty page pointing at the next, while the first ``empty_pages`` are asked for."""
        token = query.get("pageToken", "")
        searched = int(token.removeprefix(_SEARCHING)) if token.startswith(_SEARCHING) else 0
        if (not token or token.startswith(_SEARCHING)) and searched < self.empty_pages:
            page = {"kind": "drive#fileList", "incompleteSearch": False, "files": []}
            return _json({**page, "nextPageToken": f"{_SEARCHING}{searched + 1}"})
        return None

    def _window(self, query: dict[str, str]) -> tuple[int, int]:
        """Where the page ``pageToken`` names starts, and how many rows it holds at most."""
        token = query.get("pageToken", "")
        start = int(_unb64(token).decode()) if token and not token.startswith(_SEARCHING) else 0
        return start, min(int(query.get("pageSize", "100")), self.page_cap)

    def _permission_page(
        self, rows: list[dict[str, Any]], query: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        """One page of ``rows`` from ``pageToken``, at most ``pageSize`` and the server's cap."""
        if (searching := self._searching(query)) is not None:
            return searching
        start, limit = self._window(query)
        named = re.search(r"permissions\(([^)]*)\)", query.get("fields", ""))
        wanted = set(named.group(1).split(",")) if named else None
        answer: dict[str, Any] = {
            "kind": "drive#permissionList",
            "permissions": [
                {k: v for k, v in row.items() if wanted is None or k in wanted}
                for row in rows[start : start + limit]
            ],
        }
        if start + limit < len(rows):
            answer["nextPageToken"] = _b64(str(start + limit).encode())
        return _json(answer)

    def _log_sharing_changes(self) -> None:
        """Log a change of each file whose permissions the test changed since last logged."""
        for file_id, file in self.files.items():
            sharing = repr(file.permissions)
            if self._sharing.get(file_id, sharing) != sharing:
                file.version += 1
                self.changes.append((file_id, False))
            self._sharing[file_id] = sharing

    def _drive(self, drive_id: str) -> tuple[int, dict[str, str], bytes]:
        if drive_id != DRIVE:
            return (
                404,
                {},
                _error(404, "notFound", "NOT_FOUND", f"Shared drive not found: {drive_id}"),
            )
        restrictions = {
            "adminManagedRestrictions": False,
            "copyRequiresWriterPermission": False,
            "domainUsersOnly": False,
            "driveMembersOnly": self.drive_members_only,
        }
        return _json({"kind": "drive#drive", "id": DRIVE, "restrictions": restrictions})

    def _drive_permissions(self, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if query.get("supportsAllDrives") != "true":
            return 404, {}, _error(404, "notFound", "NOT_FOUND", f"File not found: {DRIVE}.")
        if self.hidden_drive_members:
            return 403, {}, _error(403, "insufficientFilePermissions", "PERMISSION_DENIED")
        rows = [p.as_json(i, False) for i, p in enumerate(self.drive_members)]
        return self._permission_page(rows, query)

    def _changes(self, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        token = query.get("pageToken", "")
        if not token.isdigit() or not 1 <= int(token) <= len(self.changes) + 1:
            return 400, {}, _error(400, "invalid", "INVALID_ARGUMENT", "Invalid Value")
        start = int(token) - 1
        limit = min(int(query.get("pageSize", "100")), self.page_cap)
        rows = []
        for file_id, removed in self.changes[start : start + limit]:
            file = self.files.get(file_id)
            if query.get("driveId") and file is not None and file.drive != query["driveId"]:
                continue
            row: dict[str, Any] = {"kind": "drive#change", "changeType": "file", "fileId": file_id}
            row["removed"] = removed or file is None
            if file is not None and not removed:
                row["file"] = file.as_json()
            rows.append(row)
        answer: dict[str, Any] = {"kind": "drive#changeList", "changes": rows}
        if start + limit < len(self.changes):
            answer["nextPageToken"] = str(start + limit + 1)
        else:
            answer["newStartPageToken"] = str(len(self.changes) + 1)
        return _json(answer)

    def _members(
        self, parts: list[str], query: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        # /admin/directory/v1/groups/{groupKey}/members
        if len(parts) != 7 or parts[4] != "groups" or parts[6] != "members":
            return 404, {}, _error(404, "notFound", "NOT_FOUND")
        group = unquote(parts[5])
        if group in self.hidden_groups:
            return (
                403,
                {},
                _error(
                    403,
                    "forbidden",
                    "PERMISSION_DENIED",
                    "Not Authorized to access this resource/api",
                ),
            )
        if group not in self.groups:
            return 404, {}, _error(404, "notFound", "NOT_FOUND", "Resource Not Found: groupKey")
        rows = self._expanded(group, query.get("includeDerivedMembership") == "true", set())
        start = int(_unb64(query["pageToken"]).decode()) if query.get("pageToken") else 0
        limit = min(int(query.get("maxResults", "200")), self.page_cap)
        answer: dict[str, Any] = {
            "kind": "admin#directory#members",
            "members": rows[start : start + limit],
        }
        if start + limit < len(rows):
            answer["nextPageToken"] = _b64(str(start + limit).encode())
        return _json(answer)

    def _expanded(self, group: str, derived: bool, seen: set[str]) -> list[dict[str, str]]:
        seen.add(group)
        rows: list[dict[str, str]] = []
        for member in self.groups.get(group, []):
            row = {"kind": "admin#directory#member", "role": "MEMBER", "status": "ACTIVE", **member}
            rows.append(row)
            nested = member.get("email", "")
            if derived and member.get("type") == "GROUP" and nested not in seen:
                rows += self._expanded(nested, derived, seen)
        return rows


# A byte range as Drive honours it: ``bytes=first-last`` or ``bytes=first-``.
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
# Marks an answer sent a byte at a time (``MockDrive.trickle``); never sent itself.
_TRICKLE = "X-Mock-Trickle"

# The page token of an empty page of files.list (``MockDrive.empty_pages``).
_SEARCHING = "searching-"


def user(email: str) -> dict[str, str]:
    """A group member who is a person."""
    return {"email": email, "type": "USER", "id": f"u-{email.split('@')[0]}"}


def _matches(q: str, file: File) -> bool:
    """The ``q`` this mock understands: ``'ID' in parents``, ``trashed = false``, joined by and."""
    for clause in (c.strip() for c in q.split(" and ") if c.strip()):
        if clause.endswith(" in parents"):
            if clause.split("'")[1] not in file.parents:
                return False
        elif clause == "trashed = false":
            if file.trashed:
                return False
        else:
            raise ValueError(f"the mock does not read {clause!r}")
    return True


def _error(status: int, reason: str, state: str = "", message: str = "failure") -> bytes:
    return json.dumps(
        {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"domain": "global", "reason": reason, "message": message}],
                "status": state or "UNKNOWN",
            }
        }
    ).encode()


def _oauth_error(error: str, description: str) -> tuple[int, dict[str, str], bytes]:
    return 400, {}, json.dumps({"error": error, "error_description": description}).encode()


def _json(data: Any) -> tuple[int, dict[str, str], bytes]:
    return 200, {}, json.dumps(data).encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
