"""The turn's language models: built from settings, metered, and their failures explained.

``MeteredLM`` is a plain ``dspy.LM`` that also remembers, per thread, the usage and cost of the call
it just finished, so the engine's LM callback can report them in ``lm.finished``. Within a turn it
asks the turn's ``TurnBudget`` before each call, reports each call's usage to it, never asks for
more than its ``max_tokens`` cap, and can close its requests in flight when the turn stops.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import dspy
from dspy.utils.callback import BaseCallback
from dspy.utils.exceptions import LMConfigurationError

from fleet_kernel.config import Settings
from fleet_kernel.engine.session_config import REPLAY, cassette_path, check_model, provider_of
from fleet_kernel.errors import LMError, ValidationError

if TYPE_CHECKING:
    from fleet_kernel.engine.budget import TurnBudget

_TOKEN_KEYS = ("max_tokens", "max_completion_tokens")

_last_call = threading.local()
_call_ids = itertools.count(1)


def reported(
    call: Callable[[], Any],
    call_id: str,
    on_start: Callable[..., None],
    on_end: Callable[..., None],
    instance: Any,
    inputs: dict[str, Any],
) -> Any:
    """``call()`` between a callback's start and end handlers, as dspy's callback wrapper runs them, for
    Fleet's own LMs and predictors that tell their ``watcher`` without it."""
    on_start(call_id, instance, inputs)
    try:
        result = call()
    except BaseException as exc:
        on_end(call_id, None, exc)
        raise
    on_end(call_id, result, None)
    return result


class LastCall(NamedTuple):
    """What the engine reports of an LM call in ``lm.finished``."""

    usage: dict[str, Any]
    cost: float | None
    finish_reason: str | None


NO_CALL = LastCall({}, None, None)


def take_last_call() -> LastCall:
    """Usage, cost and finish reason of the last LM call finished on this thread (then forgotten)."""
    last: LastCall = getattr(_last_call, "value", NO_CALL)
    _last_call.value = NO_CALL
    return last


def finish_reason(response: Any) -> str | None:
    """Why a reply ended: dspy's native ``Response`` (or a tuple of them) or a chat completion's first choice."""
    from dspy.clients.legacy_outputs import value  # reads objects and dicts alike

    if isinstance(response, list | tuple):
        response = response[0] if response else None
    reason = value(response, "finish_reason", None)
    if reason is None:
        choices = value(response, "choices", None) or []
        reason = value(choices[0], "finish_reason", None) if choices else None
    reason = getattr(reason, "value", reason)  # an enum
    return str(reason) if reason else None


