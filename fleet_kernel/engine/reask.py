"""``ReaskingChatAdapter``: a reply that cannot be parsed is asked again once, with what was wrong with it.

dspy's ``ChatAdapter`` answers a parse failure by asking the same question again through its ``JSONAdapter``
fallback: a second prompt in another format that does not say what went wrong. A small model then tends to
fail the same way. This adapter keeps the ``[[ ## field ## ]]`` format the system prompt already explains and
asks once more in the same conversation: the failed reply as the model's turn, then the parse error and the
expected fields. A second failure raises the parse error, which the turn reports with what the model said.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import dspy
from dspy.clients.call_context import adapter_fallback_scope
from dspy.utils.exceptions import AdapterParseError

FAILED_REPLY_CHARS = 4000
"""How much of the failed reply goes back to the model: enough to see its mistake, no more prompt than that."""

_correction: ContextVar[tuple[str, str] | None] = ContextVar("fleet_reask_correction", default=None)


def why_unparsed(exc: AdapterParseError) -> str:
    """What was wrong with a reply, in the words the model is given: the fields it lacked, and dspy's own
    reason when it gave one (a value of the wrong type, say)."""
    expected = list(exc.signature.output_fields)
    parsed = exc.parsed_result if isinstance(exc.parsed_result, dict) else {}
    missing = [name for name in expected if name not in parsed]
    reasons = []
    if missing:
        reasons.append("it lacks the field" + "s" * (len(missing) > 1) + " " + ", ".join(f"`{m}`" for m in missing))
    detail = str(exc).split(f"Adapter {exc.adapter_name} failed", 1)[0].strip()
    if detail:
        reasons.append(detail[:500])
    return "; ".join(reasons) or "its fields could not be read"


class ReaskingChatAdapter(dspy.ChatAdapter):
    """``ChatAdapter`` that asks once more, in the same format, when a reply cannot be parsed."""

    def __init__(self) -> None:
        super().__init__(use_json_adapter_fallback=False)

    def __call__(
        self,
        lm: Any,
        lm_kwargs: dict[str, Any],
        signature: Any,
        demos: list[dict[str, Any]],
        inputs: dict[str, Any],
    ) -> list[dict[str, Any]]:
        with adapter_fallback_scope() as progress:
            try:
                replies: list[dict[str, Any]] = super().__call__(lm, lm_kwargs, signature, demos, inputs)
                return replies
            except AdapterParseError as exc:
                # a reply already streamed to the user is not asked again; nor is the question that re-asks
                if progress.emitted or _correction.get() is not None:
                    raise
                failed = str(exc.lm_response or "")
                if len(failed) > FAILED_REPLY_CHARS:
                    failed = failed[:FAILED_REPLY_CHARS] + "\n... (cut)"
                token = _correction.set((failed, why_unparsed(exc)))
                try:
                    replies = super().__call__(lm, lm_kwargs, signature, demos, inputs)
                    return replies
                finally:
                    _correction.reset(token)

    def format(self, signature: Any, demos: list[dict[str, Any]], inputs: dict[str, Any]) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = super().format(signature, demos, inputs)
        correction = _correction.get()
        if correction is None:
            return messages
        failed, why = correction
        ask = (
            f"Your reply above could not be parsed: {why}. Reply again with the whole answer in the expected "
            f"format. {self.user_message_output_requirements(signature)}"
        )
        return [*messages, {"role": "assistant", "content": failed}, {"role": "user", "content": ask}]
