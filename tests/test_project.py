"""Meta-tests: layering, faces, no cycles, settings and commands with help."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.cli import main
from bot.settings import Settings, env_example

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
        # Who may read what: every surface asks it, it asks none of them.
        (
            "bot/access",
            {"bot.slack", "bot.server", "bot.mcp", "bot.cli", "bot.conversation", "slack_bolt"},
        ),
        ("bot/mcp", {"bot.slack", "bot.cli", "slack_bolt", "evaluation"}),
    ],
)
def test_imports_flow_bot_core_index(package: str, forbidden: set[str]) -> None:
    bad = sorted((f, m) for f, m in _imports(package) if _within(m, forbidden))
    assert bad == []


def test_in_the_access_rule_only_the_slack_directory_speaks_to_slack() -> None:
    # The rule, its cache and its contracts are Slack's no more than a source's.
    users = {f for f, m in _imports("bot/access") if _within(m, {"slack_sdk", "aiohttp"})}
    assert users == {"bot/access/slack.py"}


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


def test_every_setting_has_help_text() -> None:
    assert all(len(info.description or "") > 15 for info in Settings.model_fields.values())


def test_every_cli_command_has_help() -> None:
    runner = CliRunner()
    for name, cmd in main.commands.items():
        assert cmd.help and len(cmd.help) > 20, name
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)


def test_links_follow_the_port_unless_a_public_url_is_set() -> None:
    assert Settings(port=3111).link_base_url == "http://localhost:3111"
    assert (
        Settings(port=3111, public_url="https://kb.example.com/").link_base_url
        == "https://kb.example.com"
    )


# ---------------------------------------------------------------- the import graph

PRODUCT = ("bot", "core", "index", "evaluation")
# Packages whose top-level modules are public as they are; below them, each
# sub-package is entered through its face (its ``__init__``).
TOP = ("index", "bot.slack")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _product_modules() -> dict[str, Path]:
    return {_module_name(p): p for part in PRODUCT for p in (ROOT / part).rglob("*.py")}


def _edges() -> dict[str, set[str]]:
    """Every product module's imports of product modules, wherever they stand in the file.

    Imports inside functions and under ``TYPE_CHECKING`` count: a cycle through a
    lazy import is still a cycle a reader must untangle. ``from package import
    name`` is an edge to the submodule when ``name`` is one, else to the package.
    """
    modules = _product_modules()
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in modules else node.module)
        edges[name] = {m for m in found if m in modules and m != name}
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_anywhere_in_the_product() -> None:
    assert _cycles(_edges()) == []


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import() -> None:
    # The check above must be able to fail: two modules importing each other.
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def _face(importer: str, target: str, packages: set[str]) -> str | None:
    """The package ``importer`` must import ``target`` through, or ``None`` when it may import it.

    Below the longest package the two share, a sub-package is entered through
    its face; the top-level modules of ``index`` and ``bot.slack`` are public.
    """
    if not any(target.startswith(top + ".") for top in TOP):
        return None
    own = importer.split(".") if importer in packages else importer.split(".")[:-1]
    path = target.split(".")
    common = 0
    while common < min(len(own), len(path) - 1) and own[common] == path[common]:
        common += 1
    if len(path) == common + 1:
        return None  # a module of the importer's own package
    first = ".".join(path[: common + 1])
    if first in TOP:
        if len(path) == common + 2:
            return None
        first = ".".join(path[: common + 2])
    return first if first in packages and first != target else None


def test_callers_import_a_sub_package_through_its_face() -> None:
    modules = _product_modules()
    packages = {m for m, p in modules.items() if p.name == "__init__.py"}
    inside = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.ImportFrom) and node.module in modules and node.level == 0
            ):
                continue
            if all(f"{node.module}.{a.name}" in modules for a in node.names):
                continue  # a module imported by name: its package decides
            face = _face(name, node.module, packages)
            if face is not None and face in packages:
                inside.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module} (use {face})")
    assert inside == []


def test_every_face_names_what_others_may_import() -> None:
    for name, path in _product_modules().items():
        if path.name != "__init__.py" or not name.startswith(TOP):
            continue
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{name} says nothing of what it holds"
        exported = [
            node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        ]
        if exported:
            names = ast.literal_eval(exported[0])
            assert names == sorted(names), f"{name}.__all__ is not sorted"


def test_the_files_run_first_are_test_files_that_exist() -> None:
    from tests.conftest import LONGEST_FIRST

    found = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert set(LONGEST_FIRST) <= found, set(LONGEST_FIRST) - found
