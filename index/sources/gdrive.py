"""Google Drive as a source, through ``google-api-python-client`` and a service account.

One shared drive, or one folder and everything under it, per source. What is
read, with the Drive API v3 and, for groups, the Admin SDK Directory API (both
built from the discovery documents the client ships: no network to build them):

* the listing: ``files.list`` (``trashed = false``; a shared drive with
  ``corpora=drive``, a folder folder by folder with ``'ID' in parents``),
  following ``nextPageToken`` page after page;
* the changes: ``changes.list`` from a page token, the checkpoint, until it
  gives ``newStartPageToken`` (the next checkpoint); a first load takes
  ``changes.getStartPageToken`` *before* listing, so nothing changed during
  the load is missed. Deletions and trashing come as changes too, and the
  slim listing, which no longer has them, removes them;
* a document: Google Docs exported as HTML (``files.export``: headings,
  lists and tables as written, read by the same HTML extractor as a page, so
  each cited passage has exact offsets), Sheets as XLSX (every sheet: a CSV
  export has only the first), Slides as PPTX (each slide's text in order; a
  PDF export lays the text out by position); other files downloaded
  (``files.get`` ``alt=media``) when the product's extractor reads their type;
* who may read it: ``permissions.list`` (on a shared drive its members'
  inherited permissions come too, each a reader): ``user`` → its email,
  ``group`` → the group's email, its members expanded with the Directory API's
  ``members.list`` (nested groups included), ``domain`` → the domain when
  its people may find the file (``allowFileDiscovery``), ``anyone`` (with the
  link) → public in the organisation, and a ``domain`` one only its link finds
  → the domain, only when the admin said so for the source (a link does not
  tell who was given it), otherwise they admit nobody more. A permission with
  an ``expirationTime`` still to come admits until then (the access rule reads
  it at every look-up, so it stops admitting when it expires, not at the next
  sync: Drive's changes log may never say it did). A permission whose
  ``expirationTime`` has passed, of a role Drive did not document, of a
  ``view`` (a published reader), or inherited by a file whose inherited
  permissions are disabled (a folder with limited access), admits nobody; on a
  shared drive that lets only its members in (``restrictions.driveMembersOnly``,
  ``drives.get`` once a run), only its members' permissions admit. Permissions Drive will not show this account are unknown: nobody
  reads the file until they can be read. A run asks only about the files whose sharing changed since
  the checkpoint: Drive logs a sharing change as a change of the file, and
  the shared drive's own members, whose change reaches every file without a
  change of each, are compared with those the checkpoint recorded
  (:meth:`GDriveConnector.permissions_changed`).

Credentials: a service account's JSON key (its ``token_uri`` is where tokens
come from), with domain-wide delegation to a ``subject`` when one is given;
scopes ``drive.readonly`` and, for groups only, a separate token with
``admin.directory.group.member.readonly``. Rate limits and failures: 429 and
Drive's 403 ``rateLimitExceeded`` wait ``Retry-After`` or back off, 5xx and
dropped connections back off, within one budget per call (``index.sources.retry``).
401, a key the token endpoint refuses, and other 403s are the credentials: no retry.
The client libraries log at INFO at most.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

import google_auth_httplib2
import httplib2
from google.auth.exceptions import GoogleAuthError, RefreshError, TransportError
from google.auth.transport.requests import AuthorizedSession
from google.oauth2 import service_account
from googleapiclient.discovery import build
from googleapiclient.errors import HttpError

from index.config import DEFAULT_DOWNLOAD_TIMEOUT, DEFAULT_MAX_UPLOAD_BYTES
from index.errors import ExtractionError
from index.sources.contract import (
    UNKNOWN_ACL,
    Acl,
    Batch,
    GroupMembers,
    SourceCredentialsRejected,
    SourceDocument,
    SourceError,
    SourceFailed,
)
from index.sources.downloads import PLAIN, Deadline, read_capped
from index.sources.fields import (
    Listing,
    expired,
    expiry,
    file_name,
    readable_name,
    readable_suffix,
)
from index.sources.retry import DEFAULT_BUDGET_SECONDS, Retry, RetryBudget, retry_after

__all__ = [
    "DRIVE_SCOPE",
    "GROUPS_SCOPE",
    "GDriveConnector",
    "GDriveSettings",
]

# Their DEBUG lines hold request bodies (a signed assertion is good for an hour of tokens).
for _name in ("googleapiclient", "google_auth_httplib2", "google.auth", "httplib2"):
    logging.getLogger(_name).setLevel(logging.INFO)
log = logging.getLogger(__name__)

DRIVE_SCOPE = "https://www.googleapis.com/auth/drive.readonly"
GROUPS_SCOPE = "https://www.googleapis.com/auth/admin.directory.group.member.readonly"
# Drive's own most for files.list and permissions.list (developers.google.com/drive/api/reference).
FILES_PAGE_SIZE = 1000
PERMISSIONS_PAGE_SIZE = 100
MEMBERS_PAGE_SIZE = 200
MAX_FOLDERS = 50_000
FOLDER = "application/vnd.google-apps.folder"
_XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
_PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
# Google's own formats: what each is exported as (see the module's docstring for why).
EXPORTS = {
    "application/vnd.google-apps.document": ("text/html", ".html"),
    "application/vnd.google-apps.spreadsheet": (_XLSX, ".xlsx"),
    "application/vnd.google-apps.presentation": (_PPTX, ".pptx"),
}
_FILE_FIELDS = "id,name,mimeType,trashed,parents,driveId,version,webViewLink,size"
_PERMISSION_FIELDS = (
    "id,type,role,emailAddress,domain,deleted,allowFileDiscovery,expirationTime,view,"
    "inheritedPermissionsDisabled,permissionDetails"
)
# Who still reads an item whose inherited permissions are disabled, besides its direct ones.
_ALWAYS_READING = frozenset({"owner", "organizer"})
# The roles Drive documents, each of which reads the file ("while new values may be
# supported in the future": one it adds since means what nobody here knows, and reads nothing).
READING_ROLES = frozenset({"owner", "organizer", "fileOrganizer", "writer", "commenter", "reader"})
_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")
# Where Drive opens files; a webViewLink elsewhere is not used as the link.
_DRIVE_HOSTS = frozenset({"docs.google.com", "drive.google.com"})
_RATE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})


@dataclass(frozen=True)
class GDriveSettings:
    """One shared drive, or one folder and what is under it (no credential).

    Attributes:
        drive: the shared drive's id; with ``folder``, the drive the folder is in.
        folder: a folder's id: only what is under it (at any depth) is synced.
        subject: the user the service account acts as (domain-wide delegation);
            empty: the service account itself (the drive or folder is shared with it).
        anyone_public: a file anyone with the link may open is public in the organisation;
            false: such a link admits nobody more than the file's other permissions.
        api_url: Google's API base (``https://www.googleapis.com``), for a proxy; empty: Google's.
    """

    drive: str = ""
    folder: str = ""
    subject: str = ""
    anyone_public: bool = False
    api_url: str = ""

    # The settings that say who reads the source, which ``kb source readers`` changes.
    READERS: ClassVar[tuple[str, ...]] = ("anyone_public",)

    def __post_init__(self) -> None:
        if not self.drive and not self.folder:
            raise SourceError("A Google Drive source needs --drive (a shared drive) or --folder.")
        for what, value in (("shared drive", self.drive), ("folder", self.folder)):
            if value and not _ID.fullmatch(value):
                raise SourceError(f"{value!r} is not a Google Drive {what} id.")
        if self.subject and "@" not in self.subject:
            raise SourceError(f"{self.subject!r} is not an email to act as (--subject).")
        if self.api_url and not re.match(r"https?://[^/\s]+", self.api_url):
            raise SourceError(f"{self.api_url!r} is not an API address (https://...).")

    def as_dict(self) -> dict[str, Any]:
        """As recorded in the store."""
        return {
            "drive": self.drive,
            "folder": self.folder,
            "subject": self.subject,
            "anyone_public": self.anyone_public,
            "api_url": self.api_url,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GDriveSettings:
        """From :meth:`as_dict`."""
        return cls(
            drive=str(data.get("drive") or ""),
            folder=str(data.get("folder") or ""),
            subject=str(data.get("subject") or ""),
            anyone_public=bool(data.get("anyone_public")),
            api_url=str(data.get("api_url") or ""),
        )

    def acl_now(self, before: GDriveSettings, acl: Acl) -> Acl:
        """A synced file's permissions once the readers are these, not ``before``'s.

        Only a link makes a file public here, or open to a domain: with
        ``anyone_public`` turned off, no file is public any more, and no domain
        reads one, now (a domain that may find the file in Drive comes back with
        the next sync, which reads every permission again). Turned on, which files
        have such a link is Drive's to say: the next sync reads it.
        """
        if before.anyone_public and not self.anyone_public and acl.known:
            return replace(acl.without_public(), domains=frozenset())
        return acl


class GDriveConnector:
    """A shared drive or a folder as a :class:`index.sources.contract.Connector`.

    Args:
        settings: the drive or folder.
        token: the service account's JSON key (its content).
        sleep: how a wait is waited (tests record it).
        clock: the time now, which tells an expired sharing from one still to expire.
        budget_seconds: the most one call waits for retries before the run fails.
        timeout: seconds for one HTTP request.
        max_bytes: the largest file downloaded (the knowledge base's default upload limit).
        download_seconds: the most one file's download may take, its retries included.
    """

    kind = "gdrive"

    def __init__(
        self,
        settings: GDriveSettings,
        token: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        budget_seconds: float = DEFAULT_BUDGET_SECONDS,
        timeout: int = 30,
        max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
        download_seconds: float = DEFAULT_DOWNLOAD_TIMEOUT,
    ) -> None:
        self.settings = settings
        self.sleep = sleep
        self.clock = clock
        self.budget_seconds = budget_seconds
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.download_seconds = download_seconds
        credentials = _credentials(token, settings.subject)
        self.drive = _service("drive", "v3", credentials, timeout, settings.api_url, "drive/v3/")
        # A file's content is read as it comes, which httplib2 cannot (it reads a whole
        # answer): the same credentials, over requests.
        self.media = AuthorizedSession(credentials)
        self.directory = _service(
            "admin",
            "directory_v1",
            credentials.with_scopes([GROUPS_SCOPE]),
            timeout,
            settings.api_url,
            "",
        )
        self._members: dict[str, GroupMembers] = {}
        # Within one run: each file's permissions read once, the change log from a token
        # read once (the permission step and the poll both use it), the drive's members.
        self._acls: dict[str, Acl] = {}
        self._logs: dict[str, tuple[dict[str, dict[str, Any] | None], str]] = {}
        self._drive_grants: list[list[str]] | None = None
        self._members_only: bool | None = None

    # ------------------------------------------------------------ the contract

    def load(self) -> Batch:
        """Every file, and the page token the changes are polled from.

        The token is taken before the listing: a file changed while the load
        runs comes again in the next poll (unchanged bytes are not indexed twice).
        """
        token = self._start_token()
        failed: list[tuple[str, str]] = []
        documents = self._documents(list(self._files()), failed)
        return Batch(documents, self._checkpoint(token), failed)

    def poll(self, checkpoint: str) -> Batch:
        """The files changed since ``checkpoint`` (a ``changes.list`` page token)."""
        changed, token = self._changes(_token_of(checkpoint))
        wanted = self._in_scope(changed)
        failed: list[tuple[str, str]] = []
        return Batch(self._documents(wanted, failed), self._checkpoint(token), failed)

    def listing(self) -> frozenset[str]:
        """The ids of every file synced from here now (all pages of the listing, or it raises)."""
        return frozenset(f["id"] for f in self._files())

    def permissions(self, items: Iterable[str]) -> dict[str, Acl]:
        """Each file's current Acl (unknown where Drive will not show it)."""
        return {item: self._acl(item) for item in items}

    def permissions_changed(
        self, checkpoint: str, recorded: Mapping[str, Acl]
    ) -> dict[str, Acl] | None:
        """The current Acl of each recorded file whose permissions may have changed since
        ``checkpoint``; ``None``: that cannot be told, and every file's are read.

        A sharing change is a change of the file: ``changes.list`` lists it (and
        its ``version`` goes up), so an unchanged file costs no call, only the
        changes' pages and the shared drive's own members (a change of those
        reaches every file without a change of each). Everything is read again
        when those members or ``anyone_public`` differ from the checkpoint's, when
        a folder changed (what is under it inherits its sharing), or when
        something the source never synced was removed (it may have been a
        folder). A file whose permissions could not be read is asked again.
        """
        state = _state_of(checkpoint)
        if state.get("anyone_public") != self.settings.anyone_public:
            return None
        if not self.settings.drive:
            # A folder may sit in a shared drive whose members change with no file in the
            # changes log, and which drive is not known here: every file's are read.
            return None
        members = self._drive_members()
        if members is None or state.get("drive_members") != members:
            return None
        if state.get("drive_members_only") != self._drive_members_only():
            return None
        log, _ = self._change_log(_token_of(checkpoint))
        for item, file in log.items():
            if (file is None and item not in recorded) or (file and file["mimeType"] == FOLDER):
                return None
        again = sorted(i for i, acl in recorded.items() if i in log or not acl.known)
        return {item: self._acl(item) for item in again}

    def groups(self, names: Iterable[str]) -> list[GroupMembers]:
        """The members of each group (by its email), nested groups included, asked again."""
        self._members.clear()
        return [self._group(name) for name in names]

    # ------------------------------------------------------------ files

    def _files(self) -> Iterator[dict[str, Any]]:
        """Every file here that the extractor reads, as ``files.list`` gives it (one listed
        twice is given twice: the sync takes it once and says so)."""
        if not self.settings.folder:
            yield from (f for f in self._list("trashed = false") if _readable(f))
            return
        folders, seen = [self.settings.folder], {self.settings.folder}
        while folders:
            if len(seen) > MAX_FOLDERS:
                raise SourceFailed(f"More than {MAX_FOLDERS} folders under the folder; stopped.")
            parent = folders.pop()
            for found in self._list(f"'{parent}' in parents and trashed = false"):
                if found["mimeType"] == FOLDER:
                    if found["id"] not in seen:  # a folder in two places is walked once
                        seen.add(found["id"])
                        folders.append(found["id"])
                elif _readable(found):
                    yield found

    def _list(self, q: str) -> Iterator[dict[str, Any]]:
        where: dict[str, Any] = {"corpora": "allDrives"}
        if self.settings.drive:
            where = {"corpora": "drive", "driveId": self.settings.drive}
        fields = f"nextPageToken,files({_FILE_FIELDS})"
        for answer in self._pages(
            lambda token: self.drive.files().list(
                q=q,
                pageSize=FILES_PAGE_SIZE,
                pageToken=token,
                fields=fields,
                includeItemsFromAllDrives=True,
                supportsAllDrives=True,
                **where,
            )
        ):
            rows = answer.get("files")
            if not isinstance(rows, list):
                raise SourceFailed("Google Drive answered a listing without its files.")
            if answer.get("incompleteSearch"):
                # A listing that may miss files would remove them: this run removes nothing.
                raise SourceFailed("Google Drive said its listing is incomplete; stopped.")
            for row in rows:
                yield _file(row)

    def _pages(
        self, request: Callable[[str | None], Any], *, hidden: bool = False
    ) -> Iterator[dict[str, Any]]:
        """Each page of a listing, following ``nextPageToken`` (``hidden``: as :meth:`_call`)."""
        token: str | None = None
        listing = Listing("Google Drive")
        while True:
            answer = self._call(request(token), hidden=hidden)
            if not isinstance(answer, dict):
                raise SourceFailed("Google Drive answered a listing that is not JSON.")
            yield answer
            token = answer.get("nextPageToken")
            if not token:
                return
            token = listing.next_page(str(token), empty=_empty(answer))

    def _start_token(self) -> str:
        args: dict[str, Any] = {"supportsAllDrives": True}
        if self.settings.drive:
            args["driveId"] = self.settings.drive
        answer = self._call(self.drive.changes().getStartPageToken(**args))
        token = answer.get("startPageToken") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise SourceFailed("Google Drive gave no start page token for the changes.")
        return token

    def _changes(self, token: str) -> tuple[list[dict[str, Any]], str]:
        """The files changed since page token ``token`` (the last change of each), and the
        next token. Removed and trashed files are left out: the listing prunes them."""
        latest, new_token = self._change_log(token)
        return [f for f in latest.values() if f is not None and not f["trashed"]], new_token

    def _change_log(self, token: str) -> tuple[dict[str, dict[str, Any] | None], str]:
        """Each file changed since page token ``token`` as its last change gives it
        (``None``: removed), and the next token; read once a run."""
        if token in self._logs:
            return self._logs[token]
        args: dict[str, Any] = {"includeItemsFromAllDrives": True, "supportsAllDrives": True}
        if self.settings.drive:
            args["driveId"] = self.settings.drive
        fields = f"nextPageToken,newStartPageToken,changes(fileId,removed,file({_FILE_FIELDS}))"
        latest: dict[str, dict[str, Any] | None] = {}
        listing = Listing("Google Drive", token)
        while True:
            answer = self._call(
                self.drive.changes().list(
                    pageToken=token, pageSize=FILES_PAGE_SIZE, fields=fields, **args
                )
            )
            rows = answer.get("changes") if isinstance(answer, dict) else None
            if not isinstance(rows, list):
                raise SourceFailed("Google Drive answered changes that are not JSON of changes.")
            for row in rows:
                item, file = _change(row)
                latest.pop(item, None)  # the last change of a file decides, in its order
                latest[item] = file
            if answer.get("newStartPageToken"):
                self._logs[token] = (latest, str(answer["newStartPageToken"]))
                return self._logs[token]
            token = answer.get("nextPageToken")
            if not token:
                raise SourceFailed("Google Drive's changes ended without the next page token.")
            token = listing.next_page(str(token), empty=not rows)

    def _in_scope(self, changed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The changed files this source syncs: of its drive, under its folder, of a type read."""
        if self.settings.folder:
            if not changed:
                return []
            under = self.listing()
            return [f for f in changed if f["id"] in under]
        return [f for f in changed if f.get("driveId") == self.settings.drive and _readable(f)]

    def _documents(
        self, files: list[dict[str, Any]], failed: list[tuple[str, str]]
    ) -> Iterator[SourceDocument]:
        for file in files:
            try:
                yield self._document(file)
            except _Malformed as exc:
                failed.append((file["id"], str(exc)))
            except _Gone:
                continue  # deleted since it was listed: the next listing prunes it

    def _document(self, file: dict[str, Any]) -> SourceDocument:
        item, name, mime = file["id"], file["name"].strip(), file["mimeType"]
        size = file.get("size")
        if size is not None and str(size).isdigit() and int(size) > self.max_bytes:
            raise _Malformed(
                f"{name} is {int(size) // 2**20} MB, over the "
                f"{self.max_bytes // 2**20} MB a document may be; skipped."
            )
        acl = self._acl(item)
        if mime in EXPORTS:
            media_type, suffix = EXPORTS[mime]
            export = self.drive.files().export_media(fileId=item, mimeType=media_type)
            data = self._content(export.uri, name)
            filename = f"{file_name(name, 'file')}{suffix}"
        else:
            filename = readable_name(name, mime)
            media_type = mime
            download = self.drive.files().get_media(fileId=item, supportsAllDrives=True)
            data = self._content(download.uri, name)
        return SourceDocument(
            item=item,
            title=name,
            url=_url_of(file),
            data=data,
            filename=filename,
            media_type=media_type,
            acl=acl,
            version=str(file.get("version") or ""),
        )

    def _content(self, uri: str, name: str) -> bytes:
        """The bytes at a ``files.get`` (``alt=media``) or ``files.export`` address, read as
        they come, at most ``max_bytes`` (asked for with a ``Range``, which Drive honours,
        and counted, as an export or another server may send more), within
        ``download_seconds`` from the first request, retries included."""
        deadline = Deadline.start(self.download_seconds, self.clock)
        headers = {**PLAIN, "Range": f"bytes=0-{self.max_bytes}"}

        def download() -> bytes:
            deadline.check(name)
            response = self.media.get(uri, headers=headers, stream=True, timeout=self.timeout)
            if response.status_code == 416:  # no byte to give: an empty file
                response.close()
                return b""
            if response.status_code >= 400:
                raise _http_error(response)
            return read_capped(response, name, max_bytes=self.max_bytes, deadline=deadline)

        return self._run(download, item=True)

    # ------------------------------------------------------------ permissions

    def _acl(self, item: str) -> Acl:
        if item not in self._acls:
            self._acls[item] = self._read_acl(item)
        return self._acls[item]

    def _read_acl(self, item: str) -> Acl:
        grants: list[tuple[str, str, float | None]] = []
        now = self.clock()
        members_only = self._drive_members_only()
        try:
            for row in self._permission_rows(item):
                if members_only and not _of_a_member(row):
                    continue  # the shared drive lets only its members in
                kind, value, until = _grant(row, now)
                if kind in ("user", "group", "domain"):
                    grants.append((kind, value, until))
                elif kind == _DOMAIN_LINK and self.settings.anyone_public:
                    grants.append(("domain", value, until))
                elif kind == "anyone" and self.settings.anyone_public:
                    grants.append(("public", "", until))
        except _Gone:
            return UNKNOWN_ACL  # deleted since it was listed: the next listing prunes it
        except _Unreadable as exc:
            log.warning("Google Drive file %s: %s; nobody may read it", item, exc)
            return UNKNOWN_ACL
        return Acl.granting(grants)

    def _permission_rows(self, file_id: str) -> Iterator[object]:
        """Each permission ``permissions.list`` gives of a file, or of a shared drive itself.

        Raises:
            _Gone: no such file; _Unreadable: Drive will not show them.
        """
        fields = f"nextPageToken,permissions({_PERMISSION_FIELDS})"
        for answer in self._pages(
            lambda token: self.drive.permissions().list(
                fileId=file_id,
                pageSize=PERMISSIONS_PAGE_SIZE,
                pageToken=token,
                fields=fields,
                supportsAllDrives=True,
            ),
            hidden=True,
        ):
            rows = answer.get("permissions")
            if not isinstance(rows, list):
                raise _Unreadable("Drive answered permissions that are not a list")
            yield from rows

    def _drive_members(self) -> list[list[str]] | None:
        """The shared drive's own permissions as sorted ``[kind, principal]`` rows, read once a
        run (none for a folder outside one); ``None``: Drive will not show them."""
        if not self.settings.drive:
            return []
        if self._drive_grants is None:
            try:
                rows = self._permission_rows(self.settings.drive)
                grants = {_grant(row, self.clock())[:2] for row in rows}
            except (_Gone, _Unreadable) as exc:
                log.info("Google shared drive's members: %s; every file's are read", exc)
                return None
            self._drive_grants = sorted([kind, value] for kind, value in grants if kind)
        return self._drive_grants

    def _drive_members_only(self) -> bool:
        """Whether the shared drive lets only its members reach its files
        (``restrictions.driveMembersOnly``), read once a run; ``False`` for a folder outside
        one. A drive whose restrictions Drive will not show counts as restricted."""
        if not self.settings.drive:
            return False
        if self._members_only is None:
            try:
                answer = self._call(
                    self.drive.drives().get(driveId=self.settings.drive, fields="restrictions"),
                    hidden=True,
                )
                restrictions = answer.get("restrictions") if isinstance(answer, dict) else None
                found = (
                    restrictions.get("driveMembersOnly") if isinstance(restrictions, dict) else True
                )
                self._members_only = found is not False
            except (_Gone, _Unreadable) as exc:
                log.info("Google shared drive's restrictions: %s; only its members read", exc)
                self._members_only = True
        return self._members_only

    def _checkpoint(self, token: str) -> str:
        """Where the next poll resumes, and what its permission step compares with."""
        return json.dumps(
            {
                "page_token": token,
                "drive_members": self._drive_members(),
                "drive_members_only": self._drive_members_only(),
                "anyone_public": self.settings.anyone_public,
            }
        )

    def _group(self, name: str) -> GroupMembers:
        if name not in self._members:
            emails: set[str] = set()
            complete = True
            try:
                for answer in self._pages(
                    lambda token: self.directory.members().list(
                        groupKey=name,
                        includeDerivedMembership=True,
                        maxResults=MEMBERS_PAGE_SIZE,
                        pageToken=token,
                    ),
                    hidden=True,
                ):
                    for row in answer.get("members") or []:
                        email = _member_email(row)
                        complete = complete and email is not None
                        emails.update([email] if email and email != "-" else [])
            except (SourceFailed, _Unreadable, _Gone) as exc:
                # A group the Directory API will not expand (no admin role, no scope, not
                # there) admits nobody through it: closed, never wider.
                log.warning("Google group %s: %s; its members count as nobody", name, exc)
                complete = False
            self._members[name] = GroupMembers(name, frozenset(emails), complete)
        return self._members[name]

    # ------------------------------------------------------------ calls

    def _call(self, request: Any, *, item: bool = False, hidden: bool = False) -> Any:
        """``request.execute()``, waiting out 429s, 5xx and dropped connections within the budget.

        ``item``: the content of one file: a 404 is :class:`_Gone` (deleted since it was
        listed), a 403 (too large to export, not downloadable) :class:`_Malformed` (skipped).
        ``hidden``: permissions or members: a 404 is :class:`_Gone`, a 403 what Google will
        not show this account (:class:`_Unreadable`).

        Raises:
            SourceCredentialsRejected: 401, a key the token endpoint refuses, another 403.
            SourceFailed: the budget is spent, a garbage answer, any other error.
        """
        return self._run(request.execute, item=item, hidden=hidden)

    def _run(self, call: Callable[[], Any], *, item: bool = False, hidden: bool = False) -> Any:
        """``call()``, as :meth:`_call` says; a file's download that went over its size or
        its deadline is :class:`_Malformed` (skipped)."""
        budget = RetryBudget("Google Drive", self.budget_seconds, self.sleep)
        try:
            return budget.run(call, _transient)
        except ExtractionError as exc:
            raise _Malformed(exc.reason) from None
        except HttpError as exc:
            raise _refused(exc.resp.status, _reason(exc), item=item, hidden=hidden) from None
        except RefreshError as exc:
            raise SourceCredentialsRejected(
                "Google refused the service account's key "
                f"({_first_line(exc)}): it was deleted or disabled, or domain-wide delegation "
                "does not grant these scopes. Make a new key and set it."
            ) from None
        except ValueError:
            raise SourceFailed("Google Drive answered something that is not JSON.") from None
        except GoogleAuthError:
            raise SourceCredentialsRejected(
                "The service account's key cannot be used; make a new one and set it."
            ) from None


def _http_error(response: Any) -> HttpError:
    """A download's error answer as the SDK's error (its body read, at most 64 KB), so that
    it is told apart and waited out as every other call's."""
    try:
        body = response.raw.read(1 << 16, decode_content=True)
    finally:
        response.close()
    info = {"status": str(response.status_code), **dict(response.headers.lower_items())}
    return HttpError(httplib2.Response(info), body, uri=response.url)


class _Malformed(Exception):
    """A file Drive gave in a shape it should not have, or would not give."""


class _Unreadable(Exception):
    """Permissions or members that could not be read."""


class _Gone(Exception):
    """A file or group no longer there."""


# What a dropped connection or a garbled answer raises, from each layer under the SDK.
_UNREACHABLE = (TransportError, httplib2.HttpLib2Error, http.client.HTTPException, OSError)


def _transient(exc: Exception) -> Retry | None:
    """A 429 or a rate-limit 403 (their ``Retry-After``), a 5xx or a dropped connection."""
    if isinstance(exc, HttpError):
        status = exc.resp.status
        if status == 429 or (status == 403 and _reason(exc) in _RATE_REASONS):
            return Retry(f"HTTP {status}", retry_after(exc.resp.get("retry-after")))
        return Retry(f"HTTP {status}") if status >= 500 else None
    if isinstance(exc, (RefreshError, ValueError)):
        return None  # a refused key, or an answer that is not JSON: no wait helps
    if isinstance(exc, _UNREACHABLE):
        return Retry("unreachable")
    return None


def _refused(status: int, reason: str, *, item: bool, hidden: bool) -> Exception:
    """What an HTTP 4xx other than a rate limit means (``item``, ``hidden``: as ``_call``)."""
    if status == 404 and (item or hidden):
        return _Gone()
    if status == 403 and hidden:
        return _Unreadable(f"Google will not show them to this account ({reason})")
    if status == 403 and item:
        return _Malformed(f"Google Drive will not give this file ({reason}); skipped.")
    if status in (401, 403):
        return SourceCredentialsRejected(
            f"Google refused the credentials (HTTP {status}, {reason}): the key was revoked, "
            "or the account cannot read this drive or folder. Share it with the service "
            "account (or its subject), or make a new key and set it."
        )
    if status == 404:
        return SourceFailed(
            f"Google Drive has no such shared drive or folder that this account can read "
            f"(HTTP 404, {reason}): share it with the service account (or its subject)."
        )
    return SourceFailed(f"Google Drive answered HTTP {status} ({reason}).")


def _credentials(key: str, subject: str) -> service_account.Credentials:
    """The service account's credentials, from its JSON key (never echoed back in errors)."""
    try:
        info = json.loads(key)
    except ValueError:
        info = None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        raise SourceError(
            "The Google Drive credential is not a service account's JSON key: put the whole "
            "key file's content in KB_GDRIVE_CREDENTIALS, or give the source --token-file KEY.json."
        )
    try:
        credentials = service_account.Credentials.from_service_account_info(
            info, scopes=[DRIVE_SCOPE], subject=subject or None
        )
    except (ValueError, KeyError):
        raise SourceError(
            "The service account's JSON key lacks its client_email, token_uri or a readable "
            "private_key; download a new key for it."
        ) from None
    return credentials


def _service(
    name: str, version: str, credentials: Any, timeout: int, api_url: str, path: str
) -> Any:
    options = {"api_endpoint": f"{api_url.rstrip('/')}/{path}"} if api_url else None
    http = google_auth_httplib2.AuthorizedHttp(credentials, http=httplib2.Http(timeout=timeout))
    return build(
        name,
        version,
        http=http,
        static_discovery=True,
        cache_discovery=False,
        client_options=options,
    )


def _empty(page: dict[str, Any]) -> bool:
    """Whether a page of a listing holds nothing: none of its lists (``files``,
    ``permissions``, ``members``: one a page) has an entry."""
    return not any(isinstance(value, list) and value for value in page.values())


def _file(row: object) -> dict[str, Any]:
    """A file of a listing or a change, checked for the fields the sync needs."""
    if not isinstance(row, dict):
        raise SourceFailed("Google Drive answered a file that is not JSON.")
    item, name, mime = row.get("id"), row.get("name"), row.get("mimeType")
    if not isinstance(item, str) or not _ID.fullmatch(item):
        raise SourceFailed("Google Drive answered a file without an id.")
    if not isinstance(name, str) or not name.strip() or not isinstance(mime, str):
        raise SourceFailed(f"Google Drive answered file {item} without a name or a type.")
    return {**row, "trashed": bool(row.get("trashed"))}


def _change(row: object) -> tuple[str, dict[str, Any] | None]:
    """A change's file id and its file; ``None``: removed (deleted, or out of reach)."""
    if not isinstance(row, dict) or not isinstance(row.get("fileId"), str):
        raise SourceFailed("Google Drive answered a change without a file id.")
    if row.get("removed") or row.get("file") is None:
        return row["fileId"], None
    return row["fileId"], _file(row["file"])


def _readable(file: dict[str, Any]) -> bool:
    """Whether the extractor reads what this file is, or is exported as."""
    if file["mimeType"] in EXPORTS:
        return True
    return readable_suffix(file["name"], file["mimeType"]) is not None


def _grant(row: object, now: float) -> tuple[str, str, float | None]:
    """One permission as ``(kind, principal, until)`` at ``now`` (epoch seconds); kind ``""``
    admits nobody. ``until``: its ``expirationTime``, still to come; ``None``: it lasts.

    Every role Drive documents (:data:`READING_ROLES`) reads; a role it added
    since admits nobody. A permission of a deleted account, one whose
    ``expirationTime`` has passed (or cannot be read), one of a ``view`` (a
    published reader sees only what was published, ``metadata`` only a name),
    one inherited by an item whose inherited permissions are disabled (a folder
    with limited access: only owners, organizers and its direct permissions
    read it), or a person or group Drive shows without an email, admits nobody. A ``domain`` permission
    nobody there can find (``allowFileDiscovery`` not true: "anyone at the
    domain with the link") is :data:`_DOMAIN_LINK`: a link, read as the
    source's ``anyone_public`` says.
    """
    if not isinstance(row, dict):
        raise _Unreadable("Drive answered a permission that is not JSON")
    kind, principal = _grantee(row, now)
    return kind, principal, expiry(row.get("expirationTime")) if kind else None


def _grantee(row: dict[str, Any], now: float) -> tuple[str, str]:
    """Whom one permission admits at ``now`` as ``(kind, principal)`` (see :func:`_grant`);
    ``("", "")``: nobody."""
    role = row.get("role")
    if row.get("deleted") or not isinstance(role, str) or role not in READING_ROLES:
        return "", ""
    if expired(row.get("expirationTime"), now):
        return "", ""
    if row.get("view") is not None or _disabled(row):
        return "", ""
    kind = row.get("type")
    if kind in ("user", "group"):
        email = row.get("emailAddress")
        if isinstance(email, str) and "@" in email:
            return kind, email.strip().lower()
        return "", ""
    if kind == "domain":
        domain = row.get("domain")
        if not isinstance(domain, str) or not domain.strip():
            return "", ""
        found = row.get("allowFileDiscovery") is True
        return ("domain" if found else _DOMAIN_LINK), domain.strip().lower()
    if kind == "anyone":
        return "anyone", ""
    return "", ""


# A domain permission found only through its link: "anyone at the domain with the link".
_DOMAIN_LINK = "domain-link"


def _of_a_member(row: object) -> bool:
    """Whether a shared drive item's permission is its drive's member's (a detail of
    ``permissionType`` ``member``), not one shared on the item with someone else."""
    details = row.get("permissionDetails") if isinstance(row, dict) else None
    return isinstance(details, list) and any(
        isinstance(d, dict) and d.get("permissionType") == "member" for d in details
    )


def _disabled(row: dict[str, Any]) -> bool:
    """Whether a permission admits nobody because its item's inherited permissions are
    disabled (``inheritedPermissionsDisabled``): it is no owner's or organizer's, and no
    detail says it is set on the item itself (none given: it cannot be told, so it is not)."""
    if row.get("inheritedPermissionsDisabled") is not True or row.get("role") in _ALWAYS_READING:
        return False
    details = row.get("permissionDetails")
    if not isinstance(details, list):
        return True
    return not any(isinstance(d, dict) and d.get("inherited") is False for d in details)


def _member_email(row: object) -> str | None:
    """A member's email; ``None`` for one whose people cannot be listed (the whole customer);
    ``"-"`` for a row that admits nobody itself (a nested group, whose members come too,
    or a suspended account)."""
    if not isinstance(row, dict):
        return None
    kind = row.get("type")
    if kind == "CUSTOMER":
        return None
    if kind == "GROUP" or row.get("status") == "SUSPENDED":
        return "-"
    email = row.get("email")
    return email.strip().lower() if isinstance(email, str) and "@" in email else None


def _reason(exc: HttpError) -> str:
    """Google's reason for an error (``rateLimitExceeded``...), from its JSON body."""
    try:
        error = json.loads(exc.content).get("error") or {}
    except (ValueError, AttributeError):
        return "no reason given"
    errors = error.get("errors") if isinstance(error, dict) else None
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        return str(errors[0].get("reason") or error.get("status") or "no reason given")[:80]
    return str(error.get("status") or "no reason given")[:80] if isinstance(error, dict) else ""


def _first_line(exc: Exception) -> str:
    text = str(exc.args[0]) if exc.args else "refused"
    return text.splitlines()[0][:160] if text else "refused"


def _url_of(file: dict[str, Any]) -> str:
    """Where the file opens in Drive: its ``webViewLink`` on Google's hosts, else by its id."""
    link = file.get("webViewLink")
    if isinstance(link, str):
        parts = urlsplit(link)
        if parts.scheme == "https" and parts.hostname in _DRIVE_HOSTS:
            return link
    return f"https://drive.google.com/open?id={quote(file['id'], safe='')}"


def _state_of(checkpoint: str) -> dict[str, Any]:
    """What a checkpoint recorded besides its page token (nothing, for an older one)."""
    try:
        state = json.loads(checkpoint)
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def _token_of(checkpoint: str) -> str:
    try:
        token = json.loads(checkpoint).get("page_token")
    except (ValueError, AttributeError):
        token = None
    if not isinstance(token, str) or not token:
        raise SourceFailed("The saved checkpoint cannot be read; kb source sync --full reloads.")
    return token
