"""The error tree in ``index.errors``' docstring names every error the product defines."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import index.errors
from core.errors import LinkSecretUnavailable
from core.links import SECRET_FILENAME, load_or_create_secret
from index.errors import DatabaseUnavailable, KBError, OriginalMissing, QueryNotFound
from index.storage.store import Store

PACKAGES = ("index", "core", "evaluation", "bot")
# One line of the tree: its drawing, then the class name.
_TREE_LINE = re.compile(r"^\s*((?:[│ ] {3})*)[├└]── (\w+)")


def _documented_tree() -> dict[str, str]:
    """Each class in the docstring's tree, with the class it sits under."""
    doc = index.errors.__doc__ or ""
    parents: dict[str, str] = {}
    path = ["KBError"]
    for line in doc.splitlines():
        m = _TREE_LINE.match(line)
        if m is None:
            continue
        depth = len(m.group(1)) // 4 + 1
        del path[depth:]
        parents[m.group(2)] = path[-1]
        path.append(m.group(2))
    return parents


def _defined_errors() -> list[type[KBError]]:
    """Every subclass of ``KBError`` defined in the product's packages."""
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
    found: list[type[KBError]] = []
    todo = list(KBError.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.split(".")[0] in PACKAGES:
            found.append(cls)
    return found


def test_the_error_tree_lists_every_error_under_its_parent() -> None:
    documented = _documented_tree()
    defined = {cls.__name__: cls.__bases__[0].__name__ for cls in _defined_errors()}
    assert documented == defined


def test_the_new_errors_keep_their_messages(tmp_path: Path) -> None:
    store = Store(tmp_path / "kb-data")
    with pytest.raises(QueryNotFound, match=r"^No logged question has id 42\.$"):
        store.queries.get(42)
    with pytest.raises(OriginalMissing, match=r"^The stored original 0123456789ab is missing"):
        store.read_original("0123456789ab" * 4)
    (tmp_path / "kb-data" / SECRET_FILENAME).write_text("\n")
    with pytest.raises(LinkSecretUnavailable, match=r"link secret file .* is empty"):
        load_or_create_secret(tmp_path / "kb-data", "")
    (tmp_path / "other" / "kb.sqlite").mkdir(parents=True)  # where the database file should be
    with pytest.raises(
        DatabaseUnavailable, match=r"^Cannot open the database .*: (unable to open|Is a directory)"
    ):
        Store(tmp_path / "other")
    assert all(
        issubclass(cls, KBError)
        for cls in (QueryNotFound, OriginalMissing, LinkSecretUnavailable, DatabaseUnavailable)
    )
