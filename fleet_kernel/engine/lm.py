"""The turn's language models: built from settings, metered, and their failures explained.

``MeteredLM`` is a plain ``dspy.LM`` that also remembers, per thread, the usage and cost of the call
it just finished, so the engine's LM callback can report them in ``lm.finished``.
"""

from __future__ import annotations

import threading
from typing import Any

import dspy

from fleet_kernel.config import Settings
from fleet_kernel.errors import LMError

_last_call = threading.local()


def take_last_usage() -> tuple[dict[str, Any], float | None]:
    """Usage and cost of the last LM call finished on this thread (then forgotten)."""
    usage, cost = getattr(_last_call, "value", ({}, None))
    _last_call.value = ({}, None)
    return usage, cost


class MeteredLM(dspy.LM):
    """``dspy.LM`` that hands each call's usage and cost to the engine (see ``take_last_usage``)."""

    def update_history(self, entry: dict[str, Any]) -> None:
        _last_call.value = (dict(entry.get("usage") or {}), entry.get("cost"))
        super().update_history(entry)


def _make_lm(model: str, settings: Settings) -> dspy.LM:
    if model.startswith("replay/"):
        from fleet_kernel.engine.replay import replay_lm

        return replay_lm(model.removeprefix("replay/"))
    kwargs: dict[str, Any] = {"cache": False, "num_retries": 2}
    if settings.lm_base_url:
        kwargs["api_base"] = settings.lm_base_url
    if settings.lm_api_key:
        kwargs["api_key"] = settings.lm_api_key.get_secret_value()
    lm = MeteredLM(model, **kwargs)
    if settings.lm_record:
        from fleet_kernel.engine.replay import recording

        return recording(lm, settings.lm_record)
    return lm


def build_lms(settings: Settings) -> tuple[dspy.LM, dspy.LM]:
    """The root LM and the sub-LM (``llm_query`` and child RLMs; the root model unless set).

    Raises:
        LMError: no model is configured.
    """
    if not settings.lm_model:
        raise LMError(
            "no language model is configured: set FLEET_LM_MODEL (for example openai/gpt-4.1-mini, with "
            "FLEET_LM_API_KEY), point FLEET_LM_BASE_URL at an OpenAI-compatible server, or use "
            "FLEET_LM_MODEL=replay/<cassette.json> to replay a recorded session",
            code="lm_not_configured",
        )
    root = _make_lm(settings.lm_model, settings)
    sub = _make_lm(settings.sub_lm_model, settings) if settings.sub_lm_model else root.copy()
    return root, sub


def explain_lm_error(exc: BaseException, settings: Settings) -> LMError:
    """Turn a provider failure into a message that says what to set or check, with no secret in it."""
    code = getattr(exc, "code", None) or "lm_error"
    where = settings.lm_base_url or "the provider"
    model = settings.lm_model
    detail = scrub(str(exc), settings)
    if len(detail) > 500:
        detail = detail[:500] + "..."
    if code == "auth":
        message = f"{where} rejected the API key for {model}: check FLEET_LM_API_KEY (or the provider's own key variable)"
    elif code in ("transport", "timeout") or "connect" in detail.lower():
        message = (
            f"cannot reach {where} for {model}: check FLEET_LM_BASE_URL and that the server is running"
            f" ({detail})"
        )
    elif code == "rate_limit":
        message = f"{where} is rate limiting {model}: wait and retry, or lower limits.max_llm_calls ({detail})"
    elif code in ("not_configured", "configuration", "unsupported_model"):
        message = f"the model {model} cannot be used as configured: check FLEET_LM_MODEL ({detail})"
    else:
        message = f"the language model {model} failed: {detail}"
    return LMError(message, code=f"lm_{code}")


def scrub(text: str, settings: Settings) -> str:
    """Remove every configured secret from ``text``."""
    for secret in settings.secrets():
        text = text.replace(secret, "***")
    return text
