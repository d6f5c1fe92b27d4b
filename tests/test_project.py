"""Meta-tests: layering, documented settings, documented CLI commands."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.cli import main
from bot.settings import Settings, env_example, env_var_names

ROOT = Path(__file__).resolve().parents[1]


def _imports(package: str) -> set[tuple[str, str]]:
    found = set()
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {(str(path.relative_to(ROOT)), a.name.split(".")[0]) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add((str(path.relative_to(ROOT)), node.module.split(".")[0]))
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("index", {"core", "bot", "evaluation", "slack_bolt", "slack_sdk", "aiohttp", "openai"}),
        ("core", {"bot", "evaluation", "slack_bolt", "slack_sdk", "aiohttp", "tqdm", "matplotlib"}),
        ("evaluation", {"bot", "slack_bolt", "slack_sdk", "aiohttp"}),
    ],
)
def test_imports_flow_bot_core_index(package: str, forbidden: set[str]) -> None:
    bad = sorted((f, m) for f, m in _imports(package) if m in forbidden)
    assert bad == []


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
