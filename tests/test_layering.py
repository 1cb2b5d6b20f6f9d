"""Dependencies point one way: ``fleet_api`` imports ``fleet_kernel``, never the reverse.

Every ``import`` and ``from ... import`` of every module under ``fleet_kernel/`` is read with ``ast``, those
inside functions included, so a lazy import cannot hide one. The kernel starts the API only as a process
(``python -m fleet_api serve``), and the ``fleet`` console script is ``fleet_api``'s, which adds ``serve``.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of each import in ``path``; relative imports resolve within ``fleet_kernel``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def test_no_module_of_fleet_kernel_imports_fleet_api() -> None:
    modules = sorted((ROOT / "fleet_kernel").rglob("*.py"))
    assert len(modules) > 30, "fleet_kernel's modules were not found"
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in modules
        for line, name in imported_modules(path)
        if name == "fleet_api" or name.startswith("fleet_api.")
    ]
    assert not offenders, "fleet_api depends on fleet_kernel, not the reverse:\n" + "\n".join(offenders)


def test_the_reader_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text("def serve():\n    from fleet_api.server import serve\n    import fleet_api\n")
    assert imported_modules(module) == [(2, "fleet_api.server"), (3, "fleet_api")]


def test_the_fleet_script_is_the_apis_and_has_every_command() -> None:
    from fleet_api.cli import main

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fleet"] == "fleet_api.cli:main"
    assert {"serve", "kernel", "db", "doctor"} <= set(main.commands)
