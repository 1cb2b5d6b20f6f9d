"""What a turn's LM calls have used against its budgets, and the gate each of those calls passes.

Every LM call of a turn (root steps, ``llm_query``, child RLMs) asks ``TurnBudget.check`` before it
starts and reports its usage after. A used-up budget cancels the turn's ``CancelToken``; once the
token is cancelled (by that, a cancellation, the deadline, or simply the turn's end) no call starts
any more, and the calls still in flight are closed, so a model server stops working, and billing,
for a turn that is over.
"""

from __future__ import annotations

import threading
from typing import Any

from fleet_kernel.cancel import CancelToken
from fleet_kernel.config import Limits
from fleet_kernel.errors import TurnCancelled


class BudgetExceeded(TurnCancelled):
    """The turn used up its token or cost budget: it ends with ``turn.failed`` (``budget_exceeded``).

    A ``TurnCancelled``, so it stops the turn wherever it is raised: dspy swallows ``Exception``
    in places, and model-written code may catch it.
    """

    code = "budget_exceeded"


class TurnBudget:
    """One turn's token and cost totals against ``limits.max_turn_tokens`` and ``max_turn_cost_usd``.

    Thread-safe: calls come from the turn thread, sandbox tool threads and dspy's batch threads.
    """

    def __init__(
        self, *, max_tokens: int | None = None, max_cost_usd: float | None = None, cancel: CancelToken | None = None
    ) -> None:
        self.max_tokens = max_tokens
        self.max_cost_usd = max_cost_usd
        self.tokens = 0
        self.cost_usd = 0.0
        self.retries = 0  # LM requests sent again after a transient provider error
        self.cancel = cancel if cancel is not None else CancelToken()
        self._lock = threading.Lock()
        self._lms: list[Any] = []
        self.cancel.on_cancel(self.close)

    @classmethod
    def for_limits(cls, limits: Limits, cancel: CancelToken | None = None) -> TurnBudget:
        return cls(max_tokens=limits.max_turn_tokens, max_cost_usd=limits.max_turn_cost_usd, cancel=cancel)

    def watch(self, *lms: Any) -> None:
        """Gate and meter these LMs' calls (``MeteredLM`` and copies); others are left alone."""
        for lm in lms:
            if hasattr(lm, "abort") and hasattr(lm, "budget"):
                lm.budget = self
                self._lms.append(lm)

    def add(self, usage: dict[str, Any], cost: float | None) -> None:
        """Count one finished call (``usage`` as dspy reports it)."""
        prompt = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
        completion = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
        with self._lock:
            self.tokens += prompt + completion
            self.cost_usd += float(cost or 0.0)

    def note_retry(self) -> None:
        """Count one LM request sent again (``[lm] num_retries``); its tokens are counted by ``add``."""
        with self._lock:
            self.retries += 1

    def exceeded(self) -> str | None:
        """Which budget is used up, and by how much, or ``None``."""
        with self._lock:
            tokens, cost = self.tokens, self.cost_usd
        if self.max_tokens is not None and tokens >= self.max_tokens:
            budget = f"{self.max_tokens:,}-token budget (limits.max_turn_tokens)"
            return f"the turn used {tokens:,} LM tokens of its {budget}"
        if self.max_cost_usd is not None and cost >= self.max_cost_usd:
            budget = f"${self.max_cost_usd:.4f} budget (limits.max_turn_cost_usd)"
            return f"the turn's LM calls cost ${cost:.4f} of its {budget}"
        return None

    def check(self) -> None:
        """Raise why no LM call may start now: the turn stopped, or a budget is used up (which stops it).

        Raises:
            BudgetExceeded: a budget is used up (now or before).
            TurnCancelled: the turn was stopped for another reason (cancel, deadline, end).
        """
        self.cancel.raise_if_cancelled()
        message = self.exceeded()
        if message is not None:
            self.cancel.cancel(f"{message}: the turn was stopped", BudgetExceeded)  # unless stopped just before
            self.cancel.raise_if_cancelled()

    def check_call(self, tokens: int) -> None:
        """Raise to stop a call in flight (a streamed one, between its tokens): the turn stopped, or the
        ``tokens`` the call has used so far (estimated) would use up the token budget, which stops it.

        Raises:
            BudgetExceeded: the token budget would be used up (now or before).
            TurnCancelled: the turn was stopped for another reason.
        """
        self.cancel.raise_if_cancelled()
        if self.max_tokens is None:
            return
        with self._lock:
            used = self.tokens + tokens
        if used >= self.max_tokens:
            budget = f"{self.max_tokens:,}-token budget (limits.max_turn_tokens)"
            message = f"the turn used {used:,} LM tokens of its {budget}, a call's reply cut short"
            self.cancel.cancel(f"{message}: the turn was stopped", BudgetExceeded)
            self.cancel.raise_if_cancelled()

    def close(self) -> None:
        """Close the watched LMs' requests in flight (the token calls this when it is cancelled)."""
        with self._lock:
            lms = list(self._lms)
        for lm in lms:
            lm.abort()

    def used(self) -> dict[str, Any]:
        """Totals and budgets, for the turn's usage record."""
        with self._lock:
            return {
                "tokens": self.tokens,
                "max_turn_tokens": self.max_tokens,
                "cost_usd": round(self.cost_usd, 6),
                "max_turn_cost_usd": self.max_cost_usd,
                "lm_retries": self.retries,
            }
