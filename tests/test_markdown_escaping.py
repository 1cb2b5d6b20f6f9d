"""Fleet's Markdown outputs render as written: dollars, angle brackets and pipes, in nbconvert's HTML and in Markdown.

MathJax (nbconvert's page, JupyterLab) typesets the text between two unescaped ``$`` of any element it does not
skip; these tests read the HTML as MathJax would and say what it would find. The browser half is in
``tests/kernel/test_kernel_browser_markdown.py``.
"""

from __future__ import annotations

import asyncio
import re
from html.parser import HTMLParser

import nbformat
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import markdown2html_mistune

from fleet_kernel.events import make_event
from fleet_kernel.kernel import commands
from fleet_kernel.kernel.display import PlainLive, show_reply
from fleet_kernel.markdown import md_escape
from fleet_kernel.transcript import TurnView, render_markdown, session_notebook, transcript_bundle

PRICES = "the basic plan costs $5 and the pro plan costs $10"
SKIPPED_TAGS = {"script", "noscript", "style", "textarea", "pre", "code"}
"""What MathJax never typesets (its ``skipHtmlTags``), besides elements of class ``tex2jax_ignore``/``mathjax_ignore``."""
VOID = {"br", "hr", "img", "input", "meta", "link", "wbr", "col", "area", "base", "source"}


class _Reader(HTMLParser):
    """The text a reader sees, and the text MathJax would search for ``$`` delimiters."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool, bool]] = []  # (tag, hidden from MathJax, not shown at all)
        self.shown: list[str] = []
        self.typeset: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in VOID:
            return
        classes = (dict(attrs).get("class") or "").split()
        skip_math, hidden = self.stack[-1][1:] if self.stack else (False, False)
        skip_math = skip_math or tag in SKIPPED_TAGS or bool({"tex2jax_ignore", "mathjax_ignore"} & set(classes))
        self.stack.append((tag, skip_math, hidden or tag in ("script", "style", "head", "title")))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        pass  # <br/>, <hr/>: no text, no nesting

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID or tag not in (t for t, _, _ in self.stack):
            return
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        skip_math, hidden = self.stack[-1][1:] if self.stack else (False, False)
        if not hidden:
            self.shown.append(data)
        if not skip_math:
            self.typeset.append(data)


def read(page: str) -> tuple[str, str]:
    """``(text shown, text MathJax typesets)`` of an HTML page or fragment."""
    reader = _Reader()
    reader.feed(page)
    return " ".join("".join(reader.shown).split()), "".join(reader.typeset)


def assert_shown_as_written(page: str, *expected: str) -> str:
    shown, typeset = read(page)
    for text in expected:
        assert text in shown, (text, shown)
    assert not re.search(r"(?<!\\)\$", typeset), f"MathJax would read TeX in: {typeset!r}"
    assert "\\|" not in shown and "**" not in shown
    return shown


def _steps(reasoning: str, answer: str) -> list[tuple[str, dict]]:
    limits = {"max_iters": 3, "max_llm_calls": 5, "timeout_s": 60, "exec_timeout_s": 10}
    return [
        ("turn.started", {"task": "t", "run_id": "r", "model": "m", "sandbox": "local", "limits": limits}),
        ("iteration.started", {"iteration": 1, "max_iters": 3}),
        ("reasoning", {"iteration": 1, "text": reasoning}),
        ("code", {"iteration": 1, "code": "price = '$5'  # <b>\nprint(price)"}),
        ("output", {"iteration": 1, "stream": "stdout", "text": "$5 and $10\n"}),
        ("execution.finished", {"iteration": 1, "duration_ms": 3.0, "error": None}),
        ("turn.completed", {"answer": answer, "usage": {"lm_calls": 1}, "duration_ms": 5}),
    ]


def _events(steps: list[tuple[str, dict]], session_id: str = "s", turn_id: str = "t") -> list:
    return [make_event(t, d, seq=i + 1, session_id=session_id, turn_id=turn_id) for i, (t, d) in enumerate(steps)]


def _view(reasoning: str, answer: str) -> TurnView:
    return TurnView.of(_events(_steps(reasoning, answer)))


class _Pub:
    """What a live view or ``show_reply`` sends, kept (the kernel's IOPub, without a kernel)."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.html: list[str] = []

    def display(self, data: dict[str, str], metadata: object = None, **_: object) -> None:
        self.data = data
        self.html.append(data.get("text/html", ""))

    def stream(self, name: str, text: str) -> None:
        pass


def _help_bundle() -> dict[str, str]:
    pub = _Pub()
    show_reply(pub, asyncio.run(commands.cmd_help(None, [])), text_mode=False)  # type: ignore[arg-type]
    return pub.data


def _notebook(*outputs: tuple[str, dict[str, str]]) -> nbformat.NotebookNode:
    cells = []
    for source, data in outputs:
        cell = nbformat.v4.new_code_cell(source, execution_count=1)
        cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
        cells.append(cell)
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "fleet", "display_name": "Fleet RLM", "language": "markdown"}
    return nb