class MeteredLM(dspy.LM):
    """``dspy.LM`` that hands each call's usage and cost to the engine (see ``take_last_usage``).

    ``budget`` (set for a turn by ``TurnBudget.watch``) gates every call; copies share it.
    """

    budget: TurnBudget | None = None
    watcher: BaseCallback | None = None  # told of each call as a dspy callback would be, without dspy's wrapper

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for key in _TOKEN_KEYS:  # model code may pass its own cap per call; never above ours
            cap = self.kwargs.get(key)
            if cap and kwargs.get(key) is not None:
                kwargs[key] = min(int(kwargs[key]), int(cap))
        budget = self.budget
        if budget is None:
            return self._watched(args, kwargs)
        budget.check()
        try:
            result = self._watched(args, kwargs)
        except Exception:
            budget.check()  # a call cut short because the turn stopped ends the turn, not just this call
            raise
        budget.check()  # this call crossed a budget: the turn ends now, not at its next call
        return result

    def _watched(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = functools.partial(super().__call__, *args, **kwargs)
        watcher = self.watcher
        if watcher is None:
            return call()
        return reported(call, f"lm-{next(_call_ids)}", watcher.on_lm_start, watcher.on_lm_end, self, kwargs)

    def update_history(self, entry: dict[str, Any]) -> None:
        """Meter the call, and keep it in this LM's own history only.

        dspy also appends every call to a process-wide list (10 000 entries, each a whole prompt and
        reply) and to each calling module's history: in a server or kernel that runs turn after turn,
        that kept the prompts of up to 10 000 past calls alive. A turn's LMs are dropped with the turn.
        """
        usage, cost = dict(entry.get("usage") or {}), entry.get("cost")
        _last_call.value = LastCall(usage, cost, finish_reason(entry.get("response")))
        if self.budget is not None:
            self.budget.add(usage, cost)
        if dspy.settings.disable_history:
            return
        if len(self.history) >= max(1, dspy.settings.max_history_size):
            self.history.pop(0)
        self.history.append(entry)

    def abort(self) -> None:
        """Close this LM's requests in flight, so the model server sees the client leave, and its pools.

        dspy's native engine (lm15) waits for a reply in ``recv`` on a pooled socket; closing that socket
        from another thread would not wake it until the reply came, shutting it down ends the read (and the
        request) at once. The engine is closed too, so a retry cannot open a new connection.
        """
        with self._engine_lock:
            engines = list(self._engine_store.values())
        for engine in engines:
            pool = getattr(getattr(getattr(engine, "router", None), "_transport", None), "_pool", None)
            if pool is None:
                continue
            with pool._lock:
                connections = list(pool._in_use)
            for connection in connections:
                with contextlib.suppress(OSError):
                    connection.sock.shutdown(socket.SHUT_RDWR)
        self.close()
        inner = getattr(self.engine, "inner", None)  # while recording: the live LM behind the cassette
        if isinstance(inner, MeteredLM):
            inner.abort()


def _make_lm(model: str, settings: Settings, max_tokens: int) -> dspy.LM:
    try:
        check_model(model, settings)  # a session's model chosen before a fleet.toml change, too
    except ValidationError as exc:
        raise LMError(exc.message, code=exc.code) from None
    if model.startswith(REPLAY):
        from fleet_kernel.engine.replay import replay_lm  # replay imports this module (MeteredLM)

        trusted = model in settings.configured_models  # the operator's own file: its errors may show it
        return with_max_tokens(replay_lm(cassette_path(model, settings), trusted=trusted), max_tokens)
    kwargs: dict[str, Any] = {
        "cache": False,
        "num_retries": 2,
        "max_tokens": max_tokens,
        "timeout": settings.policy.lm.request_timeout_s,  # a server that accepts and never answers
    }
    if settings.lm_base_url:
        kwargs["api_base"] = settings.lm_base_url
    if settings.lm_api_key:
        kwargs["api_key"] = settings.lm_api_key.get_secret_value()
    try:
        lm = MeteredLM(model, **kwargs)
    except LMConfigurationError as exc:  # e.g. OpenAI reasoning models need a cap of at least 16000
        raise LMError(
            f"the model {model} cannot be used with [lm] max_tokens = {max_tokens} (or sub_max_tokens) in "
            f"fleet.toml: {scrub(str(exc), settings)}",
            code="lm_configuration",
        ) from exc
    if settings.lm_record:
        from fleet_kernel.engine.replay import recording  # replay imports this module (MeteredLM)

        return with_max_tokens(recording(lm, settings.lm_record), max_tokens)
    return lm


def with_max_tokens(lm: dspy.LM, max_tokens: int) -> dspy.LM:
    """A copy of ``lm`` asking for at most ``max_tokens`` per reply, under the key it already uses."""
    key = next((k for k in _TOKEN_KEYS if k in lm.kwargs), "max_tokens")
    return lm if lm.kwargs.get(key) == max_tokens else lm.copy(**{key: max_tokens})


def build_lms(settings: Settings) -> tuple[dspy.LM, dspy.LM]:
    """The root LM and the sub-LM (``llm_query`` and child RLMs; the root model unless set).

    Raises:
        LMError: no model is configured, or a session's model is not allowed.
    """
    if not settings.lm_model:
        raise LMError(not_configured_message(settings), code="lm_not_configured")
    caps = settings.policy.lm
    root = _make_lm(settings.lm_model, settings, caps.max_tokens)
    if settings.sub_lm_model:
        sub = _make_lm(settings.sub_lm_model, settings, caps.sub_cap)
    else:
        sub = with_max_tokens(root.copy(), caps.sub_cap)
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
