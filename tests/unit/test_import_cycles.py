"""No two modules of the package import each other: each pair has one direction that belongs."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "orquestador"


def _module_names() -> dict[str, Path]:
    names = {}
    for source in PACKAGE.rglob("*.py"):
        parts = list(source.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = source
    return names


def _imports(module: str, source: Path, known: set[str]) -> set[str]:
    """Every package module ``module`` names in an import, wherever the import stands.

    Imports inside functions and under ``if TYPE_CHECKING:`` count: both tie the
    two modules together as surely as a top-level import does.
    """
    package = module if source.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            # `from orquestador.api import schemas` imports the module schemas.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known and name != module}


def _mutual_pairs() -> set[frozenset[str]]:
    modules = _module_names()
    known = set(modules)
    edges = {name: _imports(name, source, known) for name, source in modules.items()}
    return {
        frozenset({a, b}) for a, targets in edges.items() for b in targets if a in edges.get(b, ())
    }


def test_no_two_modules_import_each_other() -> None:
    assert sorted(sorted(pair) for pair in _mutual_pairs()) == []


def test_the_check_sees_type_checking_and_function_level_imports(tmp_path: Path) -> None:
    first = tmp_path / "first.py"
    first.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.second import B\n"
    )
    second = tmp_path / "second.py"
    second.write_text("def f():\n    from pkg import first\n")
    known = {"pkg", "pkg.first", "pkg.second"}
    assert _imports("pkg.first", first, known) == {"pkg.second"}
    assert _imports("pkg.second", second, known) == {"pkg", "pkg.first"}
