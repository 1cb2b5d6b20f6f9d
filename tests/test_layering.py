"""The layering of ``docs/architecture.md``, checked on every import of ``fleet_kernel`` and ``fleet_api``.

Every ``import`` and ``from ... import`` is read with ``ast``, those inside functions and under
``TYPE_CHECKING`` included, so a lazy import cannot hide one. Modules sit in layers, lowest first:

- foundation: errors, events, config, cancel, workspace, skills, telemetry's metrics and tracing, ...
- store and sandbox: side by side, neither imports the other
- view: the one fold of typed events and what renders it (render, transcript)
- engine: sessions, the turn runner, the turn
- front doors: the kernel, the ``%%fleet`` magic (which reuses the kernel's context and display), and
  ``fleet_api``; the kernel and the API never import each other (the kernel starts the API as a process)
- entry points: the command line, ``python -m``, the IPython extension, doctor, demo, papermill

A module imports only its own layer or a lower one; ``fleet_kernel`` never imports ``fleet_api``; no
two modules import each other, directly or round a loop. Both front doors' handlers (the API's routes and
the kernel's ``%fleet`` commands) reach the store only through the engine's services, never by calling it.
"""

from __future__ import annotations

import ast
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fleet_kernel", "fleet_api")

# (layer, module prefixes); a module is in the layer of its longest matching prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundation",
        (
            "fleet_kernel.errors",
            "fleet_kernel.textsafe",
            "fleet_kernel.safe_files",
            "fleet_kernel.lazy",
            "fleet_kernel.cassette",
            "fleet_kernel.cancel",
            "fleet_kernel.events",
            "fleet_kernel.config",
            "fleet_kernel.tool_config",
            "fleet_kernel.rich_out",
            "fleet_kernel.workspace",
            "fleet_kernel.skills",
            "fleet_kernel.telemetry",
            "fleet_kernel.ownership",
            "fleet_kernel.redact",
            "fleet_kernel.markdown",
            "fleet_kernel.identity",
            "fleet_kernel.sandbox_registry",
        ),
    ),
    ("store", ("fleet_kernel.store",)),
    ("sandbox", ("fleet_kernel.sandbox",)),
    ("view", ("fleet_kernel.view", "fleet_kernel.render", "fleet_kernel.render_text", "fleet_kernel.transcript")),
    ("engine", ("fleet_kernel.engine", "fleet_kernel.evals")),
    ("kernel", ("fleet_kernel.kernel",)),
    ("magic", ("fleet_kernel.magic",)),
    ("api", ("fleet_api",)),
    (
        "entry",
        (
            "fleet_kernel",  # the package itself: ``%load_ext fleet_kernel`` loads the magic
            "fleet_kernel.__main__",
            "fleet_kernel.cli",
            "fleet_kernel.doctor",
            "fleet_kernel.demo",
            "fleet_kernel.papermill",
            "fleet_kernel.cell_ids",
            "fleet_kernel.evals.cli",  # ``fleet eval``, ``fleet optimize``
            "fleet_kernel.telemetry.export",  # ``fleet trace``
            "fleet_api.cli",
            "fleet_api.__main__",
        ),
    ),
]
RANK = {
    "foundation": 0,
    "store": 1,
    "sandbox": 1,
    "view": 2,
    "engine": 3,
    "kernel": 4,
    "magic": 4,
    "api": 4,
    "entry": 5,
}
# Layers of one rank may import each other only along these edges.
SIDEWAYS = {("magic", "kernel")}  # the magic runs the kernel's KernelContext, commands and display


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imported_modules(path: Path, name: str = "") -> list[tuple[int, str]]:
    """``(line, module)`` of each import in ``path``, module ``name``: relative imports resolve against it,
    and ``from package import module`` names the module."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            if base == "fleet_kernel" and [a.name for a in node.names] == ["__version__"]:
                continue  # the version string, not a dependency on what the package loads
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules()]
            found += [(node.lineno, m) for m in submodules] or [(node.lineno, base)]
    return found


def own_module(name: str) -> str | None:
    """The module of ours that importing ``name`` loads (``fleet_kernel.store.Store`` -> the package)."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


@cache
def graph() -> dict[str, frozenset[str]]:
    """Each of our modules and the modules of ours it imports."""
    edges = {}
    for name, path in modules().items():
        targets = {own_module(imported) for _line, imported in imported_modules(path, name)}
        edges[name] = frozenset(t for t in targets if t is not None and t != name)
    return edges


