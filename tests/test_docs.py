"""The docs: the generated reference matches the code, and every relative link resolves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bot import docs
from bot.cli import main
from bot.settings import env_var_names
from core.thresholds import BUNDLED

ROOT = Path(__file__).resolve().parents[1]
# The project's own pages; the corpora it is measured on (evaluation/sets/, the
# sample documents, test data) are other projects' text and keep their links.
MARKDOWN = sorted(
    p
    for p in ROOT.rglob("*.md")
    if not {".venv", ".git", "node_modules", "sets", "sample", "data"} & set(p.parts)
)


@pytest.mark.parametrize("path", sorted(docs.GENERATED))
def test_generated_doc_matches_the_code(path: str) -> None:
    on_disk = (ROOT / path).read_text(encoding="utf-8")
    assert on_disk == docs.generated()[path], f"{path} is out of date: run {docs.REGENERATE}"


def test_write_rewrites_only_what_differs(tmp_path: Path) -> None:
    assert sorted(docs.write(tmp_path)) == sorted(docs.GENERATED)
    (tmp_path / "docs/cli.md").write_text("stale", encoding="utf-8")
    assert docs.write(tmp_path) == ["docs/cli.md"]
    assert docs.write(tmp_path) == []


def test_every_setting_and_command_is_in_the_reference() -> None:
    configuration = docs.configuration_md()
    assert [env for env in env_var_names() if f"`{env}`" not in configuration] == []
    cli = docs.cli_md()
    assert [name for name in main.commands if f"## `kb {name}`" not in cli] == []


def test_the_reference_does_not_depend_on_the_machine() -> None:
    text = docs.configuration_md() + docs.cli_md()
    assert str(Path.home()) not in text and str(Path.cwd()) not in text
    widest = max(len(line) for line in docs.cli_md().split("```text")[1].splitlines())
    assert widest <= docs.HELP_WIDTH


def test_every_module_is_listed_with_its_docstring() -> None:
    modules = docs.modules_md()
    for package in docs.PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            row = next(r for r in modules.splitlines() if f"`{path.relative_to(ROOT)}`" in r)
            assert row.rstrip(" |").split("|")[-1].strip(), f"{path} has no docstring"


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [target for target in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert _broken(path) == []


def _broken(path: Path) -> list[str]:
    """The page's relative links to a missing file, or to a heading its page lacks."""
    broken = []
    for target in _relative_links(path):
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        missing = not resolved.exists()
        if missing or (anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved)):
            broken.append(target)
    return broken


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: a repeated one gets -1, -2..."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    anchors: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        base, n = docs.anchor(heading), 0
        while (name := base if n == 0 else f"{base}-{n}") in anchors:
            n += 1
        anchors.add(name)
    return anchors


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n[here](missing.md) [site](https://example.com) [top](#top)\n")
    assert _relative_links(page) == ["missing.md", "#top"]
    assert _anchors(page) == {"top"}
    assert _broken(page) == ["missing.md"]


def test_the_link_check_reads_anchors_as_github_makes_them(tmp_path: Path) -> None:
    (tmp_path / "studies").mkdir()
    target = tmp_path / "studies" / "study.md"
    target.write_text(
        "# Ingestion: `python -m bench.ingest`\n## Results\n## Results\n```\n# not a heading\n```\n"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "[a](studies/study.md#ingestion-python--m-benchingest) [b](studies/study.md#results-1)\n"
        "[c](studies/study.md#results-2) [d](studies/study.md#not-a-heading) [e](#gone)\n"
    )
    assert _broken(page) == [
        "studies/study.md#results-2",
        "studies/study.md#not-a-heading",
        "#gone",
    ]


SETTING = re.compile(r"\b(?:KB|SLACK|OPENAI|QDRANT)_[A-Z0-9_]*[A-Z0-9]\b")
# Variables the docs may name that are not the bot's settings: the test tools' and
# the deployment files' own (build arguments, compose variables).
NOT_SETTINGS = {"KB_COVERAGE", "KB_TEST_POSTGRES_URL"} | {
    name for f in (ROOT / "deploy").iterdir() for name in SETTING.findall(f.read_text())
}


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_setting_the_docs_name_exists(path: Path) -> None:
    named = set(SETTING.findall(path.read_text(encoding="utf-8")))
    assert sorted(named - set(env_var_names()) - NOT_SETTINGS) == []


def test_every_study_is_in_the_index() -> None:
    index = ROOT / "studies" / "README.md"
    listed = {target.partition("#")[0] for target in _relative_links(index)}
    pages = {p.name for p in (ROOT / "studies").glob("*.md")} - {"README.md"}
    assert sorted(pages - listed) == []


def _thresholds_table(text: str) -> dict[str, tuple[float, float]]:
    """The rows of the "Thresholds per model" table: model -> (answer, related)."""
    section = text.split("\n## Thresholds per model\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([0-9.]+) \| ([0-9.]+) \|", section, flags=re.M)
    return {model: (float(answer), float(related)) for model, answer, related in rows}


def test_the_thresholds_the_evaluation_states_are_the_codes() -> None:
    stated = _thresholds_table((ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8"))
    assert stated == {model: (a, r) for model, (a, r) in BUNDLED.items()}


def test_the_thresholds_check_reads_the_table() -> None:
    page = (
        "# Page\n\n## Thresholds per model\n\n| model | answer | related | why |\n|---|---|---|---|\n"
        "| `some/model` | 0.475 | 0.6 | because |\n\n## Next\n| `other` | 1 | 2 |\n"
    )
    assert _thresholds_table(page) == {"some/model": (0.475, 0.6)}


def test_the_current_benchmark_figures_are_those_of_the_saved_run() -> None:
    from bench import current

    results = json.loads(current.RESULTS.read_text(encoding="utf-8"))
    assert current.shown() == current.render(results), "run python -m bench.current --write"
    assert set(results["models"]) == set(current.MODELS)


def test_the_benchmark_page_is_rewritten_only_between_its_markers(tmp_path: Path) -> None:
    from bench import current

    results = json.loads(current.RESULTS.read_text(encoding="utf-8"))
    page = tmp_path / "benchmarks.md"
    page.write_text(f"before\n{current.BEGIN}\nstale\n{current.END}\nafter\n", encoding="utf-8")
    current.write_page(results, page)
    assert current.shown(page) == current.render(results)
    text = page.read_text(encoding="utf-8")
    assert text.startswith("before\n") and text.endswith("\nafter\n") and "stale" not in text
