"""Text from sandboxed code or the model, made safe to show in a terminal.

Sandbox output, the model's reasoning and answer, tool previews and error messages reach ``jupyter
console``, every ``text/plain`` output and exported transcripts. A terminal obeys the control
sequences in them: OSC 52 (``ESC ] 52 ; c ; <base64> BEL``) writes the user's clipboard, OSC 0 sets
the window title, CSI sequences move the cursor and rewrite what is already on the screen.
``terminal_safe`` shows every control character as a visible escape (``\\x1b``), so the sequence is
readable and inert; tab, newline and carriage return stay (output is lines, progress bars use
``\\r``). Lone surrogates, which code can send through JSON but no UTF-8 channel can carry, become
U+FFFD.
"""

from __future__ import annotations

import re
from typing import Any

_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")  # C0 but \t \n \r, DEL, C1, surrogates


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return "\ufffd" if code >= 0xD800 else f"\\x{code:02x}"


def terminal_safe(text: str) -> str:
    """``text`` with control characters (but tab, newline, carriage return) shown as ``\\xNN``."""
    return text if _UNSAFE.search(text) is None else _UNSAFE.sub(_visible, text)


def terminal_safe_data(value: Any) -> Any:
    """Every string in a JSON-like value (dict keys too) made ``terminal_safe``."""
    if isinstance(value, str):
        return terminal_safe(value)
    if isinstance(value, dict):
        return {terminal_safe(k) if isinstance(k, str) else k: terminal_safe_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [terminal_safe_data(v) for v in value]
    return value
