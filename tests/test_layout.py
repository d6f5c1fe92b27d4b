"""CONTRIBUTING.md's map of the rooms is the tree's: every package is a room in it, and every room
and module it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_ROOM_ROW = re.compile(r"^\| `([a-z_/]+/)` \| (.*) \|$", re.MULTILINE)
_MAPPED = ("bot", "core", "index", "evaluation", "studies")


def _rooms() -> dict[str, str]:
    """CONTRIBUTING.md's table of rooms: folder -> what it says is there."""
    return dict(_ROOM_ROW.findall((ROOT / "CONTRIBUTING.md").read_text()))


def test_contributing_names_every_package_as_a_room() -> None:
    packages = {
        f"{p.parent.relative_to(ROOT)}/"
        for part in _MAPPED
        for p in (ROOT / part).rglob("__init__.py")
        if "sets" not in p.parts and "static" not in p.parts
    }
    assert packages and packages <= set(_rooms()), sorted(packages - set(_rooms()))


def test_every_room_and_module_contributing_names_exists() -> None:
    missing = []
    for room, text in _rooms().items():
        folder = ROOT / room
        if not folder.is_dir():
            missing.append(room)
            continue
        for name in re.findall(r"`([a-z_]+)`", text):
            if not ((folder / f"{name}.py").is_file() or (folder / name).is_dir()):
                missing.append(f"{room}{name}")
    assert missing == []
    paths = re.findall(
        r"`((?:bot|core|index|evaluation|studies|bench|tests)/[\w/]*\.py)`",
        (ROOT / "CONTRIBUTING.md").read_text(),
    )
    assert paths and [p for p in paths if not (ROOT / p).is_file()] == []
