"""JupyterLab in a real browser (Debian chromium via playwright-python): a cell's live card, then its transcript.

The JupyterLab server is shared by the tests (``lab`` in ``conftest.py``); each test has a folder and a notebook of
its own, and so a kernel of its own."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from kernel_harness import CHROMIUM, KERNEL
from scripted_lm import step

# JupyterLab in Chromium on a busy 2-core machine: bounds are generous liveness bounds, not latencies
pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@pytest.mark.slow
def test_lab_shows_the_live_card_then_the_transcript(lab: tuple[str, Path], scripted_lm) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect, sync_playwright

    url, folder = lab
    ticks = "import time\nfor i in range(8):\n    print('tick', i, flush=True)\n    time.sleep(0.5)"
    scripted_lm.add("count", [step("count slowly", ticks), step("done", "SUBMIT(answer='counted to **eight**')")])
    cells = [nbformat.v4.new_code_cell("%fleet output"), nbformat.v4.new_code_cell("count to eight")]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Fleet RLM (test)", "language": "markdown"}
    nbformat.write(nb, folder / "t.ipynb")
    shots = folder / "screenshots"
    shots.mkdir()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_be_attached(timeout=120_000)
            first, second = page.locator(".jp-Cell").nth(0), page.locator(".jp-Cell").nth(1)
            deadline = time.monotonic() + 120
            while "(widgets)" not in (first.locator(".jp-OutputArea-output").all_inner_texts() or [""])[0]:
                # the widget manager connects to a new kernel shortly after it is idle: ask until it has
                assert time.monotonic() < deadline, "the kernel never saw JupyterLab's widget manager"
                dialog = page.locator(".jp-Dialog .jp-mod-accept")
                if dialog.count():  # Lab sometimes asks to confirm the notebook's kernel: keep it
                    dialog.first.click()
                try:
                    first.locator(".cm-content").click(timeout=3000)
                except PlaywrightTimeout:
                    continue
                page.keyboard.press("Control+Enter")
                page.wait_for_timeout(700)
            second.locator(".cm-content").click()
            page.keyboard.press("Control+Enter")
            output = second.locator(".jp-OutputArea-output").first
            # live: the widget card with its Stop button, the code's output appearing while it runs
            expect(page.locator(".widget-button", has_text="Stop")).to_be_visible(timeout=120_000)
            expect(output).to_contain_text("tick 1", timeout=120_000)
            page.screenshot(path=str(shots / "live.png"))
            assert "counted to" not in output.inner_text()
            # final: the card is replaced by the transcript
            expect(page.locator(".fleet-transcript")).to_contain_text("counted to eight", timeout=120_000)
            expect(page.locator(".widget-button", has_text="Stop")).to_have_count(0)
            page.screenshot(path=str(shots / "final.png"))
            # the feedback bar under the answer: a note, a click, and the bar says what it kept
            second.locator(".widget-text input").fill("counted right")
            second.locator(".widget-button", has_text="good").click()
            expect(second.locator("div.widget-label")).to_contain_text("marked good: counted right", timeout=120_000)
            expect(second.locator(".widget-button", has_text="good")).to_be_disabled()
            page.screenshot(path=str(shots / "feedback.png"))
        except BaseException:
            page.screenshot(path=str(shots / "failure.png"))
            raise
        finally:
            browser.close()
            if os.environ.get("KERNEL_TEST_SCREENSHOTS"):
                shutil.copytree(shots, os.environ["KERNEL_TEST_SCREENSHOTS"], dirs_exist_ok=True)
                for log in (folder.parent / "lab.log", *folder.parent.glob("fleet-home/logs/*.log")):
                    shutil.copy(log, os.environ["KERNEL_TEST_SCREENSHOTS"])


@pytest.mark.slow
def test_lab_shows_a_fleet_cell_of_a_python_notebook_live_then_its_transcript(
    lab: tuple[str, Path], scripted_lm
) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, folder = lab
    ticks = "import time\nfor i in range(8):\n    print('tick', i, flush=True)\n    time.sleep(0.5)"
    scripted_lm.add("count", [step("count slowly", ticks), step("done", "SUBMIT(answer=f'counted to **{n}**')")])
    cells = [
        nbformat.v4.new_code_cell("%load_ext fleet_kernel\nn = 'eight'"),
        nbformat.v4.new_code_cell("%%fleet --in n --out said\ncount to n"),
        nbformat.v4.new_code_cell("print(said.upper())"),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, folder / "t.ipynb")
    shots = folder / "screenshots"
    shots.mkdir()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_be_attached(timeout=120_000)
            dialog = page.locator(".jp-Dialog .jp-mod-accept")
            if dialog.count():
                dialog.first.click()
            cell = [page.locator(".jp-Cell").nth(i) for i in range(3)]
            deadline = time.monotonic() + 120
            while "[1]" not in cell[0].locator(".jp-InputPrompt").inner_text():
                assert time.monotonic() < deadline, "the first cell never ran"
                if dialog.count():  # on a loaded machine Lab may ask about the kernel only now: keep it
                    dialog.first.click()
                cell[0].locator(".cm-content").click(timeout=10_000)
                page.keyboard.press("Control+Enter")  # a new kernel may not take it at once: ask until it has
                page.wait_for_timeout(1000)
            cell[1].locator(".cm-content").click()
            page.keyboard.press("Control+Enter")  # runs the %%fleet cell
            output = cell[1].locator(".jp-OutputArea-output").first
            # live: the widget card (no Stop button: the kernel's interrupt stops a turn here)
            expect(output.locator(".widget-html", has_text="Fleet")).to_be_visible(timeout=120_000)
            expect(output).to_contain_text("tick 1", timeout=120_000)
            expect(output.locator(".widget-button", has_text="Stop")).to_have_count(0)
            page.screenshot(path=str(shots / "magic-live.png"))
            expect(page.locator(".fleet-transcript")).to_contain_text("counted to eight", timeout=120_000)
            expect(cell[1].locator(".widget-button", has_text="bad")).to_be_visible(timeout=60_000)  # feedback bar
            cell[2].locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
            expect(cell[2].locator(".jp-OutputArea-output")).to_contain_text("COUNTED TO **EIGHT**", timeout=120_000)
            page.screenshot(path=str(shots / "magic-final.png"))
        except BaseException:
            page.screenshot(path=str(shots / "magic-failure.png"))
            raise
        finally:
            browser.close()
            if os.environ.get("KERNEL_TEST_SCREENSHOTS"):
                shutil.copytree(shots, os.environ["KERNEL_TEST_SCREENSHOTS"], dirs_exist_ok=True)


def test_the_static_html_of_an_exported_turn_sets_code_in_monospace_and_wraps_long_prompts(tmp_path: Path) -> None:
    """nbconvert's HTML of a Fleet cell, in chromium: monospace code and output, nothing cut at the right edge."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api")
    from nbconvert import HTMLExporter
    from playwright.sync_api import sync_playwright

    from fleet_kernel.events import make_event
    from fleet_kernel.transcript import TurnView, transcript_bundle

    task = "tell me which region grew the most, then plot every region's revenue per quarter and explain it " * 3
    code = "df = load('/workspace/files/sales.csv')  # " + "a comment that runs far to the right " * 4
    limits = {"max_iters": 3, "max_llm_calls": 5, "timeout_s": 60, "exec_timeout_s": 10}
    steps = [
        ("turn.started", {"task": task, "run_id": "r", "model": "m", "sandbox": "local", "limits": limits}),
        ("iteration.started", {"iteration": 1, "max_iters": 3}),
        ("code", {"iteration": 1, "code": code}),
        ("output", {"iteration": 1, "stream": "stdout", "text": "north 100 " + "x" * 300 + "\n"}),
        ("turn.completed", {"answer": "the south grew most", "usage": {"lm_calls": 1}, "duration_ms": 5}),
    ]
    view = TurnView.of(make_event(t, d, seq=i + 1, session_id="s", turn_id="t") for i, (t, d) in enumerate(steps))
    data, meta = transcript_bundle(view)
    cell = nbformat.v4.new_code_cell(task, execution_count=1)
    cell.outputs = [nbformat.v4.new_output("execute_result", data=data, metadata=meta, execution_count=1)]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {"name": "fleet", "display_name": "Fleet RLM", "language": "markdown"}
    page_html, _ = HTMLExporter().from_notebook_node(nb)
    (tmp_path / "t.html").write_text(page_html)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 900})
            page.goto((tmp_path / "t.html").as_uri())
            fonts = page.eval_on_selector_all(
                ".fleet-transcript pre", "els => els.map(e => getComputedStyle(e).fontFamily)"
            )
            assert len(fonts) == 2 and all("monospace" in f for f in fonts), fonts
            cut = page.eval_on_selector_all(
                ".jp-InputArea-editor pre, .fleet-transcript pre", "els => els.map(e => e.scrollWidth > e.clientWidth)"
            )
            assert cut == [False, False, False]  # the prompt, the code and the output wrap
            page.screenshot(path=str(tmp_path / "static.png"), full_page=True)
        finally:
            browser.close()
            if os.environ.get("KERNEL_TEST_SCREENSHOTS"):
                shutil.copy(tmp_path / "static.png", os.environ["KERNEL_TEST_SCREENSHOTS"])


