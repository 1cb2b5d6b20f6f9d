"""The turn's language models: built from settings (metered: ``MeteredLM``, see ``metered.py``), and their
failures explained."""

from __future__ import annotations

import os
from typing import Any, Literal

import dspy
from dspy.utils.exceptions import LMConfigurationError

from fleet_kernel.config import LMPolicy, Settings
from fleet_kernel.engine.metered import TOKEN_KEYS, MeteredLM
from fleet_kernel.engine.session_config import REPLAY, cassette_path, check_model, provider_of
from fleet_kernel.errors import LMError, ValidationError


def _make_lm(model: str, settings: Settings, role: Literal["root", "sub"]) -> dspy.LM:
    max_tokens, timeout, retries, temperature = settings.policy.lm.for_role(role)
    try:
        check_model(model, settings)  # a session's model chosen before a fleet.toml change, too
    except ValidationError as exc:
        raise LMError(exc.message, code=exc.code) from None
    if model.startswith(REPLAY):
        from fleet_kernel.engine.replay import replay_lm  # noqa: PLC0415 - loaded only for a replayed model

        trusted = model in settings.configured_models  # the operator's own file: its errors may show it
        paced = settings.policy.lm.replay_pace == "recorded"
        replayed = replay_lm(cassette_path(model, settings), trusted=trusted, paced=paced)
        return with_max_tokens(replayed, max_tokens)
    kwargs: dict[str, Any] = {
        "cache": False,
        "num_retries": 0,  # Fleet retries itself (MeteredLM.retries), so each attempt meets the turn's budget
        "max_tokens": max_tokens,
        "timeout": timeout,  # a server that accepts and never answers
    }
    if temperature is not None:
        kwargs["temperature"] = temperature
    if settings.lm_base_url:
        kwargs["api_base"] = settings.lm_base_url
    if settings.lm_api_key:
        kwargs["api_key"] = settings.lm_api_key.get_secret_value()
    try:
        lm = MeteredLM(model, **kwargs)
        lm.retries = retries
    except LMConfigurationError as exc:  # e.g. OpenAI reasoning models need a cap of at least 16000
        raise LMError(
            f"the model {model} cannot be used with [lm] max_tokens = {max_tokens} (or sub_max_tokens) in "
            f"fleet.toml: {scrub(str(exc), settings)}",
            code="lm_configuration",
        ) from exc
    if settings.lm_record:
        from fleet_kernel.engine.replay import recording  # noqa: PLC0415 - loaded only while recording

        recorder = recording(lm, settings.lm_record)
        if temperature is not None:  # the cassette's LM builds the requests: it asks for the temperature too
            recorder = recorder.copy(temperature=temperature)
        return with_max_tokens(recorder, max_tokens)
    return lm


def with_max_tokens(lm: dspy.LM, max_tokens: int) -> dspy.LM:
    """A copy of ``lm`` asking for at most ``max_tokens`` per reply, under the key it already uses."""
    key = next((k for k in TOKEN_KEYS if k in lm.kwargs), "max_tokens")
    return lm if lm.kwargs.get(key) == max_tokens else lm.copy(**{key: max_tokens})


def for_sub(root: dspy.LM, caps: LMPolicy) -> dspy.LM:
    """A copy of the root LM with the sub model's cap, timeout, retries and temperature."""
    max_tokens, timeout, retries, temperature = caps.for_role("sub")
    sub = with_max_tokens(root.copy(), max_tokens)
    if sub is root:
        sub = root.copy()
    if isinstance(sub, MeteredLM):
        sub.retries = retries
    if "timeout" in sub.kwargs:  # an HTTP model; a cassette's engine owns its connection settings
        sub.kwargs["timeout"] = timeout
        if temperature is not None:
            sub.kwargs["temperature"] = temperature
        else:
            sub.kwargs.pop("temperature", None)
    return sub


