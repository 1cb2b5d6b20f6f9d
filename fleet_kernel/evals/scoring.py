"""Scorers: an answer and its task's rule give a score from 0 to 1 and a short reason.

``exact``, ``numeric``, ``contains`` and ``json_schema`` are pure functions of the answer; ``judge`` asks a
model (``--judge``, else the configured one) to grade the answer against the task's rubric.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleet_kernel.config import Settings
from fleet_kernel.evals.dataset import EvalTask

_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Score:
    value: float  # 0..1
    reason: str

    @property
    def passed(self) -> bool:
        return self.value >= 1.0


Judge = Callable[[EvalTask, str], Score]


def _norm(text: str) -> str:
    return " ".join(str(text).split()).strip().casefold()


def score_answer(task: EvalTask, answer: str | None, result: Any = None, judge: Judge | None = None) -> Score:
    """The score of ``answer`` (``result``: the turn's structured value, used by ``json_schema``)."""
    if answer is None and result is None:
        return Score(0.0, "no answer")
    text = answer or ""
    if task.scorer == "exact":
        ok = _norm(text) == _norm(str(task.expected))
        return Score(float(ok), "matches" if ok else f"expected {task.expected!r}")
    if task.scorer == "contains":
        ok = _norm(str(task.expected)) in _norm(text)
        return Score(float(ok), "contains it" if ok else f"does not contain {task.expected!r}")
    if task.scorer == "numeric":
        return _numeric(task, text)
    if task.scorer == "json_schema":
        return _schema(task, text, result)
    if judge is None:
        return Score(0.0, "no judge model to grade this answer")
    return judge(task, text)


def _numeric(task: EvalTask, text: str) -> Score:
    """The last number in the answer, within ``tolerance`` of the expected one."""
    numbers = _NUMBER.findall(text)
    if not numbers:
        return Score(0.0, "the answer has no number")
    got = float(numbers[-1].replace(",", ""))
    want = float(task.expected)
    ok = abs(got - want) <= task.tolerance
    return Score(
        float(ok), f"{got:g} is within {task.tolerance:g} of {want:g}" if ok else f"{got:g}, expected {want:g}"
    )


def _schema(task: EvalTask, text: str, result: Any) -> Score:
    import jsonschema  # noqa: PLC0415 - only schema-scored tasks need it

    value = result
    if value is None:
        fenced = _FENCE.search(text)
        try:
            value = json.loads(fenced.group(1) if fenced else text)
        except json.JSONDecodeError:
            return Score(0.0, "the answer is not JSON")
    try:
        jsonschema.validate(value, task.schema or {})
    except jsonschema.ValidationError as exc:
        return Score(0.0, f"does not match the schema: {exc.message}"[:300])
    return Score(1.0, "matches the schema")


def model_judge(settings: Settings, model: str | None = None) -> Judge:
    """A judge that asks ``model`` (else the configured root model) to grade answers on their rubric."""
    import dspy  # noqa: PLC0415 - dspy only for a judge

    from fleet_kernel.engine.lm import build_lms  # noqa: PLC0415 - dspy only for a judge

    class Grade(dspy.Signature):
        """Grade the answer to the task against the rubric. The score is 1 when the answer fully meets
        the rubric, 0 when it does not, and a fraction for partial credit."""

        task: str = dspy.InputField()
        rubric: str = dspy.InputField()
        answer: str = dspy.InputField()
        score: float = dspy.OutputField(desc="from 0 to 1")
        reason: str = dspy.OutputField(desc="one sentence")

    judged = settings.model_copy(update={"lm_model": model or settings.lm_model, "sub_lm_model": None})
    lm, _ = build_lms(judged)
    grade = dspy.Predict(Grade)

    def judge(task: EvalTask, answer: str) -> Score:
        with dspy.context(lm=lm):
            out = grade(task=task.task, rubric=task.rubric or "", answer=answer)
        value = min(1.0, max(0.0, float(out.score)))
        return Score(value, f"judge: {out.reason}"[:300])

    return judge
