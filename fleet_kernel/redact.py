"""Secrets taken out of text before anyone sees it: events, traces, logs, error messages.

A ``Redactor`` replaces every secret it knows (the LM key, provider keys, the API token...) with
``***``; ``Settings.redactor`` is the one for the secrets in force. One compiled pattern does all of them
in a single pass, longest first, so a key that contains another is still removed whole.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping
from typing import Any

MASK = "***"
# The variables keys are read from: Fleet's own (FLEET_LM_API_KEY, FLEET_API_TOKEN, ...) and those dspy/LiteLLM
# and the providers' SDKs read themselves (OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY, AZURE_API_KEY,
# AWS_SECRET_ACCESS_KEY, HF_TOKEN, ...).
SECRET_VAR = re.compile(r"[A-Z][A-Z0-9_]*(API_KEY|APIKEY|_TOKEN|_SECRET|SECRET_KEY|SECRET_ACCESS_KEY)")
MIN_SECRET_CHARS = 8  # shorter values ("1", "true") are not keys, and scrubbing them would mangle text


def env_secrets(env: Mapping[str, str]) -> tuple[str, ...]:
    """The values of the key variables in ``env``."""
    return tuple(
        value.strip()
        for name, value in env.items()
        if SECRET_VAR.fullmatch(name) and len(value.strip()) >= MIN_SECRET_CHARS
    )


class Redactor:
    """Removes a fixed set of secrets from strings and from JSON-like values."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        ordered = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._secrets = tuple(ordered)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    @classmethod
    @functools.lru_cache(maxsize=16)
    def of(cls, secrets: tuple[str, ...]) -> Redactor:
        """The redactor of ``secrets`` (built once per set: settings are copied for every turn)."""
        return cls(secrets)

    def text(self, text: str) -> str:
        return text if self._pattern is None else self._pattern.sub(MASK, text)

    def unsafe_tail(self, text: str) -> int:
        """How many characters at the end of ``text`` could be the start of a secret: text shown in pieces
        (streamed tokens) keeps them back until the next piece says whether the secret follows."""
        longest = 0
        for secret in self._secrets:
            for size in range(min(len(secret) - 1, len(text)), longest, -1):
                if text.endswith(secret[:size]):
                    longest = size
                    break
        return longest

    def data(self, value: Any) -> Any:
        """Every string in a JSON-like value (dict keys too) without the secrets."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.data(k): self.data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.data(v) for v in value]
        return value


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RedactingFormatter(logging.Formatter):
    """A log formatter that writes no secret: message, arguments and traceback are scrubbed together."""

    def __init__(self, fmt: str, redactor: Redactor) -> None:
        super().__init__(fmt)
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        return self.redactor.text(super().format(record))
