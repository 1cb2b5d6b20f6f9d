"""``fleet doctor`` with a replay model (``FLEET_LM_MODEL=replay/<cassette>``), run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "notebooks" / "quickstart.cassette.json"


def doctor(model: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEET_HOME": str(home), "FLEET_LM_MODEL": model, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "fleet_kernel.cli", "doctor", *args],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def lm_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stdout.splitlines() if " lm: " in line]
    assert len(lines) == 1, result.stdout + result.stderr
    return lines[0]


@pytest.mark.slow
def test_replay_model_checks_its_cassette(tmp_path: Path) -> None:
    result = doctor("replay/notebooks/quickstart.cassette.json", tmp_path, "lm")
    line = lm_line(result)
    assert result.returncode == 0, result.stdout + result.stderr
    exchanges = len(json.loads(QUICKSTART.read_text())["exchanges"])
    assert line.startswith("[ok] lm: replays ")
    assert "quickstart.cassette.json" in line and f"{exchanges} exchanges" in line and "recorded from scripted" in line


def test_missing_cassette_fails_saying_how_to_record_one(tmp_path: Path) -> None:
    result = doctor(f"replay/{tmp_path / 'nope.json'}", tmp_path, "lm")
    assert result.returncode == 1
    line = lm_line(result)
    assert line.startswith("[FAIL] lm: ") and "nope.json does not exist" in line and "FLEET_LM_RECORD=" in line
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_broken_cassettes_fail_saying_what_to_do(tmp_path: Path) -> None:
    broken = {
        "not-json.json": "{ this is not json",
        "wrong-shape.json": json.dumps({"version": 1, "exchanges": [{"messages": []}]}),
        "empty.json": json.dumps({"version": 1, "model": "openai/gpt-4.1-mini", "exchanges": []}),
    }
    for name, text in broken.items():
        (tmp_path / name).write_text(text)
        result = doctor(f"replay/{tmp_path / name}", tmp_path, "lm")
        line = lm_line(result)
        assert result.returncode == 1, line
        assert line.startswith("[FAIL] lm: ") and name in line and "FLEET_LM_RECORD=" in line, line
        assert "Traceback" not in result.stderr, result.stderr
