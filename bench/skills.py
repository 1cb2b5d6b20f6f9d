"""What a big skill tree costs a turn: the catalogue load every turn does, on trees a checked-in dataset
or a vendored package could give a skill.

    .venv/bin/python bench/skills.py [--repeat 20] [--before REV]

Trees (each one card in ``$FLEET_HOME/skills``): ``folders`` (25 x 25 x 25 nested folders), ``files``
(100,000 files in one folder) and ``cards`` (200 cards, each with 500 files). Columns, milliseconds per
load: ``changed`` is the first load after a file was added to a card's folder (that card listed again,
boundedly), ``turn`` a load of an unchanged tree (a few ``lstat`` calls and the cards read). ``--before REV`` adds the
loader of that git revision (e.g. ``HEAD~1``), which listed the whole tree on every load.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleet_kernel import skills  # noqa: E402


def card(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(f"---\nname: {folder.name}\ndescription: bench\n---\n# Bench\n")
    return folder


def folders_tree(home: Path) -> Path:
    top = card(home / "skills" / "deep")
    for a in range(25):
        for b in range(25):
            for c in range(25):
                (top / f"a{a}" / f"b{b}" / f"c{c}").mkdir(parents=True)
    return top


def files_tree(home: Path) -> Path:
    top = card(home / "skills" / "flat")
    (top / "data").mkdir()
    for i in range(100_000):
        (top / "data" / f"row{i}.bin").touch()
    return top


def cards_tree(home: Path) -> Path:
    for s in range(200):
        folder = card(home / "skills" / f"card-{s:03}") / "data"
        folder.mkdir()
        for i in range(500):
            (folder / f"row{i}.bin").touch()
    return home / "skills" / "card-000"


def before(rev: str) -> ModuleType:
    """The loader as it was at ``rev``, reading the same bundled cards."""
    source = subprocess.run(
        ["git", "show", f"{rev}:fleet_kernel/skills/__init__.py"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "skills_before.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("skills_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    module.BUNDLED_DIR = skills.BUNDLED_DIR
    return module


def ms(load: Callable[[], object], repeat: int, change: Callable[[int], None] | None = None) -> float:
    """Median milliseconds of ``load``; ``change(i)`` first changes the tree when given."""
    samples = []
    for i in range(repeat):
        if change is not None:
            change(i)
        start = time.perf_counter()
        load()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def row(name: str, build: Callable[[Path], Path], old: ModuleType | None, repeat: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        home, cwd = Path(tmp) / "home", Path(tmp) / "work"
        top = build(home)
        os.sync()
        few = max(3, repeat // 4)
        was = f"{ms(partial(old.load_catalogue, home, cwd), few):10.1f}" if old else "-".rjust(10)
        now = partial(skills.load_catalogue, home, cwd)
        changed = ms(now, few, lambda i: (top / f"added-{i}.md").touch())  # a new file in the card's folder
        return f"{name:<8} {was} {changed:10.1f} {ms(now, repeat):10.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--before", metavar="REV", help="also time the loader of this git revision")
    args = parser.parse_args()
    old = before(args.before) if args.before else None
    print(f"{'tree':<8} {'before':>10} {'changed':>10} {'turn':>10}   (ms per catalogue load, median of {args.repeat})")
    for name, build in [("folders", folders_tree), ("files", files_tree), ("cards", cards_tree)]:
        print(row(name, build, old, args.repeat), flush=True)


if __name__ == "__main__":
    main()
