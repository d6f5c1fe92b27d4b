"""Sources documents are synced from with their permissions: Confluence, Drive, SharePoint, Notion.

``contract`` is what every source gives (:class:`Connector`: a full load, a
poll from a checkpoint, a slim listing to prune what was deleted, a separate
permission sync; :class:`SourceDocument`, :class:`Acl`), ``sync`` one run of a
source into the knowledge base through the upload path, ``kinds`` the kinds
there are and how a configured one is opened with its credential, ``readers``
who reads a source changed in place (``kb source readers``),
``confluence`` Confluence through ``atlassian-python-api``, ``sharepoint``
SharePoint and OneDrive through Microsoft Graph (tokens by ``msal``),
``notion`` Notion through ``notion-client``, ``gdrive`` Google Drive through
``google-api-python-client``, ``retry`` the back-off within a budget they
share, ``fields`` the times, checkpoints, file names and pages of a listing
they read alike, ``downloads`` a file's bytes read within the upload limit and
the download deadline. Who
a document's permissions admit is ``bot.access``'s to decide.
"""

from __future__ import annotations

from index.sources.contract import (
    SOURCE_SCOPE_PREFIX,
    UNKNOWN_ACL,
    Acl,
    Batch,
    ChangedPermissions,
    Connector,
    GroupMembers,
    SourceCredentialsRejected,
    SourceDocument,
    SourceError,
    SourceFailed,
    is_source_scope,
    source_scope,
)
from index.sources.downloads import DownloadLimits
from index.sources.kinds import KINDS, TOKEN_SETTINGS, check_name, open_connector, settings_of
from index.sources.readers import ReadersChange, change_readers
from index.sources.sync import (
    SourceSyncReport,
    acl_of_scope,
    document_source,
    open_and_sync,
    remove_source_documents,
    source_health,
    sync_due_sources,
    sync_source,
)

__all__ = [
    "Acl",
    "Batch",
    "ChangedPermissions",
    "Connector",
    "DownloadLimits",
    "GroupMembers",
    "KINDS",
    "ReadersChange",
    "SOURCE_SCOPE_PREFIX",
    "SourceCredentialsRejected",
    "SourceDocument",
    "SourceError",
    "SourceFailed",
    "SourceSyncReport",
    "TOKEN_SETTINGS",
    "UNKNOWN_ACL",
    "acl_of_scope",
    "change_readers",
    "check_name",
    "document_source",
    "is_source_scope",
    "open_and_sync",
    "open_connector",
    "remove_source_documents",
    "settings_of",
    "source_health",
    "source_scope",
    "sync_due_sources",
    "sync_source",
]
