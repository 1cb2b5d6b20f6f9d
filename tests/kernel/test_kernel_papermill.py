"""papermill runs a Fleet notebook with parameters: ``papermill -k fleet in.ipynb out.ipynb -p name value``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest
from kernel_harness import KERNEL, Kernel
from scripted_lm import step

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def entry_points(tmp_path: Path) -> Path:
    """A folder whose dist-info holds pyproject.toml's entry points, as ``pip install`` writes them.

    The environment's editable install may predate them; putting this folder on PYTHONPATH lets papermill
    find exactly what pyproject.toml declares.
    """
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    info = tmp_path / "entry-points" / "fleet_kernel_entry_points-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fleet-kernel-entry-points\nVersion: 0\n")
    sections = []
    for group, eps in declared.items():
        sections.append(f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in eps.items()))
    (info / "entry_points.txt").write_text("\n".join(sections))
    return info.parent


def _cell(source: str, *tags: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


@pytest.mark.slow
def test_papermill_runs_a_fleet_notebook_with_parameters(
    fleet_env: dict[str, str], scripted_lm, entry_points: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "analysis"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "south.txt").write_text("south sold 42 boats\n")
    cells = [
        _cell("%fleet set region north", "parameters"),
        _cell("%fleet attach data/{region}.txt"),
        _cell("how many boats did {region} sell? (say {{region}} literally)"),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Fleet RLM (test)", "language": "markdown"}
    nbformat.write(nb, folder / "in.ipynb")
    read = "print(open('files/south.txt').read())"
    scripted_lm.add("did south sell", [step("read the file", read), step("done", "SUBMIT(answer='42 boats')")])
    env = {
        **os.environ,
        **fleet_env,
        "PYTHONPATH": os.pathsep.join([str(entry_points), os.environ.get("PYTHONPATH", "")]),
    }
    papermill = Path(sys.executable).parent / "papermill"
    out = tmp_path / "out.ipynb"
    args = [str(papermill), "-k", KERNEL, str(folder / "in.ipynb"), str(out), "--cwd", str(folder)]
    done = subprocess.run([*args, "-p", "region", "south"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = nbformat.read(out, as_version=4)
    injected = [c for c in result.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert [c.source for c in injected] == ["%fleet set region south\n"]
    attach, task = result.cells[-2:]
    assert "Attached south.txt as /workspace/files/south.txt" in _text(attach)
    assert "42 boats" in _text(task) and "south sold 42 boats" in _text(task)
    assert result.metadata["papermill"]["parameters"] == {"region": "south"}
    described = subprocess.run(
        [str(papermill), "--help-notebook", str(folder / "in.ipynb")], env=env, capture_output=True, text=True
    )
    assert "region: str (default north)" in described.stdout, described.stdout + described.stderr


def test_set_parameters_are_substituted_in_later_cells(kernel: Kernel, scripted_lm) -> None:
    assert "No parameters yet" in kernel.run("%fleet set").text()
    assert "city = 'New York'" in kernel.run("%fleet set city 'New York'").text()
    scripted_lm.add("weather in New York", [step("done", "SUBMIT(answer='sunny')")])
    run = kernel.run("weather in {city} today? keep {{city}} and {unknown} as they are")
    assert "sunny" in run.result["data"]["text/plain"]
    sent = [json.dumps(body) for body in scripted_lm.requests]
    assert any("weather in New York today? keep {city} and {unknown} as they are" in text for text in sent)
    listing = kernel.run("%fleet set")
    assert "city = 'New York'" in listing.text()
    assert kernel.kc.complete("%fleet set c", 12, reply=True)["content"]["matches"] == ["city"]
    bad = kernel.run("%fleet set 1x y").reply["content"]
    assert bad["status"] == "error" and "not a parameter name" in bad["evalue"]


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for output in cell.outputs:
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


@pytest.mark.slow
def test_papermill_turns_keep_their_cell_ids_and_a_missing_cwd_is_named(
    fleet_env: dict[str, str], scripted_lm, entry_points: Path, tmp_path: Path
) -> None:
    """Without ``--cwd`` the kernel runs in papermill's folder: a relative path that is not found says to pass
    it. The turns carry the notebook's own cell ids, as under JupyterLab."""
    folder = tmp_path / "analysis"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "south.txt").write_text("south sold 42 boats\n")
    task = _cell("count the boats")
    cells = [task, _cell("%fleet history"), _cell("%fleet attach data/south.txt")]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Fleet RLM (test)", "language": "markdown"}
    nbformat.write(nb, folder / "in.ipynb")
    scripted_lm.add("count the boats", [step("done", "SUBMIT(answer='three boats')")])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        **os.environ,
        **fleet_env,
        "FLEET_OUTPUT": "text",
        "PYTHONPATH": os.pathsep.join([str(entry_points), os.environ.get("PYTHONPATH", "")]),
    }
    papermill = Path(sys.executable).parent / "papermill"
    out = tmp_path / "out.ipynb"
    args = [str(papermill), "-k", KERNEL, str(folder / "in.ipynb"), str(out)]
    done = subprocess.run(args, env=env, cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0  # the attach cell failed
    result = nbformat.read(out, as_version=4)
    history, attach = [c for c in result.cells if c.cell_type == "code"][-2:]
    assert f"cell {task.id[:8]}" in _text(history), _text(history)
    error = " ".join(" ".join(o.get("traceback", [])) + o.get("evalue", "") for o in attach.outputs)
    assert f"pass --cwd {folder}" in error, error
