"""Data sets of tasks: JSONL or CSV rows, or a notebook whose cells are tasks.

A row has ``task`` and how to score the answer: ``expected`` with ``scorer`` (``exact`` by default,
``numeric`` with ``tolerance``, ``contains``), ``schema`` (the answer, read as JSON, must satisfy it), or
``rubric`` (a judge model grades the answer). ``id``, ``attachments`` (files, relative to the data set)
and ``inputs`` (a JSON object of values bound in the sandbox) are optional. In CSV, ``attachments`` is
``;``-separated and ``inputs`` and ``schema`` are JSON text. In a notebook, each code cell's source is a
task and its ``metadata.fleet_eval`` holds the other fields.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_kernel.errors import ValidationError

SCORERS = ("exact", "numeric", "contains", "json_schema", "judge")
FIELDS = frozenset({"id", "task", "expected", "scorer", "tolerance", "schema", "rubric", "attachments", "inputs"})


@dataclass(frozen=True)
class EvalTask:
    """One task of a data set and the rule its answer is scored by."""

    task_id: str
    task: str
    scorer: str
    expected: Any = None
    tolerance: float = 0.0
    schema: dict[str, Any] | None = None
    rubric: str | None = None
    attachments: tuple[Path, ...] = ()
    inputs: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        """The JSONL row this task reads back from (attachments as given)."""
        row: dict[str, Any] = {"id": self.task_id, "task": self.task, "scorer": self.scorer}
        for key, value in (("expected", self.expected), ("schema", self.schema), ("rubric", self.rubric)):
            if value is not None:
                row[key] = value
        if self.scorer == "numeric":
            row["tolerance"] = self.tolerance
        if self.inputs:
            row["inputs"] = self.inputs
        if self.attachments:
            row["attachments"] = [str(p) for p in self.attachments]
        return row


def load_dataset(path: Path) -> list[EvalTask]:
    """The tasks of a ``.jsonl``, ``.csv`` or ``.ipynb`` file, in order.

    Raises:
        ValidationError: no such file, an unknown format, or a row that is not a task
            (the message names the row and what to fix).
    """
    if not path.is_file():
        raise ValidationError(f"no data set at {path}: give a .jsonl, .csv or .ipynb file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = list(_jsonl_rows(path))
    elif suffix == ".csv":
        rows = list(_csv_rows(path))
    elif suffix == ".ipynb":
        rows = list(_notebook_rows(path))
    else:
        raise ValidationError(f"{path.name}: a data set is a .jsonl, .csv or .ipynb file")
    tasks = [task_of(row, f"{path.name} row {n}", path.parent) for n, row in enumerate(rows, 1)]
    if not tasks:
        raise ValidationError(f"{path.name} holds no tasks")
    return unique_ids(tasks, path.name)


def unique_ids(tasks: list[EvalTask], where: str) -> list[EvalTask]:
    """``tasks``, when no id names two of them. Raises ``ValidationError``."""
    ids = [t.task_id for t in tasks]
    duplicate = next((i for i in ids if ids.count(i) > 1), None)
    if duplicate is not None:
        raise ValidationError(f"{where}: the id {duplicate!r} names more than one task; ids must be unique")
    return tasks


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{path.name} line {n} is not JSON: {exc.msg}") from exc
        if not isinstance(row, dict):
            raise ValidationError(f"{path.name} line {n} is not a JSON object")
        rows.append(row)
    return rows


def _csv_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(newline="", encoding="utf-8") as handle:
        for n, raw in enumerate(csv.DictReader(handle), 1):
            row: dict[str, Any] = {k: v for k, v in raw.items() if k and v not in (None, "")}
            for key in ("inputs", "schema"):
                if key in row:
                    try:
                        row[key] = json.loads(row[key])
                    except json.JSONDecodeError as exc:
                        raise ValidationError(f"{path.name} row {n}: {key} is not JSON: {exc.msg}") from exc
            if "attachments" in row:
                row["attachments"] = [p.strip() for p in str(row["attachments"]).split(";") if p.strip()]
            rows.append(row)
    return rows


def _notebook_rows(path: Path) -> list[dict[str, Any]]:
    import nbformat  # noqa: PLC0415 - slow to import; only notebook data sets need it

    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as exc:  # noqa: BLE001 - any unreadable notebook is one readable error
        raise ValidationError(f"{path.name} is not a notebook: {exc}") from exc
    rows = []
    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        meta = dict(cell.metadata.get("fleet_eval") or {})
        rows.append({**meta, "task": cell.source})
    return rows


def task_of(row: dict[str, Any], where: str, base: Path) -> EvalTask:
    """One row as a task. Raises ``ValidationError`` naming ``where`` and what is wrong."""
    unknown = set(row) - FIELDS
    if unknown:
        raise ValidationError(
            f"{where}: unknown fields {', '.join(sorted(unknown))} (known: {', '.join(sorted(FIELDS))})"
        )
    task = row.get("task")
    if not isinstance(task, str) or not task.strip():
        raise ValidationError(f"{where}: 'task' must be the text of the task")
    scorer = row.get("scorer") or ("json_schema" if "schema" in row else "judge" if "rubric" in row else "exact")
    if scorer not in SCORERS:
        raise ValidationError(f"{where}: scorer {scorer!r} is not one of {', '.join(SCORERS)}")
    needs = {"json_schema": "schema", "judge": "rubric"}.get(scorer, "expected")
    if row.get(needs) is None:
        raise ValidationError(f"{where}: the {scorer} scorer needs '{needs}'")
    schema = row.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise ValidationError(f"{where}: 'schema' must be a JSON Schema object")
    inputs = row.get("inputs") or {}
    if not isinstance(inputs, dict):
        raise ValidationError(f"{where}: 'inputs' must be an object of names to values")
    attachments = row.get("attachments") or []
    if not isinstance(attachments, list) or not all(isinstance(a, str) for a in attachments):
        raise ValidationError(f"{where}: 'attachments' must be a list of file paths")
    files = tuple(base / a for a in attachments)
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ValidationError(f"{where}: attachment not found: {', '.join(missing)}")
    try:
        tolerance = float(row.get("tolerance", 0.0))
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{where}: 'tolerance' must be a number") from exc
    if scorer == "numeric" and _number(row.get("expected")) is None:
        raise ValidationError(f"{where}: the numeric scorer needs a number as 'expected'")
    return EvalTask(
        task_id=str(row.get("id") or where.rsplit(" ", 1)[-1]),
        task=task,
        scorer=scorer,
        expected=row.get("expected"),
        tolerance=tolerance,
        schema=schema,
        rubric=row.get("rubric"),
        attachments=files,
        inputs=inputs,
    )


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def append_row(path: Path, task: EvalTask) -> None:
    """Add ``task`` to a JSONL data set (created when missing)."""
    if path.suffix.lower() != ".jsonl":
        raise ValidationError(f"{path.name}: turns are added to a .jsonl data set")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(task.to_row(), ensure_ascii=False) + "\n")
