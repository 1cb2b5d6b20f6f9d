"""``[lm] num_retries``, ``request_timeout_s`` and ``temperature``, per root and sub model: a transient provider
error (429, 503) is sent again with backoff, each attempt through the turn's budget; others are not retried."""

from __future__ import annotations

from pathlib import Path

import pytest
from one_turn import one_turn as _turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import load_settings
from fleet_kernel.engine import metered
from fleet_kernel.engine.lm import build_lms
from fleet_kernel.store import Store

DONE = step("Done.", "SUBMIT(answer='42')")


@pytest.fixture(autouse=True)
def _quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metered, "RETRY_BASE_S", 0.01)


async def test_429_then_503_then_success_completes_the_turn(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.add("*", [{"status": 429, "error": "slow down"}, {"status": 503, "error": "overloaded"}, DONE])
    events = await _turn(store, fleet_env, tmp_path, "the answer", "[lm]\nnum_retries = 2\n")
    assert events[-1].type == "turn.completed" and events[-1].data["answer"] == "42", events[-1].data
    assert len(scripted_lm.root_requests()) == 3
    finished = [e.data for e in events if e.type == "lm.finished"]
    assert len(finished) == 3  # each attempt is an LM call the watchers (and the budget) see
    assert [d["usage"].get("completion_tokens", 0) > 0 for d in finished] == [False, False, True], finished


async def test_retries_stop_at_num_retries_with_the_providers_words(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.add("*", [{"status": 503, "error": "overloaded"}] * 3 + [DONE])
    events = await _turn(store, fleet_env, tmp_path, "the answer", "[lm]\nnum_retries = 1\n")
    end = events[-1]
    assert end.type == "turn.failed", end.data
    assert len(scripted_lm.root_requests()) == 2  # the first request and one retry
    assert "overloaded" in end.data["error"]["message"]


async def test_a_bad_request_is_not_retried(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.add("*", [{"status": 400, "error": "bad request"}, DONE])
    events = await _turn(store, fleet_env, tmp_path, "the answer", "[lm]\nnum_retries = 3\n")
    assert events[-1].type == "turn.failed", events[-1].data
    assert len(scripted_lm.root_requests()) == 1


async def test_no_retry_once_the_token_budget_is_used(
    store: Store, fleet_env: dict[str, str], scripted_lm: ScriptedLM, tmp_path: Path
) -> None:
    scripted_lm.add("*", [step("Look.", "print(1)"), {"status": 503, "error": "overloaded"}, DONE])
    toml = "[lm]\nnum_retries = 5\n[limits]\nmax_turn_tokens = 1\n"
    events = await _turn(store, fleet_env, tmp_path, "the answer", toml)
    assert events[-1].type in ("turn.failed", "turn.completed", "turn.cancelled")
    assert len(scripted_lm.root_requests()) == 1  # the budget was used by the first call: nothing more is sent


def test_root_and_sub_models_get_their_own_settings(fleet_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text(
        "[lm]\nnum_retries = 4\nsub_num_retries = 0\nrequest_timeout_s = 30\nsub_request_timeout_s = 5\n"
        "temperature = 0.2\nsub_temperature = 0.9\nmax_tokens = 900\nsub_max_tokens = 300\n",
        encoding="utf-8",
    )
    root, sub = build_lms(load_settings({**fleet_env, "FLEET_CONFIG": str(config)}))
    assert (root.retries, root.kwargs["timeout"], root.kwargs["temperature"], root.kwargs["max_tokens"]) == (
        4,
        30,
        0.2,
        900,
    )
    assert (sub.retries, sub.kwargs["timeout"], sub.kwargs["temperature"], sub.kwargs["max_tokens"]) == (0, 5, 0.9, 300)


def test_the_sub_model_follows_the_root_unless_set(fleet_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text("[lm]\nnum_retries = 3\ntemperature = 0\nrequest_timeout_s = 40\n", encoding="utf-8")
    root, sub = build_lms(load_settings({**fleet_env, "FLEET_CONFIG": str(config)}))
    assert (sub.retries, sub.kwargs["timeout"], sub.kwargs["temperature"]) == (3, 40, 0)
    assert root.retries == 3


def test_which_errors_are_transient() -> None:
    from dspy.utils.exceptions import LMAuthError, LMProviderError, LMTransportError

    assert metered.transient(LMProviderError("x", status=429))
    assert metered.transient(LMProviderError("x", status=503))
    assert metered.transient(LMTransportError("connection reset"))
    assert not metered.transient(LMProviderError("x", status=400))
    assert not metered.transient(LMAuthError("x", status=401))
    assert not metered.transient(ValueError("x"))
    assert metered.backoff_s(1, LMProviderError("x", status=429, retry_after=3)) == 3
    assert metered.backoff_s(10) <= metered.RETRY_MAX_S