@pytest.mark.slow
def test_lab_edits_and_reruns_a_cell_and_history_shows_the_new_version(lab: tuple[str, Path], scripted_lm) -> None:
    """JupyterLab sends each cell's id: a cell edited and run again replaces its turn in what the next turn sees."""
    from playwright.sync_api import expect, sync_playwright

    url, folder = lab
    for answer in ("apple-one", "blue-one", "carrot-two"):
        scripted_lm.add("*", [step("done", f"SUBMIT(answer={answer!r})")])
    tasks = ["%fleet output", "alpha: name a fruit", "beta: name a colour", "%fleet history"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(t) for t in tasks])
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Fleet RLM (test)", "language": "markdown"}
    nbformat.write(nb, folder / "t.ipynb")
    shots = folder / "screenshots"
    shots.mkdir()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            page.goto(url)
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_be_attached(timeout=120_000)
            cells = page.locator(".jp-Cell")

            def run(index: int, expect_text: str, *, replace: str | None = None) -> None:
                dialog = page.locator(".jp-Dialog .jp-mod-accept")
                if dialog.count():  # Lab sometimes asks to confirm the notebook's kernel: keep it
                    dialog.first.click()
                cells.nth(index).locator(".cm-content").click()
                if replace is not None:
                    page.keyboard.press("Control+a")
                    page.keyboard.type(replace)
                page.keyboard.press("Control+Enter")
                expect(cells.nth(index).locator(".jp-OutputArea")).to_contain_text(expect_text, timeout=120_000)

            deadline = time.monotonic() + 120
            while not cells.nth(0).locator(".jp-OutputArea-output").count():  # the kernel takes requests
                assert time.monotonic() < deadline, "the kernel never ran the first cell"
                run(0, "")
                page.wait_for_timeout(700)
            run(1, "apple-one")
            run(2, "blue-one")
            run(1, "carrot-two", replace="alpha: name a vegetable")
            run(3, "The next turn sees 2 earlier turns")
            shown = cells.nth(3).locator(".jp-OutputArea").inner_text()
            page.screenshot(path=str(shots / "history.png"))
            assert "name a fruit" not in shown and "apple-one" not in shown
            order = [shown.index(text) for text in ("alpha: name a vegetable", "carrot-two", "beta: name a colour")]
            assert order == sorted(order)
        except BaseException:
            page.screenshot(path=str(shots / "failure.png"))
            raise
        finally:
            browser.close()
            if os.environ.get("KERNEL_TEST_SCREENSHOTS"):
                shutil.copytree(shots, os.environ["KERNEL_TEST_SCREENSHOTS"], dirs_exist_ok=True)
