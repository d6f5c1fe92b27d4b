"""Who reads a source, changed in place (``kb source readers``), for every kind alike.

Some of a source's settings are the admin's word on who reads it, not the
source's: a Notion source's readers, a Drive source's ``anyone_public``, the
organisation groups of Confluence and SharePoint. Each kind's settings class
names them (``READERS``) and says, in ``acl_now``, what an already-synced
document's permissions become when they change, without asking the source.

A change is one transaction: the new settings, every synced document's
permissions rewritten (recorded as not read from the source, so that the next
sync reads every one of them again), and an audit entry. What the new readers no longer
admit is hidden before the command returns; what they newly admit and only the
source can tell (which Drive files have a link anyone may open, who a group
holds) comes with the next sync, which reads every permission again. Naming no
reader is a change too: the kind's readers are then none (a Notion source is
read by nobody). The source's lock is held, so a run that started with the old
readers cannot write them back over the new ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from index.knowledge_base import KnowledgeBase
from index.models import AuditAction
from index.records import AuditEntry
from index.sources.contract import Acl, SourceError
from index.sources.kinds import kind_of, settings_of

__all__ = ["ReadersChange", "change_readers"]


@dataclass(frozen=True)
class ReadersChange:
    """What ``kb source readers`` changed.

    Attributes:
        source: the source's name.
        kind: its kind.
        before: its reader settings before.
        after: its reader settings now.
        documents: the synced documents whose permissions were rewritten.
    """

    source: str
    kind: str
    before: dict[str, Any]
    after: dict[str, Any]
    documents: int

    def as_dict(self) -> dict[str, Any]:
        """As JSON."""
        return {
            "source": self.source,
            "kind": self.kind,
            "before": self.before,
            "after": self.after,
            "documents": self.documents,
        }


def _option(setting: str) -> str:
    """The ``kb source`` option that sets the reader setting ``setting`` (``users``: ``--user``)."""
    return "--" + setting.replace("_", "-").removesuffix("s")


def _reader_settings(kind: str) -> tuple[str, ...]:
    """The settings of ``kind`` that say who reads a source of it (none: a kind whose
    readers are all the source's to say).

    Raises:
        SourceError: an unknown kind.
    """
    found = kind_of(kind)
    readers: tuple[str, ...] = getattr(found.load(found.settings_class), "READERS", ())
    return readers


def change_readers(
    kb: KnowledgeBase, name: str, readers: dict[str, Any], *, actor: str = "cli"
) -> ReadersChange:
    """Make ``readers`` the reader settings of source ``name``, at once, audited.

    ``readers`` holds the reader settings named; the kind's others become
    none (an empty list, false). Every synced document's recorded permissions
    become what the kind's ``acl_now`` says, in the transaction that records
    the new settings and the audit entry.

    Raises:
        UnknownSource: no source is named ``name``.
        SourceError: a setting the kind does not have, one it cannot use, or a
            sync of the source running now.
    """
    records = kb.store.sources
    row = records.get(name)
    names = _reader_settings(row.kind)
    if not names:
        raise SourceError(
            f"Source {name} ({row.kind}) names no readers of its own: its documents are read by "
            "whom the source's permissions admit."
        )
    foreign = [_option(s) for s in readers if s not in names]
    if foreign:
        raise SourceError(
            f"Source {name} ({row.kind}) has no reader option {', '.join(foreign)}; its readers "
            f"are set with {', '.join(_option(s) for s in names)}."
        )
    settings = settings_of(row.kind, {**row.settings, **{s: readers.get(s) for s in names}})
    found = kind_of(row.kind)
    before = found.load(found.settings_class).from_dict(row.settings)
    after = found.load(found.settings_class).from_dict(settings)
    with kb.store.exclusive(f"source-{name}") as acquired:
        if not acquired:
            raise SourceError(
                f"Source {name} is syncing now; change its readers again when the run ends."
            )
        if records.get(name).settings != row.settings:
            raise SourceError(
                f"Source {name}'s settings changed while its readers were being changed; "
                "run the command again."
            )
        items = records.items(name)
        with kb.store.transaction():
            records.set_settings(name, settings)
            for item in items.values():
                acl = after.acl_now(before, Acl.from_entries(records.acl_rows(item.scope)))
                records.set_acl(item.scope, acl.entries, read=False)
            change = ReadersChange(
                name,
                row.kind,
                {s: row.settings.get(s) for s in names},
                {s: settings.get(s) for s in names},
                len(items),
            )
            kb.store.audit_log.add(
                AuditEntry(
                    actor=actor,
                    action=AuditAction.READERS,
                    name=name,
                    detail=f"source {name}: {_described(change.before)} -> "
                    f"{_described(change.after)}; {len(items)} documents",
                )
            )
    return change


def _described(readers: dict[str, Any]) -> str:
    """Reader settings for a person: ``users=a@x.com b@x.com, public=no``."""
    parts = []
    for setting, value in readers.items():
        if isinstance(value, bool):
            shown = "yes" if value else "no"
        else:
            shown = " ".join(str(v) for v in value or ()) or "none"
        parts.append(f"{setting}={shown}")
    return ", ".join(parts)
