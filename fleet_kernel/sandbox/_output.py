"""One execution's output: passed on to the sandbox observer as it arrives, and capped.

The runtime caps what code prints (``--max-output-bytes``); code writing to the protocol channel itself
may send more, so the host caps it again, with room for the runtime's own truncation notice.
"""

from __future__ import annotations

import logging
from typing import Any

from fleet_kernel.sandbox.base import SandboxObserver

logger = logging.getLogger(__name__)

OUTPUT_SLACK = 1024  # room past the output cap for the runtime's own truncation notice


class Output:
    """The output of one execution so far, and the observer it is shown to (if any) as it comes."""

    def __init__(self, observer: SandboxObserver | None, cap: int | None) -> None:
        self._observer, self._cap = observer, cap  # cap: characters passed on, like the runtime's
        self._chunks: list[str] = []
        self._shown = 0  # characters passed on so far

    def text(self) -> str:
        return "".join(self._chunks)

    def show(self, stream: Any, text: Any) -> None:
        """Pass one chunk of output on (both written by the sandbox: checked), within the cap."""
        text, cap = str(text or ""), self._cap
        if cap is not None:
            if self._shown > cap + OUTPUT_SLACK:
                return
            if self._shown + len(text) > cap + OUTPUT_SLACK:
                text = f"{text[: cap + OUTPUT_SLACK - self._shown]}\n[output truncated: more than {cap} characters]\n"
            self._shown += len(text)
        self._chunks.append(text)
        if self._observer is not None:
            try:
                self._observer.on_output(str(stream or "stdout"), text)
            except Exception:
                logger.exception("sandbox observer failed in on_output")
