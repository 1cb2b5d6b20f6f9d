"""The settings a turn of one session runs with: the process's settings under the session's own models.

``PATCH /api/sessions/{id}`` and the kernel's ``%fleet model`` store a session's ``model`` and
``sub_model``; the runner applies them to each turn here, and ``GET /api/sessions/{id}/config`` shows the
result (never a secret: no key, token or base-URL credentials).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from fleet_kernel.config import Settings
from fleet_kernel.errors import ValidationError
from fleet_kernel.store import SessionRow

REPLAY = "replay/"


def session_settings(settings: Settings, session: SessionRow) -> Settings:
    """``settings`` with the session's root and sub-LM, where it chose them."""
    update = {}
    if session.model:
        update["lm_model"] = session.model
    if session.sub_model:
        update["sub_lm_model"] = session.sub_model
    return settings.model_copy(update=update) if update else settings


def provider_of(model: str) -> str:
    """The provider part of a model name (dspy and LiteLLM read a bare name as OpenAI's)."""
    return model.split("/", 1)[0] if "/" in model else "openai"


def allowed_patterns(settings: Settings) -> tuple[str, ...]:
    """``[lm] allowed_models``, else the providers of the configured models (``openai/*``, ...).

    With nothing configured, any model is allowed when no ``FLEET_LM_API_KEY`` is set (dspy/LiteLLM send each
    provider only its own key variable) or ``FLEET_LM_BASE_URL`` fixes where the key goes; else none is.
    """
    if settings.policy.lm.allowed_models is not None:
        return settings.policy.lm.allowed_models
    providers = sorted({provider_of(m) for m in settings.configured_models if not m.startswith(REPLAY)})
    if providers:
        return tuple(f"{p}/*" for p in providers)
    return ("*",) if settings.lm_api_key is None or settings.lm_base_url else ()


def cassette_path(model: str, settings: Settings) -> Path:
    """Where a ``replay/<file>`` model's cassette is: as given for a configured model, else under
    ``[lm] cassettes_dir`` (a relative name is taken from there).

    Raises:
        ValidationError: a session's cassette outside that folder.
    """
    name = model.removeprefix(REPLAY)
    if model in settings.configured_models:
        return Path(name).expanduser()
    folder = settings.cassettes_dir.resolve()
    path = (folder / Path(name).expanduser()).resolve()
    if not path.is_relative_to(folder) or path == folder:
        raise ValidationError(
            f"the cassette of {model} must be a file in {folder} ([lm] cassettes_dir in fleet.toml); "
            "put it there and name it relative to that folder, e.g. replay/session.json",
            code="model_not_allowed",
        )
    return path


def check_model(model: str | None, settings: Settings) -> None:
    """Refuse a model a session (or ``%fleet model``, ``--model``) may not switch to: one whose provider, and
    so the endpoint the LM key would be sent to, is not the operator's. Every front door asks here.

    Raises:
        ValidationError: the model is not allowed; the message names the fleet.toml key to change.
    """
    if not model or model in settings.configured_models:
        return
    if model.startswith(REPLAY):
        cassette_path(model, settings)
        return
    patterns = allowed_patterns(settings)
    if any(fnmatchcase(model, pattern) for pattern in patterns):
        return
    shown = ", ".join(patterns) if patterns else "none"
    where = settings.lm_base_url or f"the {provider_of(model)} provider's own endpoint"
    raise ValidationError(
        f"the model {model} is not allowed here: its requests (and the LM key) would go to {where}, which the "
        f"operator did not configure. Allowed: {shown}. To allow it, add a pattern such as "
        f'"{provider_of(model)}/*" to [lm] allowed_models in fleet.toml',
        code="model_not_allowed",
    )


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
            "max_errors": limits.max_errors,
        },
        "history": {"window_turns": policy.history.window_turns, "max_chars": policy.history.max_chars},
        "memory": {"max_chars": policy.memory.max_chars, "max_count": policy.memory.max_count},
        "skills": list(skills or []),
    }