def build_lms(settings: Settings) -> tuple[dspy.LM, dspy.LM]:
    """The root LM and the sub-LM (``llm_query`` and child RLMs; the root model unless set).

    Raises:
        LMError: no model is configured, or a session's model is not allowed.
    """
    if not settings.lm_model:
        raise LMError(not_configured_message(settings), code="lm_not_configured")
    caps = settings.policy.lm
    root = _make_lm(settings.lm_model, settings, "root")
    sub = _make_lm(settings.sub_lm_model, settings, "sub") if settings.sub_lm_model else for_sub(root, caps)
    for lm in (root, sub):
        if isinstance(lm, MeteredLM):
            lm.stream_replies = caps.stream
    return root, sub


def not_configured_message(settings: Settings) -> str:
    """Why no model is configured, with what was seen: FLEET_LM_BASE_URL alone does not name a model."""
    seen = f"FLEET_LM_BASE_URL is {settings.lm_base_url}, but " if settings.lm_base_url else ""
    return (
        f"no language model is configured: {seen}FLEET_LM_MODEL is not set. Set FLEET_LM_MODEL to provider/model "
        "(for example openai/gpt-4.1-mini, with its key in FLEET_LM_API_KEY; for an OpenAI-compatible server at "
        "FLEET_LM_BASE_URL, openai/<the server's model name>), or FLEET_LM_MODEL=replay/<cassette.json> to replay "
        "a recorded session"
    )


def _key_seen(settings: Settings, provider: str) -> str:
    """Which key variable is set, never its value."""
    variable = f"{provider.upper().replace('-', '_')}_API_KEY"
    if settings.lm_api_key is not None:
        return "FLEET_LM_API_KEY is set"
    if os.environ.get(variable):
        return f"{variable} is set"
    return f"neither FLEET_LM_API_KEY nor {variable} is set"


def explain_lm_error(exc: BaseException, settings: Settings) -> LMError:
    """Turn a provider failure into Fleet's words: what to set or check, with the value seen (never a key).

    dspy's and LiteLLM's own advice (``api_key=`` on ``dspy.LM``, Huggingface endpoints) is for their
    callers; a Fleet user sets environment variables and fleet.toml keys.
    """
    code = getattr(exc, "code", None) or "lm_error"
    model = settings.lm_model or "(none)"
    provider = provider_of(model)
    where = settings.lm_base_url or f"the {provider} provider"
    detail = scrub(str(exc), settings)
    lowered = detail.lower()
    if len(detail) > 500:
        detail = detail[:500] + "..."
    if code == "not_configured" and "api key" in lowered:
        message = (
            f"no API key for {model} ({_key_seen(settings, provider)}): set FLEET_LM_API_KEY, or "
            f"{provider.upper().replace('-', '_')}_API_KEY, in the environment Fleet runs in"
        )
    elif "provider not provided" in lowered or code == "unsupported_model":
        message = (
            f"FLEET_LM_MODEL (or the session's model) is {model}, whose provider {provider!r} is not one Fleet's LM "
            "library knows: write it as provider/model, such as openai/gpt-4.1-mini or anthropic/claude-sonnet-4-5"
        )
    elif code == "auth":
        message = (
            f"{where} rejected the API key for {model} ({_key_seen(settings, provider)}): check FLEET_LM_API_KEY "
            "(or the provider's own key variable)"
        )
    elif "timed out" in lowered or code == "timeout":
        timeout = settings.policy.lm.request_timeout_s
        check = "that the server at FLEET_LM_BASE_URL is running" if settings.lm_base_url else "the network"
        message = (
            f"{where} did not answer {model} within {timeout:g} s: check {check}, or raise "
            "[lm] request_timeout_s in fleet.toml for a model that needs longer"
        )
    elif code == "transport" or "connect" in lowered:
        message = f"cannot reach {where} for {model}: check FLEET_LM_BASE_URL and that the server is running ({detail})"
    elif code == "rate_limit":
        message = f"{where} is rate limiting {model}: wait and retry, or lower limits.max_llm_calls ({detail})"
    elif code in ("not_configured", "configuration"):
        message = f"the model {model} cannot be used as configured: check FLEET_LM_MODEL ({detail})"
    else:
        message = f"the language model {model} failed: {detail}"
    return LMError(message, code=f"lm_{code}")


def scrub(text: str, settings: Settings) -> str:
    """Remove every secret in force (Fleet's and the provider key variables') from ``text``."""
    return settings.redactor.text(text)
