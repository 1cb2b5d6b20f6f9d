"""How a turn ended, as the runner records it; free of dspy, so a turn stopped before dspy loads ends at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleet_kernel.errors import TurnCancelled


@dataclass
class Outcome:
    status: str  # completed | failed | cancelled
    answer: str | None = None
    error: dict[str, str] | None = None
    reason: str | None = None
    result: Any = None  # the validated ``result`` output, when the turn had an output schema
    extracted: bool = False
    extraction_reason: str | None = None  # max_iters | deadline | budget, when ``extracted``
    usage: dict[str, Any] = field(default_factory=dict)


def stopped(cause: TurnCancelled, usage: dict[str, Any] | None = None) -> Outcome:
    """The outcome of a turn stopped by ``cause``: one with a ``code`` (``BudgetExceeded``,
    ``TurnDeadlineExceeded``) fails it with that error type, any other cancels it."""
    code = getattr(cause, "code", None)
    if code is not None:
        return Outcome("failed", error={"type": code, "message": cause.reason}, usage=usage or {})
    return Outcome("cancelled", reason=cause.reason, usage=usage or {})
