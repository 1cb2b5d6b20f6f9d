"""Markdown that JupyterLab, nbconvert and GitHub show as written: the one escaping every Markdown output uses.

Two things in text read as something else there. Two ``$`` make the text between them a TeX formula ("costs $5
and ... $10" shows as "5and...10"), and ``<`` opens an HTML element (``<title>`` swallows the rest of a table).
So outside code ``$`` is written ``\\$`` and ``<`` as ``&lt;`` (``md_escape``). The Markdown parser turns ``\\$``
back into ``$``, which MathJax (JupyterLab's, nbconvert's) would then typeset in the rendered page, so an output
with one is also wrapped in ``md_block``: a ``<div>`` whose classes both MathJax versions skip. Code spans and
fenced blocks are left as written: code is literal already, and an escape there would show.
"""

from __future__ import annotations

import html
import re

NO_MATH = "tex2jax_ignore mathjax_ignore"
"""Classes that MathJax 2 (nbconvert's HTML) and MathJax 3 (JupyterLab) do not typeset."""

_CODE = (
    # a fenced block (to the end of the text if it is never closed), or a code span
    r"(?P<code>^ {0,3}(?P<fence>`{3,}|~{3,})[^\n]*\n.*?(?:^ {0,3}(?P=fence)[`~]*[ \t]*$|\Z)"
    r"|(?<![`\\])(?P<ticks>`+)(?!`).+?(?<!`)(?P=ticks)(?!`))"
)
_PROSE = re.compile(_CODE + r"|\\?\$|<", re.MULTILINE | re.DOTALL)
_LITERAL = re.compile(r"[\\`*_\[\]~$<>&|]")
_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;", "|": "&#124;"}


def md_escape(text: str, *, literal: bool = False) -> str:
    """``text`` for a Markdown output: ``$`` as ``\\$`` and ``<`` as ``&lt;`` outside code.

    Without ``literal`` the text is Markdown (a model's answer or reasoning, a skill card): its emphasis, lists,
    tables and code render, and a ``\\$`` already written stays one. With ``literal`` (a title, a table cell, a
    status line) nothing in it is Markdown: emphasis and link characters are escaped too, and ``|`` is ``&#124;``,
    which ends no table cell (``\\|`` does not work inside code in every renderer).
    """
    if literal:
        return _LITERAL.sub(lambda m: _ENTITIES.get(m[0], "\\" + m[0]), text)
    return _PROSE.sub(lambda m: m[0] if m["code"] else "&lt;" if m[0] == "<" else "\\$", text)


def md_code(text: str) -> str:
    """Inline code that is safe in a table cell: ``<code>`` with entities, so a ``|`` in it ends no cell."""
    return "<code>" + html.escape(text, quote=False).replace("|", "&#124;").replace("$", "&#36;") + "</code>"


def md_block(markdown: str) -> str:
    """A whole Markdown output (or cell) with an escaped ``$`` in a block MathJax skips, so it stays a dollar once
    rendered (a ``$`` in code needs nothing: MathJax skips code, JupyterLab's parser too)."""
    markdown = markdown.strip("\n") + "\n"
    return f'<div class="{NO_MATH}">\n\n{markdown}\n</div>\n' if "\\$" in markdown else markdown
