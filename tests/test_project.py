"""Meta-tests: layering, documented settings, documented CLI commands."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.cli import main
from bot.settings import Settings, env_example, env_var_names

ROOT = Path(__file__).resolve().parents[1]


def _imports(part: str) -> set[tuple[str, str]]:
    """(file, imported module) for every absolute import in a package or module of the product."""
    root = ROOT / part
    found = set()
    for path in [root] if root.is_file() else root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {(str(path.relative_to(ROOT)), a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add((str(path.relative_to(ROOT)), node.module))
    return found


def _within(module: str, forbidden: set[str]) -> bool:
    return any(module == f or module.startswith(f + ".") for f in forbidden)


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("index", {"core", "bot", "evaluation", "slack_bolt", "slack_sdk", "aiohttp"}),
        ("core", {"bot", "evaluation", "slack_bolt", "slack_sdk", "aiohttp", "tqdm", "matplotlib"}),
        ("evaluation", {"bot", "slack_bolt", "slack_sdk", "aiohttp"}),
        # Surface-neutral parts of bot/: a second chat surface reuses them as they are.
        ("bot/conversation.py", {"bot.slack", "bot.server", "bot.cli", "slack_bolt", "slack_sdk"}),
        ("bot/server", {"bot.slack", "bot.cli", "slack_bolt", "slack_sdk", "evaluation"}),
    ],
)
def test_imports_flow_bot_core_index(package: str, forbidden: set[str]) -> None:
    bad = sorted((f, m) for f, m in _imports(package) if _within(m, forbidden))
    assert bad == []


def test_in_index_only_the_embeddings_endpoint_imports_openai() -> None:
    # The language model is the engine's (core.llm); index/ reaches an endpoint
    # only for embeddings, in one module.
    users = {f for f, m in _imports("index") if _within(m, {"openai"})}
    assert users == {"index/embed/remote.py"}


def test_only_the_cli_and_bench_import_evaluation() -> None:
    users = {
        f
        for part in ("bot", "core", "index")
        for f, m in _imports(part)
        if _within(m, {"evaluation"})
    }
    assert users and all(f.startswith("bot/cli/") for f in users), users


def test_env_example_is_generated_from_settings() -> None:
    assert (ROOT / ".env.example").read_text() == env_example()


def test_every_setting_is_documented_in_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in env_var_names() if name not in readme]
    assert missing == []


def test_every_setting_has_help_text() -> None:
    assert all(len(info.description or "") > 15 for info in Settings.model_fields.values())


def test_every_cli_command_has_help_and_is_in_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    runner = CliRunner()
    for name, cmd in main.commands.items():
        assert cmd.help and len(cmd.help) > 20, name
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert f"kb {name}" in readme, f"`kb {name}` is not in the README"


def test_links_follow_the_port_unless_a_public_url_is_set() -> None:
    assert Settings(port=3111).link_base_url == "http://localhost:3111"
    assert (
        Settings(port=3111, public_url="https://kb.example.com/").link_base_url
        == "https://kb.example.com"
    )
