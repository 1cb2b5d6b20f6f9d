"""Tests for notebooks through the fleet kernel: the offline quickstart with nbclient, its transcript via nbconvert."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from kernel_harness import KERNEL
from nbconvert import HTMLExporter, MarkdownExporter

from fleet_kernel.demo import run_quickstart


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory, kernelspec: Path) -> nbformat.NotebookNode:
    """The quickstart, executed once on its cassette of scripted answers (no LM server at all)."""
    pytest.importorskip("matplotlib", reason="the quickstart's chart needs matplotlib in the environment")
    out = tmp_path_factory.mktemp("quickstart")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FLEET_HOME", str(out / "home"))
        env.delenv("FLEET_LM_MODEL", raising=False)  # the notebook falls back to its cassette by itself
        notebook, _html = run_quickstart(out, kernel_name=KERNEL)
    return nbformat.read(notebook, as_version=4)


def outputs(nb: nbformat.NotebookNode, source_start: str) -> list:
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(source_start)]
    return cell.outputs


@pytest.mark.slow
def test_each_turn_cell_keeps_images_and_one_transcript(executed: nbformat.NotebookNode) -> None:
    first = outputs(executed, "The attached ship's log")
    assert [o.output_type for o in first] == ["display_data", "execute_result"]
    assert "image/png" in first[0].data and "artifacts/storms_per_month.png" in first[0].data["text/plain"]
    meta = first[1].metadata["fleet"]
    assert meta["status"] == "completed" and meta["turn_id"].startswith("turn_")
    assert "**Nantucket**" in first[1].data["text/markdown"]
    assert "1 sub" in first[1].data["text/plain"]  # the sub-LM call is counted
    second = outputs(executed, "Which month was calmest")
    assert second[-1].metadata["fleet"]["session_id"] == meta["session_id"]  # the session goes on
    assert "1851-04" in second[-1].data["text/markdown"]


@pytest.mark.slow
def test_the_model_loads_a_skill(executed: nbformat.NotebookNode) -> None:
    (result,) = [
        o
        for o in outputs(executed, "In which months did the Albatross speak the Essex")
        if o.output_type == "execute_result"
    ]
    assert result.metadata["fleet"]["status"] == "completed"
    assert "load_skill" in result.data["text/markdown"] and "Long-context search" in result.data["text/markdown"]
    assert "67 times, in 22 months" in result.data["text/markdown"]


@pytest.mark.slow
def test_the_model_keeps_a_memory(executed: nbformat.NotebookNode) -> None:
    (result,) = [o for o in outputs(executed, "From now on, write dates") if o.output_type == "execute_result"]
    assert result.metadata["fleet"]["status"] == "completed"
    assert "remember" in result.data["text/markdown"] and "day month year" in result.data["text/markdown"]
    listed = "".join(
        o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in outputs(executed, "%fleet memory")
    )
    assert "[preference]" in listed and "3 March 1851" in listed


@pytest.mark.slow
def test_no_output_depends_on_widgets_or_a_kernel(executed: nbformat.NotebookNode) -> None:
    for cell in executed.cells:
        for output in cell.get("outputs", []):
            if output.output_type in ("display_data", "execute_result"):
                assert "text/plain" in output.data
                assert "application/vnd.jupyter.widget-view+json" not in output.data


def test_nbconvert_renders_the_transcript(executed: nbformat.NotebookNode) -> None:
    html, _ = HTMLExporter().from_notebook_node(executed)
    markdown, resources = MarkdownExporter().from_notebook_node(executed)
    for text in (html, markdown):
        assert "Nantucket" in text and "The calmest month was" in text
    assert 'src="data:image/png;base64' in html
    assert "iteration 1/20" in markdown and resources["outputs"]  # the chart is extracted as a file
