"""JupyterLab in a real browser shows Fleet's Markdown outputs as written: dollars, every help row, bold marks.

JupyterLab typesets the text between two ``$`` of an output as TeX and reads ``<title>`` as an element; what a
user sees is the output area's rendered text, so that is what these tests read (live, then after a reload).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from kernel_harness import CHROMIUM, KERNEL
from scripted_lm import step
from test_kernel_browser import FLAGS

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]
PRICES = "the basic plan costs $5 and the pro plan costs $10"
HELP_ROWS = (
    "%fleet export",
    "fleet-<title>-<id>.ipynb",
    "%fleet serve",
    "%fleet set",
    "%fleet skill",
    "%fleet history",
)
CELLS = [
    "%fleet output",
    "what do the plans cost?",
    "%fleet status",
    "%fleet usage",
    "%fleet help",
    "%fleet session list",
    "%fleet skill use long-context-search",
    "%fleet skill list",
]


def _check(texts: list[str]) -> None:
    """What each cell of ``CELLS`` must show, read from its rendered output area."""
    turn, status, usage, help_, sessions, _, skills = texts[1:]
    assert f"I think {PRICES}" in turn and f"The answer: {PRICES}." in turn, turn
    for shown in (status, usage):
        assert re.search(r"usage: .*, \$\d+\.\d{4}", shown) and re.search(r"last turn: .*, \$\d+\.\d{4}", shown), shown
    for row in HELP_ROWS:
        assert row in help_, (row, help_)
    assert "%fleet status | usage" in help_ and "\\|" not in help_
    for shown in texts:
        assert "\\$" not in shown and "**" not in shown, shown
    assert "long-context-search" in skills and "Selected for the next turns: long-context-search" in skills
    assert "turns" in sessions


def test_lab_shows_dollars_help_rows_and_marks_as_written_live_and_after_a_reload(
    lab: tuple[str, Path],
    scripted_lm,
) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, folder = lab
    slow = "import time\nprint('checking', flush=True)\ntime.sleep(3)\nprint('checked')"
    scripted_lm.add(
        "plans", [step(f"I think {PRICES}.", slow), step("done", f"SUBMIT(answer={'The answer: ' + PRICES + '.'!r})")]
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
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

            def output(index: int) -> str:
                return cells.nth(index).locator(".jp-OutputArea").inner_text()

            def run(index: int, expect_text: str) -> None:
                dialog = page.locator(".jp-Dialog .jp-mod-accept")
                if dialog.count():  # Lab sometimes asks to confirm the notebook's kernel: keep it
                    dialog.first.click()
                cells.nth(index).locator(".cm-content").click()
                page.keyboard.press("Control+Enter")
                expect(cells.nth(index).locator(".jp-OutputArea")).to_contain_text(expect_text, timeout=120_000)

            deadline = time.monotonic() + 120
            while not cells.nth(0).locator(".jp-OutputArea-output").count():  # the kernel takes requests
                assert time.monotonic() < deadline, "the kernel never ran the first cell"
                run(0, "")
                page.wait_for_timeout(700)
            run(1, "checking")  # live: the reasoning while the code runs
            expect(cells.nth(1).locator(".jp-OutputArea")).to_contain_text(f"I think {PRICES}", timeout=120_000)
            page.screenshot(path=str(shots / "live.png"))
            expect(page.locator(".fleet-transcript")).to_contain_text(PRICES, timeout=120_000)
            for index, text in ((2, "session:"), (3, "session:"), (4, "%fleet history"), (5, "turns")):
                run(index, text)
            run(6, "long-context-search")
            run(7, "Selected for the next turns")
            expect(cells.nth(5).locator("strong code")).to_have_count(1)
            expect(cells.nth(7).locator("strong code")).to_have_text("long-context-search")
            page.wait_for_timeout(1000)  # let MathJax typeset what it would (it runs after an output is attached)
            page.screenshot(path=str(shots / "commands.png"), full_page=True)
            _check([output(i) for i in range(len(CELLS))])
            page.keyboard.press("Control+s")
            expect(page.locator(".jp-mod-dirty")).to_have_count(0, timeout=120_000)
            page.reload()
            expect(page.locator(".fleet-transcript")).to_contain_text(PRICES, timeout=120_000)
            page.wait_for_timeout(1000)  # let MathJax typeset what it would
            _check([output(i) for i in range(len(CELLS))])
            page.screenshot(path=str(shots / "reloaded.png"), full_page=True)
        except BaseException:
            page.screenshot(path=str(shots / "failure.png"))
            raise
        finally:
            browser.close()
            if os.environ.get("KERNEL_TEST_SCREENSHOTS"):
                shutil.copytree(shots, os.environ["KERNEL_TEST_SCREENSHOTS"], dirs_exist_ok=True)
