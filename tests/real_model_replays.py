"""Qwen2.5-Coder-1.5B-Instruct's recorded turns (``scripts/real-model.sh --record tests/data``, see
``docs/real-models.md``) and what a replay of one must show again: shared by the API's and the kernel's
replay tests."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]
TERMINAL = {"turn.completed", "turn.failed", "turn.cancelled"}


def suite() -> Any:
    """``scripts/real_model.py``: the tasks' data, made the same way as when they were recorded."""
    sys.path.insert(0, str(ROOT / "scripts"))
    return importlib.import_module("real_model")


def load(name: str) -> dict[str, Any]:
    """A cassette in tests/data (its header lists the turns it holds and the configuration they ran under)."""
    path = DATA / name
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"turns": [], "exchanges": []}


def fleet_toml(header: dict[str, Any]) -> str:
    """The fleet.toml the recorded turns ran under, with the replay answering at once."""
    config = header["config"]
    toml = "[limits]\n" + "".join(f"{k} = {v}\n" for k, v in config["limits"].items())
    return toml + f'\n[lm]\nmax_tokens = {config["max_tokens"]}\nreplay_pace = "at_once"\n'


def ending(events: list[dict[str, Any]]) -> dict[str, Any]:
    terminal = [e for e in events if e["type"] in TERMINAL]
    assert len(terminal) == 1 and events[-1] is terminal[0], [e["type"] for e in events]
    return terminal[0]


def assert_as_recorded(events: list[dict[str, Any]], turn: dict[str, Any]) -> None:
    """The replayed turn's events show what the live one did: how it ended, the answer (marked when it was
    extracted, with the limit that ended the steps), the steps as the model wrote them, each step's error
    and its hint, and the number of model calls."""
    end = ending(events)
    assert end["type"] == turn["outcome"], end["data"]
    assert (
        max((e["data"]["iteration"] for e in events if e["type"] == "iteration.started"), default=0)
        == turn["iterations"]
    )
    assert sum(e["type"] == "lm.finished" for e in events) == turn["lm_calls"]
    codes = [e["data"]["code"] for e in events if e["type"] == "code"]  # a reply that did not parse has none
    assert len(codes) == len(turn["step_errors"]) and all(c.strip() for c in codes)
    errors = [(e["data"]["error"] or {}) for e in events if e["type"] == "execution.finished"]
    assert [x.get("type") for x in errors] == turn["step_errors"]
    for error in errors:  # a path the model got wrong says where the working directory is
        if "No such file or directory: 'workspace/" in error.get("message", ""):
            assert "The working directory is /workspace: write '/workspace/" in error["message"]
    if end["type"] == "turn.completed":
        assert end["data"]["answer"] == turn["answer"]
        assert end["data"].get("extracted", False) == turn["extracted"]
        assert end["data"].get("reason") == turn.get("reason")
    else:
        assert end["data"]["error"]["type"] == turn["error_type"] != "lm_replay_miss"
        message = end["data"]["error"]["message"]
        ours = message.split("What the model said")[0]  # the model's own text may quote a traceback it saw
        assert ours.strip() and "Traceback" not in ours
