"""What every ``%fleet`` command module shares: the reply, the registry and the helpers of their text."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fleet_kernel.errors import ValidationError
from fleet_kernel.kernel.context import KernelContext
from fleet_kernel.markdown import md_escape

PREFIX = "%fleet"
HELP_WIDTH = 49
"""The column of the help where what a command does starts (after its usage)."""


@dataclass
class Reply:
    """What a command shows: plain text for every frontend, Markdown where it renders."""

    text: str
    markdown: str | None = None


Handler = Callable[[KernelContext, list[str]], Awaitable[Reply]]


@dataclass(frozen=True)
class Command:
    """A registered command: the words that run it, its lines of the help, and the words completed after it."""

    names: tuple[str, ...]
    handler: Handler
    help: tuple[tuple[str, str], ...]
    words: tuple[str, ...]
    order: int


REGISTERED: list[Command] = []


def command(
    name: str,
    usage: str,
    what: str,
    *,
    order: int,
    aliases: tuple[str, ...] = (),
    words: tuple[str, ...] = (),
    more_help: tuple[tuple[str, str], ...] = (),
) -> Callable[[Handler], Handler]:
    """Register ``%fleet name`` (and its ``aliases``): ``usage`` and ``what`` are its line of ``%fleet help``
    (``more_help`` adds lines under it), ``order`` places it in the help and the completions, and ``words``
    are what completes after it."""

    def register(handler: Handler) -> Handler:
        REGISTERED.append(Command((name, *aliases), handler, ((usage, what), *more_help), words, order))
        return handler

    return register


def registered() -> list[Command]:
    """Every registered command, in the order of the help."""
    return sorted(REGISTERED, key=lambda c: c.order)


def help_lines() -> list[str]:
    """``%fleet help``: a line per usage, what it does from ``HELP_WIDTH``."""
    return [f"{usage:<{HELP_WIDTH}}{what}" for c in registered() for usage, what in c.help]


def usage_error(message: str) -> Exception:
    return ValidationError(message, code="usage")


def md(text: str) -> str:
    """Our text or the user's in a Markdown output: shown as written (``md_escape``)."""
    return md_escape(text, literal=True)


def marked(cell: str, is_marked: bool) -> str:
    """A table cell in bold when it is the current or chosen one (``**`` around the whole cell, code and all)."""
    return f"**{cell}**" if is_marked else cell
