"""Papermill support: parameters injected into a Fleet notebook become ``%fleet set`` lines.

Papermill picks a parameter translator by kernel name, then by the kernel's language (``markdown`` for
Fleet), and it has no entry-point group for translators. It does load its ``papermill.engine`` entry
points when it is imported, so pyproject.toml names ``FleetEngine`` there and importing this module
registers the translator. Only notebooks whose kernel is ``fleet`` or whose kernel's language is
``markdown`` use it (markdown *cells* of other notebooks are never parameterised by papermill).

    papermill -k fleet in.ipynb out.ipynb --cwd . -p region north
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from papermill.engines import NBClientEngine
from papermill.exceptions import PapermillException
from papermill.models import Parameter
from papermill.translators import Translator, papermill_translators

from fleet_kernel.kernel import spec

LANGUAGE = spec.LANGUAGE
KERNEL_NAME = spec.NAME


class FleetTranslator(Translator):
    """Values as shell-quoted words of ``%fleet set name value`` (the kernel reads them with ``shlex``)."""

    @classmethod
    def translate_str(cls, val: str) -> str:
        if "\n" in val or "\r" in val:
            raise PapermillException("a Fleet parameter is one line of text: remove the line breaks from its value")
        return shlex.quote(val)

    @classmethod
    def translate_none(cls, val: None) -> str:
        return "''"

    @classmethod
    def translate_dict(cls, val: dict[str, Any]) -> str:
        return shlex.quote(json.dumps(val))

    @classmethod
    def translate_list(cls, val: list[Any]) -> str:
        return shlex.quote(json.dumps(val))

    @classmethod
    def assign(cls, name: str, str_val: str) -> str:
        return f"%fleet set {name} {str_val}"

    @classmethod
    def inspect(cls, parameters_cell: Any) -> list[Parameter]:
        """The ``%fleet set`` lines of the ``parameters`` cell, for ``papermill --help-notebook``."""
        found = []
        for line in parameters_cell.source.splitlines():
            try:
                words = shlex.split(line)
            except ValueError:
                continue
            if words[:2] == ["%fleet", "set"] and len(words) > 2:
                found.append(Parameter(words[2], "str", " ".join(words[3:]), ""))
        return found

    @classmethod
    def codify(cls, parameters: dict[str, Any], comment: str = "Parameters") -> str:
        """Only ``%fleet set`` lines: a Fleet cell holds commands or a task, so there is no comment line."""
        return "".join(f"{cls.assign(name, cls.translate(value))}\n" for name, value in parameters.items())


class FleetEngine(NBClientEngine):
    """Papermill's own nbclient engine under the name ``fleet`` (``--engine fleet`` works too).

    It is what pyproject.toml's ``papermill.engine`` entry point loads: loading it registers the translator.
    """


papermill_translators.register(LANGUAGE, FleetTranslator)
papermill_translators.register(KERNEL_NAME, FleetTranslator)
