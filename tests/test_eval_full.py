"""bench/eval_full.py keeps one generated block per bundled set in docs/evaluation-tables.md."""

from __future__ import annotations

import re

from bench.eval_full import (
    LEGACY_BEGIN,
    LEGACY_END,
    begin,
    end,
    plot_path,
    replace_block,
    revision,
)


def _block(name: str, body: str) -> str:
    return f"{begin(name)}\n{body}\n{end(name)}"


def test_a_sets_block_is_replaced_and_the_prose_kept() -> None:
    text = "# Title\n\nprose\n\n" + _block("pip-black", "old") + "\n\nmore prose\n"
    out = replace_block(text, "pip-black", _block("pip-black", "new"))
    assert out == "# Title\n\nprose\n\n" + _block("pip-black", "new") + "\n\nmore prose\n"


def test_the_single_block_of_older_pages_becomes_the_default_sets() -> None:
    text = f"intro\n\n{LEGACY_BEGIN}\nold numbers\n{LEGACY_END}\n\nafter\n"
    out = replace_block(text, "pip-black", _block("pip-black", "new"))
    assert LEGACY_BEGIN not in out and "old numbers" not in out
    assert out.startswith("intro\n\n" + begin("pip-black")) and out.endswith("\n\nafter\n")


def test_another_set_gets_its_own_block_at_the_end() -> None:
    text = "intro\n\n" + _block("pip-black", "numbers")
    out = replace_block(text, "prometheus", _block("prometheus", "other numbers"))
    assert out.startswith(text)
    assert out.endswith(
        "## Results on the prometheus set\n\n" + _block("prometheus", "other numbers") + "\n"
    )
    # Replacing it again does not touch the first set's block.
    again = replace_block(out, "prometheus", _block("prometheus", "newer"))
    assert "numbers\n" + end("pip-black") in again and "other numbers" not in again


def test_plots_are_named_per_set() -> None:
    assert plot_path("pip-black").name == "evaluation.png"
    assert plot_path("prometheus").name == "evaluation-prometheus.png"


def test_the_measured_commit_is_named() -> None:
    assert re.fullmatch(r" at commit [0-9a-f]{7,40}", revision())
