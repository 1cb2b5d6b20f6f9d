"""Papermill support: parameters injected into a Fleet notebook become ``%fleet set`` lines.

Papermill picks a parameter translator by kernel name, then by the kernel's language (``markdown`` for
Fleet), and it has no entry-point group for translators. It does load its ``papermill.engine`` entry
points when it is imported, so pyproject.toml names ``FleetEngine`` there and importing this module
registers the translator. Only notebooks whose kernel is ``fleet`` or whose kernel's language is
``markdown`` use it (markdown *cells* of other notebooks are never parameterised by papermill).

    papermill -k fleet in.ipynb out.ipynb --cwd . -p region north

``FleetEngine`` is also papermill's default engine once loaded: papermill's own nbclient engine, whose
requests carry each cell's id (``fleet_kernel.cell_ids``) and whose kernel knows the notebook's folder
(``FLEET_NOTEBOOK_DIR``), so a relative path that is not found says to pass ``--cwd``.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from nbclient.util import run_sync
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, papermill_engines
from papermill.exceptions import PapermillException
from papermill.log import logger
from papermill.models import Parameter
from papermill.translators import Translator, papermill_translators
from papermill.utils import merge_kwargs, remove_args
from traitlets import Unicode

from fleet_kernel.cell_ids import CellIdClient
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
    def translate_none(cls, val: None) -> str:  # noqa: ARG003 - papermill's Translator signature
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
    def codify(cls, parameters: dict[str, Any], comment: str = "Parameters") -> str:  # noqa: ARG003 - papermill's Translator signature
        """Only ``%fleet set`` lines: a Fleet cell holds commands or a task, so there is no comment line."""
        return "".join(f"{cls.assign(name, cls.translate(value))}\n" for name, value in parameters.items())


NOTEBOOK_DIR_ENV = spec.NOTEBOOK_DIR_ENV


class FleetNotebookClient(CellIdClient, PapermillNotebookClient):
    """Papermill's client with cell ids, starting its kernel with ``FLEET_NOTEBOOK_DIR`` when known."""

    notebook_dir = Unicode(None, allow_none=True)

    async def async_start_new_kernel(self, **kwargs: Any) -> None:
        if self.notebook_dir:
            kwargs["env"] = {**os.environ, **(kwargs.get("env") or {}), NOTEBOOK_DIR_ENV: self.notebook_dir}
        await super().async_start_new_kernel(**kwargs)

    start_new_kernel = run_sync(async_start_new_kernel)


class FleetEngine(NBClientEngine):
    """Papermill's own nbclient engine with cell ids, under the name ``fleet`` and as the default engine.

    It is what pyproject.toml's ``papermill.engine`` entry point loads: loading it registers the translator.
    """

    @classmethod
    def execute_managed_notebook(
        cls,
        nb_man: Any,
        kernel_name: str,
        log_output: bool = False,
        stdout_file: Any = None,
        stderr_file: Any = None,
        start_timeout: int = 60,
        execution_timeout: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """``NBClientEngine.execute_managed_notebook`` with ``FleetNotebookClient``."""
        notebook_dir = _notebook_dir(kwargs.pop("input_path", None))
        safe_kwargs = remove_args(["timeout", "startup_timeout"], **kwargs)
        final_kwargs = merge_kwargs(
            safe_kwargs,
            timeout=execution_timeout if execution_timeout else kwargs.get("timeout"),
            startup_timeout=start_timeout,
            kernel_name=kernel_name,
            log=logger,
            log_output=log_output,
            stdout_file=stdout_file,
            stderr_file=stderr_file,
        )
        return FleetNotebookClient(nb_man, notebook_dir=notebook_dir, **final_kwargs).execute()


def _notebook_dir(input_path: Any) -> str | None:
    """The folder of a local input notebook, if papermill's working folder still finds it (no ``--cwd``)."""
    if not isinstance(input_path, str | os.PathLike) or "://" in str(input_path):
        return None
    path = Path(input_path)
    return str(path.resolve().parent) if path.is_file() else None


papermill_translators.register(LANGUAGE, FleetTranslator)
papermill_translators.register(KERNEL_NAME, FleetTranslator)
papermill_engines.register(None, FleetEngine)  # the default: without --engine, notebooks run under their cell ids
