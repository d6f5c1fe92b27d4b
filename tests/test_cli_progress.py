"""Long ``kb`` work shows its progress per batch of passages embedded, not only per document:
a document of hundreds of passages moves on the bar's line while it is embedded."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner, Result

from bot.cli import main

NAME = "handbook.md"
# What ``ProgressBar.embedding`` shows beside the bar, e.g. ``handbook.md: 64/210 passages``.
SHOWN = re.compile(re.escape(NAME) + r": ([\d,]+)/([\d,]+) passages")
TOPICS = ("travel", "payroll", "laptops", "parking", "holidays", "badges", "printing")


def _long_document(sections: int, version: str) -> str:
    """Markdown of ``sections`` short sections, each a passage of its own (short, so that
    embedding the many passages the bar needs costs little)."""
    parts = [
        f"## Section {i}: {TOPICS[i % len(TOPICS)]}\n\n"
        f"Rule {i} of the {TOPICS[i % len(TOPICS)]} policy ({version}) says that request "
        f"number {i * 31} goes to desk {i % 7} of team {i % 13} before day {i % 28 + 1}.\n"
        for i in range(sections)
    ]
    return f"# Handbook {version}\n\n" + "\n".join(parts)


def _kb(data_dir: Path, *args: str) -> Result:
    result = CliRunner().invoke(main, ["--data-dir", str(data_dir), *args])
    assert result.exit_code == 0, result.output
    return result


def _passages_shown(stderr: str) -> list[tuple[int, int]]:
    """Each ``(done, total)`` the bar showed for the document, in order."""
    return [(int(d.replace(",", "")), int(t.replace(",", ""))) for d, t in SHOWN.findall(stderr)]


def _moved_within_the_document(shown: list[tuple[int, int]], chunks: int) -> None:
    """The bar showed the document from none of its passages to all, through some between."""
    assert {total for _, total in shown} == {chunks}
    done = [d for d, _ in shown]
    assert done == sorted(done), "it only moves on"
    assert done[0] == 0 and done[-1] == chunks
    assert any(0 < d < chunks for d in done), f"no step within the document: {done}"


def test_ingest_reindex_and_restore_show_passages_embedded_within_one_document(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "kb"
    for version in ("v1", "v2"):
        folder = tmp_path / version
        folder.mkdir()
        (folder / NAME).write_text(_long_document(70, version), encoding="utf-8")
        ingested = _kb(data_dir, "ingest", str(folder / NAME))
        chunks = int(re.search(r"1 indexed \((\d+) chunks\)", ingested.stdout).group(1))  # type: ignore[union-attr]
        assert chunks > 64, "more passages than one batch of the encoder (64)"
        _moved_within_the_document(_passages_shown(ingested.stderr), chunks)

    reindexed = _kb(data_dir, "reindex")
    assert "Reindexed 1 documents" in reindexed.stdout  # the replaced v1 is left alone
    _moved_within_the_document(_passages_shown(reindexed.stderr), chunks)
    assert "1/1" in reindexed.stderr, "the document bar counts the document once done"

    restored = _kb(data_dir, "restore", NAME)
    v1_chunks = int(re.search(r"\((?:#\d+, )?(\d+) chunks\)", restored.stdout).group(1))  # type: ignore[union-attr]
    # One document: the bar counts its passages.
    counted = [(int(d), int(t)) for d, t in re.findall(r"(\d+)/(\d+) \[", restored.stderr)]
    _moved_within_the_document(counted, v1_chunks)

    quiet = _kb(data_dir, "reindex", "--json")
    assert json.loads(quiet.stdout)["documents"] == 1
    assert not _passages_shown(quiet.stderr), "--json draws no bar"
