"""SharePoint and OneDrive as a source, through Microsoft Graph (``requests``, tokens by ``msal``).

One drive per source: a SharePoint site's document library (its default one,
found from the site's address) or any drive by its id (a OneDrive, another
library). The app signs in as itself (client credentials, app-only), with
``msal``; nothing acts as a person. What is read, all with Graph v1.0:

* the changes: the drive's delta (``/drives/{id}/root/delta``), page after
  page following ``@odata.nextLink``; its last page's ``@odata.deltaLink`` is
  the checkpoint the next poll starts from. An item the delta lists twice is
  taken as its last occurrence (Graph says the last one is current); one with
  a ``deleted`` facet is gone (the listing prunes it); a move changes only its
  ``parentReference`` (its id stays; its permissions are read again). Graph
  answering 410 (the delta token expired) makes the poll a full load;
* the listing: a full delta of ids, names and facets only, no content;
* a file's bytes: ``/drives/{d}/items/{i}/content``, whose 302 points at a
  short-lived download address, followed only to the Graph host or a
  SharePoint/OneDrive host (``download_hosts``) and without the token (the
  address carries its own authorisation). Only formats the product's extractor
  reads are synced (Word, PowerPoint, Excel, PDF, HTML, Markdown, text, CSV);
* who may read it: ``/drives/{d}/items/{i}/permissions`` (inherited ones
  included). A person granted (``grantedToV2.user``, ``grantedToIdentitiesV2``)
  is known by email; a group (``grantedToV2.group``) by its id, expanded with
  ``/groups/{id}/transitiveMembers`` (``mail``, else ``userPrincipalName``);
  a sharing link of scope ``organization`` or ``anonymous`` is public in the
  organisation (anyone with an anonymous link may open it, so nobody in the
  organisation is kept from it by hiding it here); a link of scope ``users``
  admits its grantees; a link that does not read (``createOnly``, a file
  request: upload only) or of a type not known, and a permission past its
  ``expirationDateTime``, admit nobody; one whose ``expirationDateTime`` is
  still to come admits until then (the access rule reads it at every look-up,
  so it stops admitting when it expires, not at the next sync: the delta
  query may never say it did). A SharePoint site group
  (``grantedToV2.siteGroup``) cannot be expanded through Graph: it admits
  nobody unless the admin names it as the whole organisation; a group stands
  for the organisation by its id only (its display name is anyone's to choose). Permissions that cannot be read make the file
  unknown: nobody reads it until they can be.

Rate limits and failures: HTTP 429 and 503 wait ``Retry-After`` (or back
off), other 5xx and dropped connections back off, within a budget per call
(:mod:`index.sources.retry`). A 401 gets one fresh token; a second 401, a 403,
or a sign-in that refuses the app's secret fails the run: no retry helps.
The secret and the tokens are never logged (``msal`` masks them in its own
lines), nor a download address's query: urllib3's lines for the requests to
one show it hidden, and no other line of any logger changes.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

import msal
import requests
from msal.exceptions import MsalError

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
    after_organisation_groups,
)
from index.sources.downloads import PLAIN, Deadline, read_capped, too_large
from index.sources.fields import (
    Listing,
    expired,
    expiry,
    media_type_of,
    readable_suffix,
    timestamp,
)
from index.sources.retry import DEFAULT_BUDGET_SECONDS, Retry, RetryBudget, origin, retry_after

__all__ = [
    "SharePointConnector",
    "SharePointSettings",
]

log = logging.getLogger(__name__)

GRAPH_URL = "https://graph.microsoft.com/v1.0"
AUTHORITY_URL = "https://login.microsoftonline.com"
# Where Graph's 302 for a file's content may lead: SharePoint Online (and its national
# clouds) and OneDrive's download hosts. The Graph host itself is always allowed.
DOWNLOAD_HOSTS = ("sharepoint.com", "sharepoint.us", "sharepoint.de", "sharepoint.cn", "1drv.com")
# A site group's entry in an Acl: Graph cannot list its members.
SITE_GROUP_PREFIX = "sitegroup:"
# The sharing link types Graph documents that let their holders read the item: ``view``,
# ``edit``, ``embed``, ``review`` and ``blocksDownload`` (read on the web only). A
# ``createOnly`` link (a file request) only uploads; a type not known opens nothing here.
READING_LINKS = frozenset({"view", "edit", "embed", "review", "blocksDownload"})
_GUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,253}")
_DRIVE = re.compile(r"[A-Za-z0-9!_.-]{1,256}")
_REJECTED = {"invalid_client", "unauthorized_client", "invalid_grant", "invalid_scope"}


@dataclass(frozen=True)
class SharePointSettings:
    """One drive, as ``kb source add sharepoint`` records it (never the secret).

    Attributes:
        tenant: the directory (tenant) id, or its domain (``contoso.onmicrosoft.com``).
        client_id: the app registration's application (client) id.
        site: a SharePoint site's address (``https://contoso.sharepoint.com/sites/Eng``):
            its default document library is synced.
        drive: or a drive's id (a OneDrive, another library).
        organisation_groups: group ids or site group names that stand for everyone in the
            organisation: what they may read is public in the organisation (a group's
            display name names nothing: anyone may make a group of any name).
        graph_url: Graph's base (another for national clouds).
        authority_url: the sign-in service (another for national clouds).
        download_hosts: host suffixes a file's download address may be on.
    """

    tenant: str
    client_id: str
    site: str = ""
    drive: str = ""
    organisation_groups: tuple[str, ...] = ()
    graph_url: str = GRAPH_URL
    authority_url: str = AUTHORITY_URL
    download_hosts: tuple[str, ...] = DOWNLOAD_HOSTS

    # The settings that say who reads the source, which ``kb source readers`` changes.
    READERS: ClassVar[tuple[str, ...]] = ("organisation_groups",)

    def __post_init__(self) -> None:
        if not _TENANT.fullmatch(self.tenant):
            raise SourceError(f"{self.tenant!r} is not a tenant id or domain.")
        if self.tenant.lower() in ("common", "organizations", "consumers"):
            raise SourceError(
                f"{self.tenant!r} names no tenant: an app signs in as itself only in its own "
                "(the directory (tenant) id on the app registration's Overview page)."
            )
        if not _GUID.fullmatch(self.client_id):
            raise SourceError(
                f"{self.client_id!r} is not an application (client) id: the app registration's "
                "Overview page shows it (a GUID)."
            )
        if bool(self.site) == bool(self.drive):
            raise SourceError("Give a SharePoint site's address (--site) or a drive id (--drive).")
        if self.site and _site_path(self.site) is None:
            raise SourceError(
                f"{self.site!r} is not a SharePoint site address "
                "(https://contoso.sharepoint.com/sites/NAME)."
            )
        if self.drive and not _DRIVE.fullmatch(self.drive):
            raise SourceError(f"{self.drive!r} is not a drive id.")
        for url in (self.graph_url, self.authority_url):
            if not re.match(r"https://[^/\s]+", url):
                raise SourceError(f"{url!r} is not an https address.")

    def as_dict(self) -> dict[str, Any]:
        """As recorded in the store."""
        return {
            "tenant": self.tenant,
            "client_id": self.client_id,
            "site": self.site,
            "drive": self.drive,
            "organisation_groups": list(self.organisation_groups),
            "graph_url": self.graph_url,
            "authority_url": self.authority_url,
            "download_hosts": list(self.download_hosts),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SharePointSettings:
        """From :meth:`as_dict`."""
        return cls(
            tenant=str(data.get("tenant") or ""),
            client_id=str(data.get("client_id") or ""),
            site=str(data.get("site") or ""),
            drive=str(data.get("drive") or ""),
            organisation_groups=tuple(data.get("organisation_groups") or ()),
            graph_url=str(data.get("graph_url") or GRAPH_URL).rstrip("/"),
            authority_url=str(data.get("authority_url") or AUTHORITY_URL).rstrip("/"),
            download_hosts=tuple(data.get("download_hosts") or DOWNLOAD_HOSTS),
        )

    def acl_now(self, before: SharePointSettings, acl: Acl) -> Acl:
        """A synced file's permissions once the organisation groups are these, not ``before``'s."""
        return after_organisation_groups(before.organisation_groups, self.organisation_groups, acl)


class SharePointConnector:
    """A SharePoint document library or a OneDrive as a :class:`index.sources.contract.Connector`.

    Args:
        settings: the tenant, the app and the drive.
        token: the app's client secret.
        sleep: how a wait is waited (tests record it).
        clock: the time now, which tells an expired sharing from one still to expire.
        budget_seconds: the most one call waits for retries before the run fails.
        timeout: seconds for one HTTP request.
        max_bytes: the largest file downloaded (the knowledge base's default upload limit).
        download_seconds: the most one file's download may take, its retries included.
    """

    kind = "sharepoint"

    def __init__(
        self,
        settings: SharePointSettings,
        token: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        budget_seconds: float = DEFAULT_BUDGET_SECONDS,
        timeout: int = 30,
        max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
        download_seconds: float = DEFAULT_DOWNLOAD_TIMEOUT,
    ) -> None:
        if not token:
            raise SourceError(
                "No SharePoint client secret: set KB_SHAREPOINT_CLIENT_SECRET "
                "(or the secret file the source names)."
            )
        self.settings = settings
        self.sleep = sleep
        self.clock = clock
        self.budget_seconds = budget_seconds
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.download_seconds = download_seconds
        self.http = requests.Session()
        _hide_download_queries()
        self._secret = token
        self._app: msal.ConfidentialClientApplication | None = None
        self._drive_url = ""
        self._members: dict[str, GroupMembers] = {}

    # ------------------------------------------------------------ the contract

    def load(self) -> Batch:
        """Every file of the drive, and its delta link."""
        try:
            return self._changes(f"{self._drive()}/root/delta")
        except _ResyncRequired:
            raise SourceFailed("Microsoft Graph refused a fresh delta (HTTP 410).") from None

    def poll(self, checkpoint: str) -> Batch:
        """The files changed since ``checkpoint`` (a delta link); a full load when it expired."""
        if not checkpoint.startswith(self.settings.graph_url + "/"):
            raise SourceFailed(
                "The saved checkpoint is not a Graph delta link; kb source sync --full reloads."
            )
        try:
            return self._changes(checkpoint)
        except _ResyncRequired:
            log.info("SharePoint's delta link expired (HTTP 410): loading the drive again")
            return self.load()

    def listing(self) -> frozenset[str]:
        """The ids of every file of the drive now (a full delta of ids, or it raises)."""
        items, _ = self._delta(f"{self._drive()}/root/delta?$select=id,name,file,folder,deleted")
        return frozenset(i for i, entry in items.items() if _file_name(entry) is not None)

    def permissions(self, items: Iterable[str]) -> dict[str, Acl]:
        """Each file's current Acl (unknown where it cannot be read)."""
        return {item: self._acl(item) for item in items}

    def groups(self, names: Iterable[str]) -> list[GroupMembers]:
        """The members of each group, by email (a site group's cannot be read: nobody)."""
        return [self._group(name) for name in names]

    # ------------------------------------------------------------ files

    def _changes(self, url: str) -> Batch:
        items, delta_link = self._delta(url, resync=True)
        failed: list[tuple[str, str]] = []
        return Batch(self._documents(items, failed), delta_link, failed)

    def _delta(self, url: str, *, resync: bool = False) -> tuple[dict[str, dict[str, Any]], str]:
        """Each item of a delta by id (its last occurrence), and the delta link it ends with."""
        items: dict[str, dict[str, Any]] = {}
        last: dict[str, Any] = {}
        for page in self._pages(url, resync=resync):
            for entry in _values(page):
                if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                    raise SourceFailed("Microsoft Graph's delta answered an entry that is no item.")
                if entry["id"] in items:
                    log.info(
                        "SharePoint's delta listed item %s twice; the last counts", entry["id"]
                    )
                    del items[entry["id"]]
                items[entry["id"]] = entry
            last = page
        delta_link = last.get("@odata.deltaLink")
        if not isinstance(delta_link, str) or not delta_link.startswith(self.settings.graph_url):
            raise SourceFailed("Microsoft Graph ended the delta without a delta link of its own.")
        return items, delta_link

    def _documents(
        self, items: dict[str, dict[str, Any]], failed: list[tuple[str, str]]
    ) -> Iterator[SourceDocument]:
        for item, entry in items.items():
            name = _file_name(entry)
            if name is None:
                continue  # a folder, the root, a deleted item or a format not read
            try:
                data = self._content(item, entry, name)
            except _Malformed as exc:
                failed.append((item, str(exc)))
                continue
            if data is None:
                continue  # deleted since it was listed: the next listing prunes it
            yield SourceDocument(
                item=item,
                title=PurePosixPath(name).stem.strip() or name,
                url=self._web_url(entry),
                data=data,
                filename=name,
                media_type=media_type_of(name),
                acl=self._acl(item),
                version=str(entry.get("cTag") or entry.get("eTag") or ""),
            )

    def _content(self, item: str, entry: dict[str, Any], name: str) -> bytes | None:
        """The file's bytes, through the download address Graph redirects to, read as they
        come: at most ``max_bytes``, within ``download_seconds`` from the first request.

        Raises:
            _Malformed: too large, too slow, or sent elsewhere; SourceFailed: cut off.
        """
        size = entry.get("size")
        if isinstance(size, int) and size > self.max_bytes:
            raise _Malformed(too_large(name, self.max_bytes).reason)
        deadline = Deadline.start(self.download_seconds, self.clock)
        try:
            response = self._download(item, deadline, name)
            if response is None:
                return None
            return read_capped(response, name, max_bytes=self.max_bytes, deadline=deadline)
        except ExtractionError as exc:
            raise _Malformed(exc.reason) from None
        except requests.RequestException:
            raise SourceFailed(f"Microsoft Graph cut off the download of {name}.") from None

    def _download(self, item: str, deadline: Deadline, name: str) -> requests.Response | None:
        """The answer with the file's bytes, not read yet; ``None``: gone since it was listed."""
        url = f"{self._drive()}/items/{quote(item, safe='')}/content"
        response = self._call(url, missing=True)
        if response is None:
            return None
        if response.is_redirect:
            location = response.headers.get("Location") or ""
            response.close()
            if not self._may_download_from(location):
                raise _Malformed(
                    "Graph pointed the file's download at an unexpected host; refused."
                )
            # The address is pre-authorised: the token is not sent there.
            deadline.check(name)
            response = self._call(location, missing=True, signed=False)
        return response

    def _may_download_from(self, url: str) -> bool:
        scheme, host = origin(url)
        if (scheme, host) == origin(self.settings.graph_url):
            return True
        hostname = (urlsplit(url).hostname or "").lower()
        return scheme == "https" and any(
            hostname == h or hostname.endswith("." + h) for h in self.settings.download_hosts
        )

    def _web_url(self, entry: dict[str, Any]) -> str:
        """The file's ``webUrl`` when on an expected host ("open in SharePoint"), else none."""
        url = entry.get("webUrl")
        if isinstance(url, str) and self._may_download_from(url):
            return url
        return ""

    def _drive(self) -> str:
        """The drive's Graph address, the site's default library found once."""
        if not self._drive_url:
            graph = self.settings.graph_url
            drive = self.settings.drive
            if not drive:
                site = self._json(self._call(f"{graph}/sites/{_site_path(self.settings.site)}"))
                library = self._json(self._call(f"{graph}/sites/{site.get('id')}/drive"))
                drive = str(library.get("id") or "")
                if not _DRIVE.fullmatch(drive):
                    raise SourceFailed("Microsoft Graph gave the site's library without an id.")
            self._drive_url = f"{graph}/drives/{quote(drive, safe='!')}"
        return self._drive_url

    # ------------------------------------------------------------ permissions

    def _acl(self, item: str) -> Acl:
        try:
            rows = self._collect(
                f"{self._drive()}/items/{quote(item, safe='')}/permissions", hidden=True
            )
        except _Unreadable as exc:
            log.warning("SharePoint item %s: %s; nobody may read it", item, exc)
            return UNKNOWN_ACL
        grants: list[tuple[str, str, float | None]] = []
        now = self.clock()
        for row in rows:
            if not isinstance(row, dict):
                log.warning("SharePoint item %s: a permission that is no object; nobody", item)
                return UNKNOWN_ACL
            if _expired(row, now):
                continue  # a sharing past its expirationDateTime opens nothing
            until = _until(row)
            link = row.get("link")
            if isinstance(link, dict):
                kind = link.get("type")
                if not isinstance(kind, str) or kind not in READING_LINKS:
                    continue  # an upload-only link (a file request), or a type not known
                scope = link.get("scope")
                if scope in ("organization", "anonymous"):
                    grants.append(("public", "", until))
                if scope == "users":
                    grants += [("user", e, until) for e in _identity_emails(row)]
                continue  # existingAccess, or a scope not known: it adds nobody
            grants += [("user", e, until) for e in _identity_emails(row)]
            granted = row.get("grantedToV2") or row.get("grantedTo") or {}
            for entry, name in _granted_groups(granted):
                # A group stands for everyone by its id; a site group by its name, unique
                # in its site. A group's display name is anyone's to choose: it says nothing.
                if entry in self.settings.organisation_groups or (
                    entry.startswith(SITE_GROUP_PREFIX)
                    and name in self.settings.organisation_groups
                ):
                    grants.append(("public", "", until))
                else:
                    grants.append(("group", entry, until))
        return Acl.granting(grants)

    def _group(self, name: str) -> GroupMembers:
        if name not in self._members:
            self._members[name] = self._expand(name)
        return self._members[name]

    def _expand(self, name: str) -> GroupMembers:
        if name.startswith(SITE_GROUP_PREFIX) or not _DRIVE.fullmatch(name):
            return GroupMembers(name, frozenset(), complete=False)
        url = (
            f"{self.settings.graph_url}/groups/{quote(name, safe='')}/transitiveMembers"
            "?$select=id,mail,userPrincipalName"
        )
        emails: set[str] = set()
        complete = True
        try:
            for row in self._collect(url, hidden=True):
                if not isinstance(row, dict) or row.get("@odata.type") != "#microsoft.graph.user":
                    continue  # nested groups' own entries, devices, apps: their people are listed
                email = _member_email(row)
                complete = complete and email is not None
                emails.update([email] if email else [])
        except (_Unreadable, SourceFailed) as exc:
            if isinstance(exc, SourceCredentialsRejected):
                raise
            log.warning("SharePoint group %s: %s; its members count as nobody", name, exc)
            complete = False
        return GroupMembers(name, frozenset(emails), complete)

    # ------------------------------------------------------------ calls

    def _collect(self, url: str, *, hidden: bool = False) -> list[Any]:
        """Every value of a paged answer (a 404 is none: the item went since it was listed)."""
        return [v for page in self._pages(url, hidden=hidden, missing=True) for v in _values(page)]

    def _pages(
        self, url: str, *, hidden: bool = False, missing: bool = False, resync: bool = False
    ) -> Iterator[dict[str, Any]]:
        """Each page of a paged answer, following ``@odata.nextLink`` on Graph's host only."""
        following: str | None = url
        listing = Listing("Microsoft Graph", url)
        while True:
            if following is None:
                return
            response = self._call(following, hidden=hidden, missing=missing, resync=resync)
            if response is None:
                return
            page = self._json(response)
            if not isinstance(page.get("value"), list):
                raise SourceFailed("Microsoft Graph answered a list that is not JSON of values.")
            yield page
            following = page.get("@odata.nextLink")
            if following is not None and (
                not isinstance(following, str)
                or not following.startswith(self.settings.graph_url + "/")
            ):
                raise SourceFailed(
                    "Microsoft Graph pointed the next page at another site; refused."
                )
            following = following and listing.next_page(following, empty=not page["value"])

    @staticmethod
    def _json(response: requests.Response | None) -> dict[str, Any]:
        try:
            data = response.json() if response is not None else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise SourceFailed("Microsoft Graph answered something that is not JSON.")
        return data

    def _call(
        self,
        url: str,
        *,
        missing: bool = False,
        hidden: bool = False,
        resync: bool = False,
        signed: bool = True,
    ) -> requests.Response | None:
        """GET ``url``, waiting out 429s, 5xx and dropped connections within the budget.

        ``missing``: a 404 is ``None``. ``hidden``: a 403 or 404 is what Graph will not
        show the app (:class:`_Unreadable`). ``resync``: a 410 is an expired delta link.
        ``signed``: sent with the app's token (not to a pre-authorised download address).

        Raises:
            SourceCredentialsRejected: 401 twice (a fresh token too), or 403.
            SourceFailed: the budget is spent, or any other error.
        """
        budget = RetryBudget("Microsoft Graph", self.budget_seconds, self.sleep)
        fresh = False

        def get() -> requests.Response:
            nonlocal fresh
            response = self._get(url, signed=signed)
            if response.status_code == 401 and signed and not fresh:
                response.close()
                self._forget_token()  # expired or revoked early: one fresh token
                fresh = True
                response = self._get(url, signed=signed)
            if response.status_code >= 400:
                response.close()
                raise _Refused(response)
            return response

        try:
            return budget.run(get, _transient)
        except _Refused as exc:
            response, status = exc.response, exc.response.status_code
            if status == 404 and hidden:
                raise _Unreadable(
                    "Graph does not show this item's permissions to the app"
                ) from None
            if status == 404 and missing:
                return None
            if status == 403 and hidden:
                raise _Unreadable("Graph will not show them to the app") from None
            if status == 410 and resync:
                raise _ResyncRequired() from None
            if status in (401, 403) and signed:
                raise SourceCredentialsRejected(
                    f"Microsoft Graph refused the app's token (HTTP {status}): the app lost "
                    "its permission to this drive (Sites.Selected or Files.Read.All), or its "
                    "consent was revoked. Grant it again, or make a new client secret and set it."
                ) from None
            if status in (401, 403):
                raise _Malformed(
                    f"The download address refused the request (HTTP {status})."
                ) from None
            raise SourceFailed(
                f"Microsoft Graph answered HTTP {status}{_code(response)}."
            ) from None

    def _get(self, url: str, *, signed: bool) -> requests.Response:
        """One GET of ``url`` (``signed``: with the app's token), its body not yet read.

        A pre-authorised download address (not ``signed``) is asked with its query kept
        out of urllib3's log lines: the ``tempauth`` there reads the file for an hour.
        """
        # The bytes as stored: a file's are counted as they come (``read_capped``).
        headers = {**PLAIN, "Authorization": f"Bearer {self._token()}"} if signed else PLAIN
        with contextlib.nullcontext() if signed else _downloading():
            return self.http.get(
                url, headers=headers, timeout=self.timeout, allow_redirects=False, stream=True
            )

    # ------------------------------------------------------------ tokens

    def _token(self) -> str:
        """An app-only access token for Graph (msal keeps it until it expires)."""
        scope = "{}://{}/.default".format(*origin(self.settings.graph_url))
        try:
            result = self._client().acquire_token_for_client(scopes=[scope])
        except (requests.RequestException, MsalError, ValueError, RuntimeError) as exc:
            # msal keeps a failed answer for its Retry-After (on the real clock): asking again
            # at once would not ask; the next sync does.
            raise SourceFailed(
                f"Microsoft's sign-in service gave no token ({type(exc).__name__}): unreachable "
                "or failing; the next sync asks again."
            ) from None
        token = result.get("access_token") if isinstance(result, dict) else None
        if isinstance(token, str) and token:
            return token
        error = str((result or {}).get("error") or "no token")
        code = _aadsts((result or {}).get("error_description"))
        if error in _REJECTED:
            raise SourceCredentialsRejected(
                f"Microsoft's sign-in refused the app ({error}{code}): the client secret expired "
                "or was revoked, or the app is not in this tenant. Make a new secret and set "
                "KB_SHAREPOINT_CLIENT_SECRET (or the source's secret file)."
            )
        raise SourceFailed(f"Microsoft's sign-in gave no token ({error}{code}).")

    def _client(self) -> msal.ConfidentialClientApplication:
        if self._app is None:
            authority = f"{self.settings.authority_url}/{self.settings.tenant}"
            try:
                self._app = msal.ConfidentialClientApplication(
                    self.settings.client_id,
                    client_credential=self._secret,
                    authority=authority,
                    # The authority is the configured one, not checked with login.microsoftonline.com.
                    instance_discovery=False,
                    http_client=self.http,
                )
            except ValueError:
                raise SourceCredentialsRejected(
                    f"Microsoft's sign-in service knows no tenant {self.settings.tenant!r} at "
                    f"{self.settings.authority_url}."
                ) from None
        return self._app

    def _forget_token(self) -> None:
        if self._app is not None:
            self._app.remove_tokens_for_client()


class _Malformed(Exception):
    """A file that could not be taken (too large, its download refused or sent elsewhere)."""


class _Unreadable(Exception):
    """Permissions that could not be read: the file is unknown."""


class _ResyncRequired(Exception):
    """Graph no longer serves changes from this delta link (HTTP 410)."""


def _values(page: dict[str, Any]) -> list[Any]:
    values = page.get("value")
    return values if isinstance(values, list) else []


def _file_name(entry: dict[str, Any]) -> str | None:
    """The file's name when it is a file the product reads (not deleted, not a folder)."""
    if entry.get("deleted") is not None or not isinstance(entry.get("file"), dict):
        return None
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip() or "/" in name or "\x00" in name:
        return None
    return name if readable_suffix(name, "") else None


def _site_path(site: str) -> str | None:
    """``host:/sites/NAME`` for Graph's ``/sites/{host}:/{path}``, from a site's address."""
    parts = urlsplit(site if "://" in site else f"https://{site}")
    host, path = (parts.hostname or ""), parts.path.rstrip("/")
    if parts.scheme != "https" or not host or not re.fullmatch(r"(/[^/?#\s]+)*", path):
        return None
    return f"{host}:{path}" if path else host


def _emails_of(identity: object) -> Iterator[str]:
    """The emails of an identity set's person (``user``, ``siteUser``)."""
    if not isinstance(identity, dict):
        return
    for kind in ("user", "siteUser"):
        person = identity.get(kind)
        email = person.get("email") if isinstance(person, dict) else None
        if isinstance(email, str) and "@" in email:
            yield email.strip().lower()


def _identity_emails(row: dict[str, Any]) -> Iterator[str]:
    """The people a permission names: ``grantedToV2`` and ``grantedToIdentitiesV2``."""
    yield from _emails_of(row.get("grantedToV2") or row.get("grantedTo"))
    for key in ("grantedToIdentitiesV2", "grantedToIdentities"):
        identities = row.get(key)
        for identity in identities if isinstance(identities, list) else []:
            yield from _emails_of(identity)


def _granted_groups(granted: object) -> Iterator[tuple[str, str]]:
    """``(Acl group entry, display name)`` of the groups an identity set names."""
    if not isinstance(granted, dict):
        return
    group = granted.get("group")
    if isinstance(group, dict) and isinstance(group.get("id"), str) and group["id"]:
        yield group["id"], str(group.get("displayName") or "")
    site_group = granted.get("siteGroup")
    if isinstance(site_group, dict) and (site_group.get("displayName") or site_group.get("id")):
        name = str(site_group.get("displayName") or site_group.get("id"))
        yield f"{SITE_GROUP_PREFIX}{name}", name


def _expired(row: dict[str, Any], now: float) -> bool:
    """Whether a permission's ``expirationDateTime`` has passed at ``now`` (epoch seconds);
    Graph's ``DateTime.MinValue`` (year 1) says none is set."""
    value = row.get("expirationDateTime")
    return not _unset(value) and expired(value, now)


def _until(row: dict[str, Any]) -> float | None:
    """When a permission not expired stops admitting (its ``expirationDateTime``, epoch
    seconds); ``None``: it lasts."""
    value = row.get("expirationDateTime")
    return None if _unset(value) else expiry(value)


def _unset(value: object) -> bool:
    """Whether an ``expirationDateTime`` says none is set: Graph's ``DateTime.MinValue``
    (year 1)."""
    when = timestamp(value)
    return when is not None and when.year == 1


def _member_email(row: dict[str, Any]) -> str | None:
    """A member's email: ``mail``, else a ``userPrincipalName`` that is one (not a guest's)."""
    for key in ("mail", "userPrincipalName"):
        value = row.get(key)
        if isinstance(value, str) and "@" in value and "#EXT#" not in value.upper():
            return value.strip().lower()
    return None


# Whether this context is asking a pre-authorised download address: urllib3 logs the
# address of every request (and of a retry, and of an answer it cannot parse), query and
# all, and a download address's query authorises reading the file.
_DOWNLOADING: ContextVar[bool] = ContextVar("sharepoint_downloading", default=False)
_URLLIB3_LOGGERS = ("urllib3.connectionpool", "urllib3.connection", "urllib3.util.retry")
_QUERY = re.compile(r"\?[^\s'\"()]*")
_HIDDEN = "?[query hidden]"


@contextlib.contextmanager
def _downloading() -> Iterator[None]:
    """This context asks a download address until the block ends."""
    token = _DOWNLOADING.set(True)
    try:
        yield
    finally:
        _DOWNLOADING.reset(token)


class _HideDownloadQuery(logging.Filter):
    """urllib3's records made while a download address is asked, with every query hidden.

    Records made anywhere else, by this connector's Graph calls or by any other code, pass
    as they are: no logger's level changes, nothing else is hidden.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if _DOWNLOADING.get():
            record.msg = _QUERY.sub(_HIDDEN, str(record.msg))
            if isinstance(record.args, tuple):
                record.args = tuple(
                    _QUERY.sub(_HIDDEN, str(a)) if isinstance(a, str | Exception) else a
                    for a in record.args
                )
        return True


_FILTER = _HideDownloadQuery()


def _hide_download_queries() -> None:
    """Give urllib3's loggers the filter (once: a logger keeps one copy of a filter)."""
    for name in _URLLIB3_LOGGERS:
        logging.getLogger(name).addFilter(_FILTER)


class _Refused(Exception):
    """An HTTP error status Graph or a download address answered (the body closed)."""

    def __init__(self, response: requests.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _transient(exc: Exception) -> Retry | None:
    """A 429 or 503 (their ``Retry-After``), another 5xx or a dropped connection."""
    if isinstance(exc, _Refused):
        status = exc.response.status_code
        if status in (429, 503):
            return Retry(f"HTTP {status}", retry_after(exc.response.headers.get("Retry-After")))
        return Retry(f"HTTP {status}") if status >= 500 else None
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return Retry("unreachable")
    return None


def _code(response: requests.Response) -> str:
    """Graph's error code (``itemNotFound``...), for the message; never the whole body."""
    try:
        code = (response.json().get("error") or {}).get("code")
    except (ValueError, AttributeError):
        return ""
    return f" ({code})" if isinstance(code, str) and re.fullmatch(r"\w{1,64}", code) else ""


def _aadsts(description: object) -> str:
    """The ``AADSTS…`` code a sign-in error starts with, for the message."""
    found = re.match(r"(AADSTS\d+)", description) if isinstance(description, str) else None
    return f", {found.group(1)}" if found else ""
