"""agent/ and worker/ are copied to bare hosts: standard library only, Python 3.8+."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

BARE = [ROOT / "potato_queue" / "agent", ROOT / "potato_queue" / "worker"]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def module_level_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return found


def bare_files() -> list[Path]:
    return sorted(p for folder in BARE for p in folder.rglob("*.py"))


def test_bare_packages_exist() -> None:
    assert len(bare_files()) >= 4


@pytest.mark.parametrize("path", bare_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_stdlib_only_at_module_level(path: Path) -> None:
    foreign = [
        m for m in module_level_imports(path)
        if m.split(".")[0] not in STDLIB and not m.startswith(("potato_queue.agent", "potato_queue.worker"))
    ]
    assert foreign == [], f"{path} imports {foreign} at module level; agent/ and worker/ run on bare hosts"


def test_scanner_catches_a_foreign_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nimport requests\nfrom potato_queue.config import LOCAL\n")
    assert module_level_imports(bad) == ["os", "requests", "potato_queue.config"]


def test_vermin_says_python_38_is_enough() -> None:
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    proc = subprocess.run(
        [vermin, "--no-tips", "--target=3.8-", "--violations", "--eval-annotations", "--backport", "typing",
         *map(str, BARE)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
