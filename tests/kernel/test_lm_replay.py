"""Tests for fleet_kernel.engine.replay: record a model's exchanges, replay them offline."""

from __future__ import annotations

from pathlib import Path

import dspy
import pytest

from fleet_kernel.engine.lm import MeteredLM
from fleet_kernel.engine.replay import Cassette, recording, replay_lm
from fleet_kernel.errors import LMError


def _ask(lm: dspy.LM, question: str) -> str:
    with dspy.context(lm=lm):
        return dspy.Predict("question -> answer")(question=question).answer


def test_record_then_replay_offline(scripted_lm, tmp_path: Path) -> None:
    scripted_lm.default = {"answer": "forty-two"}
    cassette = tmp_path / "c.json"
    real = MeteredLM("openai/scripted", api_base=scripted_lm.base_url, api_key="sk-test", cache=False)
    assert _ask(recording(real, cassette), "size 1024 bytes?") == "forty-two"
    served = len(scripted_lm.requests)
    replay = replay_lm(str(cassette))
    # Digit runs may drift (file sizes, timings): the loose key still finds the exchange.
    assert _ask(replay, "size 2048 bytes?") == "forty-two"
    assert len(scripted_lm.requests) == served
    assert Cassette.load(cassette).data["model"] == "openai/scripted"


def test_a_request_not_in_the_cassette_is_a_clear_error(scripted_lm, tmp_path: Path) -> None:
    scripted_lm.default = {"answer": "yes"}
    cassette = tmp_path / "c.json"
    real = MeteredLM("openai/scripted", api_base=scripted_lm.base_url, api_key="sk-test", cache=False)
    _ask(recording(real, cassette), "is it recorded?")
    with pytest.raises(Exception, match=r"has no answer for this request.*nearest recorded request differs"):
        _ask(replay_lm(str(cassette)), "something never asked")


def test_missing_cassette_says_how_to_record(tmp_path: Path) -> None:
    with pytest.raises(LMError, match="FLEET_LM_RECORD"):
        replay_lm(str(tmp_path / "nope.json"))
