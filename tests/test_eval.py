"""Tests for fleet_kernel.evals: data sets, scorers, runs in fresh sessions, the table, the report, ``fleet eval``."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner
from scripted_lm import ScriptedLM, step

from fleet_kernel.engine import TurnRunner
from fleet_kernel.errors import ValidationError
from fleet_kernel.evals import EvalTask, load_dataset, run_dataset, score_answer
from fleet_kernel.evals.report import render_table
from fleet_kernel.store import Store


def submit(answer: str) -> list[dict[str, str]]:
    return [step("answering", f"SUBMIT(answer={answer!r})")]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------------------------------------- data sets


def test_jsonl_csv_and_notebook_data_sets(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("1,2,3")
    rows = [
        {"id": "sum", "task": "Add 2 and 2", "expected": 4, "scorer": "numeric", "tolerance": 0.1},
        {"task": "Name the capital of France", "expected": "Paris", "scorer": "contains", "attachments": ["data.txt"]},
        {"task": "Give a point as JSON", "schema": {"type": "object", "required": ["x"]}},
        {"task": "Write a haiku", "rubric": "three lines"},
    ]
    tasks = load_dataset(write_jsonl(tmp_path / "set.jsonl", rows))
    assert [t.task_id for t in tasks] == ["sum", "2", "3", "4"]
    assert [t.scorer for t in tasks] == ["numeric", "contains", "json_schema", "judge"]
    assert tasks[1].attachments == (tmp_path / "data.txt",)

    (tmp_path / "set.csv").write_text('id,task,expected,scorer,inputs\na,Say hi,hi,exact,"{""n"": 1}"\n')
    (only,) = load_dataset(tmp_path / "set.csv")
    assert (only.task_id, only.expected, only.inputs) == ("a", "hi", {"n": 1})

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# not a task"),
        nbformat.v4.new_code_cell("What is 6*7?", metadata={"fleet_eval": {"id": "q", "expected": "42"}}),
    ]
    nbformat.write(nb, str(tmp_path / "set.ipynb"))
    (cell,) = load_dataset(tmp_path / "set.ipynb")
    assert (cell.task_id, cell.task, cell.expected, cell.scorer) == ("q", "What is 6*7?", "42", "exact")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"task": "x", "expected": 1, "colour": "red"}, "unknown fields colour"),
        ({"expected": 1}, "'task'"),
        ({"task": "x"}, "needs 'expected'"),
        ({"task": "x", "scorer": "fuzzy", "expected": 1}, "not one of"),
        ({"task": "x", "scorer": "numeric", "expected": "many"}, "needs a number"),
        ({"task": "x", "expected": 1, "attachments": ["missing.csv"]}, "attachment not found"),
    ],
)
def test_a_bad_row_is_named_with_what_to_fix(tmp_path: Path, row: dict, message: str) -> None:
    with pytest.raises(ValidationError, match="set.jsonl row 1") as info:
        load_dataset(write_jsonl(tmp_path / "set.jsonl", [row]))
    assert message in info.value.message


def test_scorers() -> None:
    def task(**kw: object) -> EvalTask:
        return EvalTask(task_id="t", task="t", **kw)  # type: ignore[arg-type]

    assert score_answer(task(scorer="exact", expected="Paris"), "  paris ").value == 1
    assert score_answer(task(scorer="exact", expected="Paris"), "Paris, France").value == 0
    assert score_answer(task(scorer="contains", expected="Paris"), "It is London.").value == 0
    assert score_answer(task(scorer="contains", expected="paris"), "It is Paris.").value == 1
    assert score_answer(task(scorer="numeric", expected=3.14, tolerance=0.01), "pi is about 3.141").value == 1
    assert score_answer(task(scorer="numeric", expected=2, tolerance=0.5), "1,000 apples").value == 0
    schema = {"type": "object", "required": ["x"], "properties": {"x": {"type": "integer"}}}
    assert score_answer(task(scorer="json_schema", schema=schema), '```json\n{"x": 1}\n```').value == 1
    assert "schema" in score_answer(task(scorer="json_schema", schema=schema), '{"x": "one"}').reason
    assert score_answer(task(scorer="json_schema", schema=schema), "", result={"x": 2}).value == 1
    assert score_answer(task(scorer="exact", expected="x"), None).reason == "no answer"


# ---------------------------------------------------------------------------------------------- runs


@pytest.mark.slow
async def test_every_task_runs_on_every_model_in_fresh_sessions(
    runner: TurnRunner, store: Store, scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    data = write_jsonl(
        tmp_path / "arith.jsonl",
        [
            {"id": "four", "task": "What is 2+2? (four)", "expected": 4, "scorer": "numeric"},
            {"id": "paris", "task": "Capital of France? (paris)", "expected": "Paris", "scorer": "contains"},
        ],
    )
    # model A gets both right in both repeats; model B gets "four" wrong once
    for answer in ["4", "4", "4", "5"]:
        scripted_lm.add("(four)", submit(answer))
    scripted_lm.add("(paris)", submit("Paris") * 4)
    seen: list[tuple[int, int]] = []
    outcome = await run_dataset(
        runner,
        data,
        models=["openai/model-a", "openai/model-b"],
        repeat=2,
        concurrency=1,
        out=tmp_path / "out",
        progress=lambda result, done, total: seen.append((done, total)),
    )
    report = outcome.report
    assert seen == [(n, 8) for n in range(1, 9)]
    assert len(report.results) == 8
    assert len({r.session_id for r in report.results}) == 8  # each run its own session
    for result in report.results:
        session = await store.get_session(result.session_id)
        assert session.model == result.model and session.turn_count == 1
        assert session.title.startswith(f"eval arith: {result.task_id}")
        assert result.status == "completed" and result.iterations == 1 and result.tokens > 0
    a, b = report.summary()
    assert (a.model, a.mean, a.spread, a.passed) == ("openai/model-a", 1.0, 0.0, 4)
    assert (b.model, b.mean, b.spread, b.passed) == ("openai/model-b", 0.75, 0.25, 3)
    assert report.cell("four", "openai/model-b") == 0.5

    table = render_table(report)
    assert "openai/model-a" in table and "0.75 ± 0.25" in table and "3/4" in table
    names = sorted(p.name for p in outcome.files)
    assert names == ["report.html", "report.ipynb", "results.csv", "results.json"]
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["summary"][1]["mean"] == 0.75
    nb = nbformat.read(str(tmp_path / "out" / "report.ipynb"), as_version=4)
    failing = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.source for c in failing] == ["What is 2+2? (four)"]  # only the failed run's transcript
    assert "5" in json.dumps(failing[0].outputs)


async def test_a_failed_turn_scores_zero_and_the_rest_go_on(
    runner: TurnRunner, scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    data = write_jsonl(
        tmp_path / "set.jsonl",
        [{"id": "bad", "task": "fails (bad)", "expected": "x"}, {"id": "ok", "task": "works (ok)", "expected": "x"}],
    )
    scripted_lm.add("(bad)", [{"status": 401, "error": "invalid key"}])
    scripted_lm.add("(ok)", submit("x"))
    outcome = await run_dataset(runner, data, out=tmp_path / "out")
    bad, ok = outcome.report.results
    assert (bad.status, bad.score) == ("failed", 0.0) and "failed" in bad.reason
    assert (ok.status, ok.score) == ("completed", 1.0)


async def test_a_scripted_judge_grades_rubric_tasks(
    runner: TurnRunner, scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    rubric = "a greeting that names the user Ada, warmly"
    data = write_jsonl(tmp_path / "set.jsonl", [{"id": "hi", "task": "Greet Ada (hi)", "rubric": rubric}])
    scripted_lm.add("(hi)", submit("Hello Ada!"))
    scripted_lm.add(rubric, [{"score": "0.5", "reason": "warm enough"}])
    outcome = await run_dataset(runner, data, out=tmp_path / "out")
    (result,) = outcome.report.results
    assert (result.score, result.reason) == (0.5, "judge: warm enough")
    judged = scripted_lm.requests[-1]
    assert "Hello Ada!" in json.dumps(judged["messages"])


async def test_a_model_not_allowed_is_refused_before_anything_runs(
    runner: TurnRunner, store: Store, scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    data = write_jsonl(tmp_path / "set.jsonl", [{"task": "t", "expected": "x"}])
    with pytest.raises(ValidationError, match="anthropic/claude"):
        await run_dataset(runner, data, models=["openai/scripted", "anthropic/claude"])
    with pytest.raises(ValidationError, match="--repeat"):
        await run_dataset(runner, data, repeat=0)
    assert list(await store.list_sessions()) == []
    assert scripted_lm.requests == []


def test_fleet_eval_command(fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path, monkeypatch) -> None:
    from fleet_api.cli import main

    for key, value in fleet_env.items():
        monkeypatch.setenv(key, value)
    data = write_jsonl(tmp_path / "set.jsonl", [{"id": "q", "task": "Answer (q)", "expected": "yes"}])
    scripted_lm.add("(q)", submit("no"))
    result = CliRunner().invoke(main, ["eval", str(data), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "[1/1] FAIL q" in result.stderr
    assert "passed" in result.stdout and "0/1" in result.stdout
    assert (tmp_path / "out" / "report.html").is_file()

    missing = CliRunner().invoke(main, ["eval", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 1 and "no data set at" in missing.output


async def test_a_recorded_real_model_is_measured_offline(tmp_path: Path) -> None:
    """The cassette of a real small model (tests/test_real_model.py): it never SUBMITs, so every run fails, 0."""
    from fleet_kernel.config import load_settings

    cassette = Path(__file__).parent / "data" / "real-model.cassette.json"
    recorded = json.loads(cassette.read_text(encoding="utf-8"))
    config = tmp_path / "fleet.toml"
    limits = {k: recorded["limits"][k] for k in ("max_iters", "max_llm_calls", "max_output_chars")}
    config.write_text("[limits]\n" + "".join(f"{k} = {v}\n" for k, v in limits.items()), encoding="utf-8")
    (tmp_path / "home").mkdir()
    settings = load_settings(
        {"FLEET_HOME": str(tmp_path / "home"), "FLEET_CONFIG": str(config), "FLEET_LM_MODEL": f"replay/{cassette}"}
    )
    rows = [
        {"id": f"t{n}", "task": t["task"], "expected": 51, "scorer": "numeric"} for n, t in enumerate(recorded["turns"])
    ]
    store = await Store.open(settings.database_url)
    runner = await TurnRunner(store, settings).open()
    try:
        outcome = await run_dataset(runner, write_jsonl(tmp_path / "real.jsonl", rows), out=tmp_path / "out")
    finally:
        await runner.close()
        await store.close()
    results = outcome.report.results
    assert [(r.status, r.score) for r in results] == [("failed", 0.0)] * len(recorded["turns"])
    assert all(r.error and r.error["type"] == "lm_parse_error" for r in results)
    assert all(r.iterations == 1 for r in results)
    (summary,) = outcome.report.summary()
    assert (summary.model, summary.passed, summary.runs) == (f"replay/{cassette}", 0, len(results))


@pytest.mark.slow
async def test_runs_beyond_the_sandbox_cap_wait_for_a_slot(
    fleet_env: dict[str, str], store: Store, scripted_lm: ScriptedLM, tmp_path: Path, private_slots: Path
) -> None:
    # private_slots: the cap counts every sandbox of this user on the machine, the other workers' tests' too
    from fleet_kernel.config import load_settings

    config = tmp_path / "fleet.toml"
    config.write_text("[sandbox]\nmax_sandboxes = 1\n")
    settings = load_settings({**fleet_env, "FLEET_CONFIG": str(config), "FLEET_SANDBOX": "local"})
    rows = [{"id": f"t{n}", "task": f"Say ok (cap {n})", "expected": "ok"} for n in range(3)]
    for n in range(3):
        scripted_lm.add(f"(cap {n})", [{"delay": 0.5, **step("Slowly.", "SUBMIT(answer='ok')")}])
    runner = await TurnRunner(store, settings).open()
    try:
        outcome = await run_dataset(
            runner, write_jsonl(tmp_path / "cap.jsonl", rows), concurrency=3, out=tmp_path / "o"
        )
    finally:
        await runner.close()
    assert [(r.status, r.score) for r in outcome.report.results] == [("completed", 1.0)] * 3, [
        r.reason for r in outcome.report.results
    ]
