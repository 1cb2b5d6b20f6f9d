"""The offline demo: execute ``notebooks/quickstart.ipynb`` through the ``fleet`` kernel and keep the result.

    python -m fleet_kernel.demo [--out DIR] [--check]

Without ``FLEET_LM_MODEL`` the notebook runs on its cassette of scripted answers (its first code cell
is ``%fleet model default replay/quickstart.cassette.json``: no network, no key); with it, on that model
for real. Writes the executed notebook and an HTML transcript into ``DIR`` (default
``./quickstart-output``) and prints how to open them in JupyterLab. ``--check`` runs nothing: it checks
that the demo's tools, files and kernelspec are there.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from fleet_kernel.kernel import spec
from fleet_kernel.kernel.install import install

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
QUICKSTART = NOTEBOOKS / "quickstart.ipynb"
CASSETTE = NOTEBOOKS / "quickstart.cassette.json"
KERNEL_NAME = spec.NAME


class DemoError(Exception):
    """The demo cannot run or a cell failed; the message says what to do."""


def ensure_kernelspec() -> None:
    """Install the ``fleet`` kernelspec into this environment when Jupyter cannot find it."""
    from jupyter_client.kernelspec import KernelSpecManager  # ~0.5 s: `fleet --help` does not pay it

    if KERNEL_NAME not in KernelSpecManager().find_kernel_specs():
        install(sys_prefix=True)


def preflight() -> None:
    """Check what the demo needs before it starts a kernel. Raises ``DemoError`` saying what to install."""
    for module in ("nbformat", "nbclient", "nbconvert"):
        if importlib.util.find_spec(module) is None:
            raise DemoError(f"the demo needs nbclient and nbconvert: pip install nbclient nbconvert (no {module})")
    if importlib.util.find_spec("matplotlib") is None:
        raise DemoError("the quickstart's sandbox code draws a chart with matplotlib: pip install matplotlib")
    for needed in (QUICKSTART, CASSETTE, NOTEBOOKS / "data"):
        if not needed.exists():
            raise DemoError(f"{needed} is missing: run the demo from a checkout of the Fleet repository")


def check() -> None:
    """``--check``: everything the demo needs is there, and Jupyter finds (or could install) the kernel."""
    from jupyter_client.kernelspec import KernelSpecManager

    preflight()
    found = KERNEL_NAME in KernelSpecManager().find_kernel_specs()
    state = "installed" if found else "not installed yet (the demo installs it)"
    print(f"the demo's tools and files are there; the {KERNEL_NAME} kernelspec is {state}")


def run_quickstart(out: Path, kernel_name: str = KERNEL_NAME, timeout: int = 600) -> tuple[Path, Path]:
    """Execute the quickstart into ``out``; returns the executed notebook and its HTML transcript.

    Raises:
        DemoError: a tool is missing or a cell failed (the partly executed notebook is still written).
    """
    preflight()
    import nbformat  # nbformat, nbclient and nbconvert (~1 s) only for the demo
    from nbclient.exceptions import CellExecutionError
    from nbconvert import HTMLExporter

    from fleet_kernel.cell_ids import CellIdClient

    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(NOTEBOOKS / "data", out / "data", dirs_exist_ok=True)
    shutil.copy(CASSETTE, out / CASSETTE.name)  # the notebook falls back to it when no model is configured
    notebook_path, html_path = out / "quickstart.ipynb", out / "quickstart.html"
    nb = nbformat.read(QUICKSTART, as_version=4)
    client = CellIdClient(
        nb,
        kernel_name=kernel_name,
        timeout=timeout,
        resources={"metadata": {"path": str(out)}},
        store_widget_state=True,
        coalesce_streams=True,
    )
    failure: str | None = None
    try:
        client.execute()
    except CellExecutionError as exc:
        failure = str(exc).strip().splitlines()[-1]
    nbformat.write(nb, notebook_path)
    html, _ = HTMLExporter().from_notebook_node(nb)
    html_path.write_text(html, encoding="utf-8")
    if failure:
        raise DemoError(f"a cell failed: {failure}\n(the notebook as far as it ran: {notebook_path})")
    return notebook_path, html_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleet_kernel.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="quickstart-output", help="where to write the results")
    parser.add_argument("--check", action="store_true", help="run nothing: check that the demo can run")
    args = parser.parse_args(argv)
    if args.check:
        try:
            check()
        except DemoError as exc:
            print(f"The demo cannot run: {exc}", file=sys.stderr)
            return 1
        return 0
    out = Path(args.out).resolve()
    os.environ.setdefault("FLEET_HOME", str(Path(".fleet").resolve()))
    model = os.environ.get("FLEET_LM_MODEL")
    where = model or "its cassette of scripted answers (offline; set FLEET_LM_MODEL to use a real model)"
    print(f"Running {QUICKSTART.name} through the fleet kernel on {where} ...", flush=True)
    try:
        ensure_kernelspec()
        notebook, html = run_quickstart(out)
    except DemoError as exc:
        print(f"The demo failed: {exc}", file=sys.stderr)
        return 1
    env = f"FLEET_HOME={os.environ['FLEET_HOME']}"
    lab = Path(sys.executable).parent / "jupyter-lab"
    install = "" if lab.exists() else f"  {Path(sys.executable).parent / 'pip'} install jupyterlab\n"
    print(
        f"\nExecuted notebook: {notebook}\nHTML transcript:   {html}\n"
        f"Store and logs:    {os.environ['FLEET_HOME']}\n\n"
        f"Open the transcript in a browser:\n  xdg-open {html}\n"
        f'Open the notebook in JupyterLab (pick the "Fleet RLM" kernel to go on; `%fleet help` lists commands):\n'
        f"{install}  {env} {lab} {notebook}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
