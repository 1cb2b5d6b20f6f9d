"""An evaluation's outputs: the printed table, ``results.json`` and ``results.csv``, and a report notebook
(with its HTML) that holds the summary and the transcripts of the runs that did not pass."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from dataclasses import asdict, fields
from pathlib import Path

from fleet_kernel import identity
from fleet_kernel.evals.run import EvalReport, RunResult
from fleet_kernel.markdown import md_escape
from fleet_kernel.store import Store
from fleet_kernel.transcript import turn_outputs, turn_view


def summary_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    """The table as text: one row per task (its mean score on each model), then each model's totals."""
    header = ["task", *report.models]
    rows = [[t, *(f"{report.cell(t, m):.2f}" for m in report.models)] for t in report.task_ids]
    summaries = report.summary()
    spread = report.repeat > 1
    rows.append(
        [
            "mean" + (" ± spread" if spread else ""),
            *(f"{s.mean:.2f}" + (f" ± {s.spread:.2f}" if spread else "") for s in summaries),
        ]
    )
    rows.append(["passed", *(f"{s.passed}/{s.runs}" for s in summaries)])
    rows.append(["iterations (mean)", *(f"{s.iterations:.1f}" for s in summaries)])
    rows.append(["tokens", *(f"{s.tokens:,}" for s in summaries)])
    rows.append(["cost (USD)", *(f"{s.cost_usd:.4f}" for s in summaries)])
    rows.append(["time (s)", *(f"{s.duration_s:.1f}" for s in summaries)])
    return header, rows


def render_table(report: EvalReport, *, width: int = 120) -> str:
    """The table for a terminal, drawn by rich."""
    from rich.console import Console  # noqa: PLC0415 - rich only for a terminal table
    from rich.table import Table  # noqa: PLC0415 - rich only for a terminal table

    header, rows = summary_rows(report)
    table = Table(title=f"fleet eval {report.name}", title_justify="left")
    for n, name in enumerate(header):
        table.add_column(name, justify="left" if n == 0 else "right")
    for n, row in enumerate(rows):
        table.add_row(*row, end_section=n == len(report.task_ids) - 1)
    console = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False)
    console.print(table)
    text: str = console.file.getvalue()  # type: ignore[attr-defined]
    return text


def markdown_table(report: EvalReport) -> str:
    header, rows = summary_rows(report)
    header = [md_escape(h, literal=True) for h in header]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_escape(c, literal=True) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(report: EvalReport, folder: Path) -> list[Path]:
    """``results.json`` (everything) and ``results.csv`` (one row per run) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    as_json = folder / "results.json"
    as_json.write_text(json.dumps(report.to_dict(), indent=2, ensure_ascii=False), encoding="utf-8")
    as_csv = folder / "results.csv"
    names = [f.name for f in fields(RunResult)]
    with as_csv.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=names)
        writer.writeheader()
        for result in report.results:
            row = asdict(result)
            row["error"] = json.dumps(row["error"]) if row["error"] else ""
            writer.writerow(row)
    return [as_json, as_csv]


async def write_report(report: EvalReport, store: Store, folder: Path) -> list[Path]:
    """``report.ipynb`` and ``report.html``: the table, then each failing run's transcript."""
    import nbformat  # noqa: PLC0415 - nbformat and nbconvert (~2 s) only for a report
    from nbconvert import HTMLExporter  # noqa: PLC0415 - nbformat and nbconvert (~2 s) only for a report
    from nbformat import v4  # noqa: PLC0415 - nbformat and nbconvert (~2 s) only for a report

    cells = [v4.new_markdown_cell(f"# fleet eval {report.name}\n\n{markdown_table(report)}")]
    failures = report.failures()
    cells.append(
        v4.new_markdown_cell(f"## Runs that did not pass ({len(failures)})" if failures else "All runs passed.")
    )
    for result in failures:
        title = (
            f"{md_escape(result.task_id, literal=True)} · {md_escape(result.model, literal=True)} · #{result.repeat}"
        )
        reason = md_escape(result.reason, literal=True)
        note = f"### {title}: score {result.score:.2f}\n\n{reason}\n\nsession `{result.session_id}`"
        cells.append(v4.new_markdown_cell(note))
        if not result.turn_id:
            continue
        turn = await store.get_turn(result.turn_id)
        cell = v4.new_code_cell(source=turn.task, execution_count=turn.position)
        cell.outputs = await turn_outputs(store, await turn_view(store, turn), turn.position)
        cell.metadata["fleet"] = {"turn_id": turn.turn_id, "session_id": turn.session_id, "status": turn.status}
        cells.append(cell)
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = dict(identity.KERNELSPEC)
    nb.metadata["language_info"] = dict(identity.LANGUAGE_INFO)
    notebook, page = folder / "report.ipynb", folder / "report.html"

    def write() -> list[Path]:  # on a thread: the HTML export takes a while, the loop keeps serving
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(notebook))
        html, _ = HTMLExporter().from_notebook_node(nb)
        page.write_text(html, encoding="utf-8")
        return [notebook, page]

    return await asyncio.to_thread(write)
