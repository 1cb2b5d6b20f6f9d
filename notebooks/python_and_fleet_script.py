"""``python-and-fleet.ipynb``: the notebook, its scripted model, and how its cassette is made.

The notebook runs in a stock ``python3`` kernel: data made with pandas, a ``%%fleet`` turn that reads it
as an input variable and returns a typed result, and a chart of that result drawn in Python. It runs
offline on ``python-and-fleet.cassette.json``, SCRIPTED answers written for this tour (below), not a
real model's output. Regenerate the notebook and the cassette with

    .venv/bin/python notebooks/python_and_fleet_script.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "python-and-fleet.ipynb"
CASSETTE = HERE / "python-and-fleet.cassette.json"
LABEL = (
    "SCRIPTED answers written for notebooks/python-and-fleet.ipynb (notebooks/python_and_fleet_script.py), "
    "not a real model's output. Set FLEET_LM_MODEL to a real model to run the notebook for real."
)

CELLS = [
    (
        "markdown",
        "# Python and Fleet in one notebook\n\n"
        "This is an ordinary Python notebook. `%load_ext fleet_kernel` adds `%%fleet`: a cell whose body is a "
        "task for a recursive language model, which reasons, writes Python and runs it in a sandbox. "
        "`--in` hands it notebook variables (sent to the sandbox once, never pasted into the prompt), "
        "`--out` and `--schema` bring a typed result back. Without `FLEET_LM_MODEL` the notebook replays "
        "scripted answers from `python-and-fleet.cassette.json`.",
    ),
    ("code", "%load_ext fleet_kernel\n%fleet model default replay/python-and-fleet.cassette.json"),
    ("markdown", "Data made in Python: a year of monthly unit sales in three regions."),
    (
        "code",
        "import pandas as pd\n\n"
        'months = [f"2025-{m:02d}" for m in range(1, 13)]\n'
        'base = {"north": 120, "south": 90, "west": 60}\n'
        'step = {"north": 2, "south": 5, "west": 7}\n'
        "sales = pd.DataFrame(\n"
        '    [{"month": m, "region": r, "units": base[r] + step[r] * i + (i * 7 + len(r)) % 5}\n'
        "     for i, m in enumerate(months) for r in base]\n"
        ")\n"
        "sales.head()",
    ),
    ("markdown", "The shape of the answer we want, as a pydantic model."),
    (
        "code",
        "from pydantic import BaseModel\n\n\n"
        "class Growth(BaseModel):\n"
        "    regions: list[str]\n"
        "    growth_pct: list[float]\n"
        "    fastest: str",
    ),
    ("markdown", "A turn: `sales` is a DataFrame in the sandbox; the validated result lands in `growth`."),
    (
        "code",
        "%%fleet --in sales --schema Growth --out growth\n"
        "Which region's units grew fastest from the first quarter to the last? Give each region's growth in percent.",
    ),
    ("markdown", "Back in Python: `growth` is a `Growth` instance."),
    (
        "code",
        "import matplotlib.pyplot as plt\n\n"
        "fig, ax = plt.subplots(figsize=(6, 3))\n"
        'ax.bar(growth.regions, growth.growth_pct, color="#1f3a5f")\n'
        'ax.set_ylabel("growth, Q1 to Q4 (%)")\n'
        'ax.set_title(f"Fastest growing region: {growth.fastest}")\n'
        "plt.show()",
    ),
]


def step(reasoning: str, code: str) -> dict[str, str]:
    return {"reasoning": reasoning, "code": code}


SCRIPTS = {
    "grew fastest": [
        step(
            "`sales` is a DataFrame input; I'll check its shape and columns first.",
            "print(type(sales).__name__, sales.shape)\nprint(sales.head(6).to_string())",
        ),
        step(
            "Quarter from the month, then each region's units in Q1 and Q4, and the growth between them.",
            "quarter = (sales['month'].str[5:7].astype(int) - 1) // 3 + 1\n"
            "by = sales.assign(quarter=quarter).groupby(['region', 'quarter'])['units'].sum().unstack()\n"
            "growth = ((by[4] / by[1] - 1) * 100).round(1)\n"
            "print(growth.to_string())\n"
            'SUBMIT(answer=f"**{growth.idxmax()}** grew fastest: {growth.max()}% from Q1 to Q4.",\n'
            "       result={'regions': list(growth.index), 'growth_pct': [float(g) for g in growth],\n"
            "               'fastest': str(growth.idxmax())})",
        ),
    ],
}


def write_notebook() -> None:
    nb = nbformat.v4.new_notebook()
    for kind, source in CELLS:
        nb.cells.append(
            nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, NOTEBOOK)


def run(out: Path, timeout: int = 300) -> nbformat.NotebookNode:
    """Execute the notebook in a python3 kernel with ``out`` as its folder (the cassette copied there)."""
    out.mkdir(parents=True, exist_ok=True)
    if CASSETTE.is_file():
        (out / CASSETTE.name).write_bytes(CASSETTE.read_bytes())
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(out)}}).execute()
    return nb


def main() -> None:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from scripted_lm import ScriptedLM

    write_notebook()
    CASSETTE.unlink(missing_ok=True)
    with ScriptedLM(SCRIPTS) as lm, tempfile.TemporaryDirectory() as home:
        os.environ.update({**lm.env(), "FLEET_HOME": home, "FLEET_LM_RECORD": str(CASSETTE)})
        run(Path(home) / "out")
    data = json.loads(CASSETTE.read_text(encoding="utf-8"))
    data.update({"label": LABEL, "model": "scripted"})
    CASSETTE.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {NOTEBOOK} and {CASSETTE} ({len(data['exchanges'])} exchanges)")


if __name__ == "__main__":
    main()