# ---------------------------------------------------------------------------------------------- the one escape


def test_prose_escapes_dollars_and_html_but_leaves_code_and_markdown_as_written() -> None:
    text = "**Cost**: $5 or $10 for <title>; `echo $HOME | wc` stays\n\n```sh\necho $PATH <in>\n```\n"
    escaped = md_escape(text)
    assert escaped.startswith("**Cost**: \\$5 or \\$10 for &lt;title>; `echo $HOME | wc` stays")
    assert "```sh\necho $PATH <in>\n```" in escaped
    assert md_escape("already \\$5") == "already \\$5"


def test_literal_text_is_nothing_but_text() -> None:
    assert md_escape("a|b **c** $1 <i> [x](y) &amp;", literal=True) == (
        "a&#124;b \\*\\*c\\*\\* \\$1 &lt;i&gt; \\[x\\](y) &amp;amp;"
    )


# ---------------------------------------------------------------------------------------------- commands


def test_help_lists_every_command_with_its_pipes_and_placeholders_in_markdown() -> None:
    html_help = markdown2html_mistune(_help_bundle()["text/markdown"])
    shown = assert_shown_as_written(
        html_help,
        "%fleet status | usage",
        "%fleet session [new [title] | use <id> | list]",
        "fleet-<title>-<id>.ipynb",
        "%fleet serve [port]",
        "%fleet set [name [value]]",
        "%fleet skill [list | show N | use N... | clear]",
        "%fleet history [forget|restore <turn_id>]",
    )
    rows = re.findall(r"<tr>", html_help)
    assert len(rows) == len(commands.help_lines()) + 1  # a row per line of the help, and the header
    assert shown.index("%fleet export") < shown.index("%fleet serve") < shown.index("%fleet history")


def test_status_lines_keep_their_dollars() -> None:
    lines = ["usage: 1 LM calls, 15 tokens (10 in, 5 out), $0.0100", "last turn: 15 tokens, $0.0100 of $1.0000"]
    pub = _Pub()
    show_reply(
        pub, commands.Reply("\n".join(lines), "\n".join(f"- {commands.md(line)}" for line in lines)), text_mode=False
    )  # type: ignore[arg-type]
    assert_shown_as_written(markdown2html_mistune(pub.data["text/markdown"]), *lines)


# ---------------------------------------------------------------------------------------------- transcripts


def test_a_transcript_shows_the_models_dollars_as_written_in_markdown_and_html() -> None:
    view = _view(f"I think {PRICES}, see <title>.", f"**Yes**: {PRICES}.")
    data, _ = transcript_bundle(view)
    for page in (markdown2html_mistune(data["text/markdown"]), data["text/html"]):
        shown = assert_shown_as_written(page, f"I think {PRICES}, see <title>.", f"Yes: {PRICES}.", "$5 and $10")
        assert "price = '$5'  # <b>" in shown or "price = '$5' # <b>" in shown  # code as written, no escape showing
    assert "<strong>Yes</strong>" in markdown2html_mistune(render_markdown(view))


async def test_the_plain_live_view_shows_the_models_dollars_as_written() -> None:
    """What nbclient and frontends without widgets show while the turn runs."""
    pub = _Pub()
    live = PlainLive(pub, TurnView())  # type: ignore[arg-type]
    for event in _events(_steps(f"I think {PRICES}.", PRICES)):
        live.on_event(event)
    await live.finish()
    live.close()
    assert_shown_as_written("".join(pub.html), f"I think {PRICES}.", "price = '$5'")


def test_nbconvert_html_of_commands_and_a_transcript_shows_the_text_as_written() -> None:
    data, _ = transcript_bundle(_view(PRICES, PRICES))
    nb = _notebook(("%fleet help", _help_bundle()), ("what do the plans cost?", data))
    page, _ = HTMLExporter().from_notebook_node(nb)
    assert_shown_as_written(page, PRICES, "%fleet status | usage", "%fleet history [forget|restore <turn_id>]")


async def test_an_exported_notebook_renders_its_title_and_turns_as_written(store) -> None:
    ses = await store.create_session(f"Plans: {PRICES} <draft>")
    turn, _ = await store.claim_turn(ses.session_id, "what do the plans cost?")
    await store.append_events(_events(_steps(PRICES, PRICES), ses.session_id, turn.turn_id))
    await store.finish_turn(turn.turn_id, "completed", answer=PRICES)
    nb = await session_notebook(store, ses.session_id)
    page, _ = HTMLExporter().from_notebook_node(nb)
    assert_shown_as_written(page, f"Plans: {PRICES} <draft>", f"{PRICES}")