def reachable(start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph()[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def cycles() -> set[frozenset[str]]:
    """The import cycles: each set of modules that import each other, directly or round a loop."""
    reach = {m: reachable(m) for m in graph()}
    return {frozenset({m} | {o for o in reach[m] if m in reach[o]}) for m in graph() if m in reach[m]}


def layer(module: str) -> str | None:
    matches = [
        (len(prefix), name)
        for name, prefixes in LAYERS
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(matches)[1] if matches else None


def forbidden(importer: str, imported: str) -> bool:
    a, b = layer(importer), layer(imported)
    assert a is not None and b is not None
    if a == b:
        return False
    return RANK[b] > RANK[a] or (RANK[b] == RANK[a] and (a, b) not in SIDEWAYS)


def breaks_of(lower: str, upper: str) -> list[str]:
    """Imports from layer ``lower`` into ``upper`` (or, for one rank, either way round) that the layering forbids."""
    return sorted(
        f"{a} imports {b}"
        for a, targets in graph().items()
        for b in targets
        if {layer(a), layer(b)} <= {lower, upper} and layer(a) != layer(b) and forbidden(a, b)
    )


LAYER_PAIRS = [
    (lower, upper) for i, (lower, _) in enumerate(LAYERS) for upper, _ in LAYERS[i + 1 :] if RANK[lower] <= RANK[upper]
]


def test_every_module_is_in_a_layer() -> None:
    assert len(modules()) > 60, "the packages' modules were not found"
    assert not [m for m in modules() if layer(m) is None]


@pytest.mark.parametrize(("lower", "upper"), LAYER_PAIRS, ids=[f"{lo}-{up}" for lo, up in LAYER_PAIRS])
def test_a_layer_imports_only_its_own_or_lower_ones(lower: str, upper: str) -> None:
    assert not breaks_of(lower, upper), f"{lower} and {upper}: " + "; ".join(breaks_of(lower, upper))


def test_no_module_of_fleet_kernel_imports_fleet_api() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for module, path in modules().items()
        if module.startswith("fleet_kernel")
        for line, name in imported_modules(path, module)
        if name == "fleet_api" or name.startswith("fleet_api.")
    ]
    assert not offenders, "fleet_api depends on fleet_kernel, not the reverse:\n" + "\n".join(offenders)


def test_no_import_cycles() -> None:
    assert not [sorted(c) for c in cycles()]


def test_the_reader_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text("def serve():\n    from fleet_api.server import serve\n    import fleet_api\n")
    assert imported_modules(module) == [(2, "fleet_api.server"), (3, "fleet_api")]


def test_the_graph_sees_each_rule_broken() -> None:
    """The checks can fail: imports against the layering are forbidden, and the graph sees imports."""
    assert forbidden("fleet_kernel.config", "fleet_kernel.engine.runner")
    assert forbidden("fleet_kernel.store.turns", "fleet_kernel.sandbox.local")
    assert forbidden("fleet_kernel.kernel.commands", "fleet_api.server")
    assert not forbidden("fleet_kernel.magic", "fleet_kernel.kernel.display")
    assert not forbidden("fleet_api.routes", "fleet_kernel.engine")
    assert "fleet_kernel.store" in graph()["fleet_kernel.engine.runner"]


# Where the front doors parse a request and render the answer: both go through the engine's services
# (``engine/sessions.py`` above all), so neither may call a method of the store itself.
HANDLERS = ("fleet_api.routes", "fleet_kernel.kernel.commands")


def store_calls(path: Path) -> list[str]:
    """``line: call`` of each call of a method on something named ``store`` (``state.store.get_turn(...)``,
    ``ctx.store.list_turns(...)``, ``store.get_blob(...)``) in ``path``, and each import of the ``Store``
    or one of its parts (``TurnStore``, ``EventLog``, ...): row types and constants may be imported."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
            if name == "store":
                found.append(f"{node.lineno}: {ast.unparse(node.func)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fleet_kernel.store"):
            parts = [a.name for a in node.names if a.name.endswith("Store") or a.name == "EventLog"]
            found += [f"{node.lineno}: imports {name}" for name in parts]
    return found


def handler_modules() -> list[str]:
    return [m for m in modules() if any(m == h or m.startswith(h + ".") for h in HANDLERS)]


def test_routes_and_commands_reach_the_store_only_through_the_engine() -> None:
    assert {h for h in HANDLERS if any(m.startswith(h) for m in handler_modules())} == set(HANDLERS)
    offenders = [
        f"{modules()[m].relative_to(ROOT)}:{call}" for m in handler_modules() for call in store_calls(modules()[m])
    ]
    assert not offenders, "call the engine's session service (engine/sessions.py) instead:\n" + "\n".join(offenders)


def test_the_store_call_check_sees_each_form(tmp_path: Path) -> None:
    route = tmp_path / "route.py"
    route.write_text(
        "async def f(state, ctx, store):\n"
        "    await state.store.get_turn('t')\n"
        "    await ctx.store.list_turns('s')\n"
        "    await store.get_blob('x')\n"
        "    await state.sessions.turn('s', 't')\n"
        "from fleet_kernel.store import Store, TurnRow\n"
        "from fleet_kernel.store.turns import TurnStore\n"
    )
    assert sorted(store_calls(route), key=lambda c: int(c.split(":")[0])) == [
        "2: state.store.get_turn",
        "3: ctx.store.list_turns",
        "4: store.get_blob",
        "6: imports Store",
        "7: imports TurnStore",
    ]


def test_the_fleet_script_is_the_apis_and_has_every_command() -> None:
    from fleet_api.cli import main

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fleet"] == "fleet_api.cli:main"
    assert {"serve", "kernel", "db", "doctor"} <= set(main.commands)
