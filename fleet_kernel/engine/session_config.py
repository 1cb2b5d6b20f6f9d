"""The settings a turn of one session runs with: the process's settings under the session's own models.

``PATCH /api/sessions/{id}`` and the kernel's ``%fleet model`` store a session's ``model`` and
``sub_model``; the runner applies them to each turn here, and ``GET /api/sessions/{id}/config`` shows the
result (never a secret: no key, token or base-URL credentials).
"""

from __future__ import annotations

from typing import Any

from fleet_kernel.config import Settings
from fleet_kernel.store import SessionRow


def session_settings(settings: Settings, session: SessionRow) -> Settings:
    """``settings`` with the session's root and sub-LM, where it chose them."""
    update = {}
    if session.model:
        update["lm_model"] = session.model
    if session.sub_model:
        update["sub_lm_model"] = session.sub_model
    return settings.model_copy(update=update) if update else settings


def effective_config(
    settings: Settings, session: SessionRow, sandbox: str, skills: list[str] | None = None
) -> dict[str, Any]:
    """What a turn of ``session`` would use now, as the API shows it."""
    mine = session_settings(settings, session)
    policy = mine.policy
    limits = policy.limits
    return {
        "session_id": session.session_id,
        "model": mine.lm_model,
        "sub_model": mine.sub_lm_model or mine.lm_model,
        "model_source": "session" if session.model else "settings",
        "sub_model_source": "session" if session.sub_model else ("settings" if mine.sub_lm_model else "model"),
        "sandbox": sandbox,
        "limits": {
            "max_iters": limits.max_iters,
            "max_llm_calls": limits.max_llm_calls,
            "timeout_s": limits.turn_timeout_s,
            "exec_timeout_s": limits.exec_timeout_s,
            "max_turn_tokens": limits.max_turn_tokens,
            "max_turn_cost_usd": limits.max_turn_cost_usd,
            "max_tokens": policy.lm.max_tokens,
            "sub_max_tokens": policy.lm.sub_cap,
        },
        "history": {"window_turns": policy.history.window_turns, "max_chars": policy.history.max_chars},
        "memory": {"max_chars": policy.memory.max_chars, "max_count": policy.memory.max_count},
        "skills": list(skills or []),
    }
