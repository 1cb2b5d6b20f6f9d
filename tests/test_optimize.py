"""Tests for ``fleet optimize``: GEPA over the RLM's instructions on real turns, the held-out gate, the versioned
file that ``[lm] instructions`` selects; the scripted LM answers the turns and the reflection."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings
from fleet_kernel.engine import TurnRunner
from fleet_kernel.errors import ConfigError, ValidationError
from fleet_kernel.evals.dataset import load_dataset
from fleet_kernel.evals.optimize import optimize, split
from fleet_kernel.store import Store

MARKER = "ALWAYS-SAY-XYZZY"  # in the instructions the reflection proposes; the LM answers right when it sees it
RIGHT = step("I was told the word.", "SUBMIT(answer='xyzzy')")
WRONG = step("No idea.", "SUBMIT(answer='plugh')")


def _dataset(tmp_path: Path, n: int = 3) -> Path:
    rows = [{"id": f"w{i}", "task": f"Say the magic word, take {i}", "expected": "xyzzy"} for i in range(n)]
    path = tmp_path / "magic.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Callable[..., object]]:
    """A runner over a fresh store, wired to a scripted LM whose reflection proposes ``proposal``."""
    opened: list[tuple[ScriptedLM, Store, TurnRunner]] = []

    async def build(proposal: str, config: str = "") -> TurnRunner:
        lm = ScriptedLM({MARKER: [RIGHT] * 60}, default=WRONG, sub=lambda prompt: f"```\n{proposal}\n```").start()
        (tmp_path / "fleet.toml").write_text(config)
        home = tmp_path / f"home-{len(opened)}"
        home.mkdir()
        settings = load_settings({"FLEET_HOME": str(home), "FLEET_CONFIG": str(tmp_path / "fleet.toml"), **lm.env()})
        store = await Store.open(settings.database_url)
        runner = await TurnRunner(store, settings).open()
        opened.append((lm, store, runner))
        return runner

    yield build
    for lm, store, runner in opened:
        await runner.close()
        await store.close()
        lm.close()


def test_the_split_is_seeded_and_keeps_both_sides(tmp_path: Path) -> None:
    tasks = load_dataset(_dataset(tmp_path, 10))
    train, held = split(tasks, 0.3, seed=1)
    assert len(held) == 3 and len(train) == 7 and not {t.task_id for t in train} & {t.task_id for t in held}
    assert split(tasks, 0.3, seed=1) == (train, held)
    with pytest.raises(ValidationError, match="at least 2"):
        split(tasks[:1], 0.3, seed=0)
    with pytest.raises(ValidationError, match="--holdout"):
        split(tasks, 1.5, seed=0)


@pytest.mark.slow
async def test_a_better_candidate_is_adopted_and_fleet_toml_selects_it(make, tmp_path: Path) -> None:
    runner = await make(f"{MARKER}: answer with the magic word.")
    out = tmp_path / "instructions"
    outcome = await optimize(runner, _dataset(tmp_path), out=out, holdout=0.34, budget=12)
    assert (outcome.baseline, outcome.candidate, outcome.adopted) == (0.0, 1.0, True)
    assert outcome.instructions == out / "instructions-v1.md"
    assert MARKER in outcome.instructions.read_text()
    (record,) = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert (record["baseline"], record["candidate"], record["adopted"]) == (0.0, 1.0, True)
    assert len(record["heldout"]) == 1 and len(record["train"]) == 2

    # [lm] instructions selects the file: a plain turn now runs with those instructions
    chosen = await make("unused", config=f'[lm]\ninstructions = "{outcome.instructions}"\n')
    session = await chosen.store.create_session("check")
    turn = await chosen.run(session.session_id, "Say the magic word")
    assert turn.answer == "xyzzy"


@pytest.mark.slow
async def test_a_candidate_that_is_no_better_on_held_out_tasks_is_not_adopted(make, tmp_path: Path) -> None:
    runner = await make("Think harder about the magic word.")  # no marker: the answers stay wrong
    out = tmp_path / "instructions"
    outcome = await optimize(runner, _dataset(tmp_path), out=out, holdout=0.34, budget=12)
    assert outcome.adopted is False and outcome.instructions is None
    assert outcome.baseline == outcome.candidate == 0.0
    assert list(out.glob("instructions-v*.md")) == []
    (record,) = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert record["adopted"] is False


# ---------------------------------------------------------------------- links planted in the output folder


async def test_an_instructions_folder_swapped_for_a_link_is_refused_before_any_run(make, tmp_path: Path) -> None:
    runner = await make(f"{MARKER}: answer with the magic word.")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (runner.settings.home / "instructions").symlink_to(elsewhere)  # $FLEET_HOME/instructions, the default
    with pytest.raises(ConfigError, match="instructions"):
        await optimize(runner, _dataset(tmp_path), holdout=0.34, budget=12)
    assert list(elsewhere.iterdir()) == []
    assert await runner.store.list_sessions() == []  # refused before a task ran


async def test_a_history_swapped_for_a_link_is_refused_before_any_run(make, tmp_path: Path) -> None:
    runner = await make(f"{MARKER}: answer with the magic word.")
    out = tmp_path / "instructions"
    out.mkdir()
    victim = tmp_path / "victims-file"
    victim.write_text("keep me\n")
    (out / "history.jsonl").symlink_to(victim)
    with pytest.raises(ConfigError, match="history.jsonl"):
        await optimize(runner, _dataset(tmp_path), out=out, holdout=0.34, budget=12)
    assert victim.read_text() == "keep me\n"
    assert await runner.store.list_sessions() == []


@pytest.mark.slow
async def test_a_candidate_file_swapped_for_a_link_is_replaced_not_written_through(make, tmp_path: Path) -> None:
    from fleet_kernel.engine.turn import base_instructions

    runner = await make(f"{MARKER}: answer with the magic word.")
    baseline = base_instructions(runner.settings)
    planted = tmp_path / "instructions" / "candidates" / f"{hashlib.sha256(baseline.encode()).hexdigest()[:16]}.md"
    planted.parent.mkdir(parents=True)
    victim = tmp_path / "victims-file"
    victim.write_text("keep me\n")
    planted.symlink_to(victim)
    outcome = await optimize(runner, _dataset(tmp_path), out=tmp_path / "instructions", holdout=0.34, budget=12)
    assert outcome.adopted
    assert victim.read_text() == "keep me\n"
    assert not planted.is_symlink() and planted.read_text() == baseline


def test_fleet_optimize_command_refuses_a_tiny_data_set(tmp_path: Path, monkeypatch) -> None:
    from fleet_api.cli import main

    monkeypatch.setenv("FLEET_HOME", str(tmp_path))
    result = CliRunner().invoke(main, ["optimize", str(_dataset(tmp_path, 1))])
    assert result.exit_code == 1 and "at least 2 tasks" in result.output
