"""The quickstart's scripted model, and how its cassette is made.

``quickstart.ipynb`` runs offline on ``quickstart.cassette.json``: SCRIPTED answers written for this tour
(below), not a real model's output. This file is their source. Regenerate the data and the cassette with

    .venv/bin/python notebooks/quickstart_script.py

which writes ``data/ship_log.txt`` (a made-up two-year log of the whaler *Albatross*), serves ``SCRIPTS``
from the test suite's scripted OpenAI-compatible server, and executes the notebook through the ``fleet``
kernel with ``FLEET_LM_RECORD`` pointing at a fresh cassette.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASSETTE = HERE / "quickstart.cassette.json"
LOG = HERE / "data" / "ship_log.txt"
LABEL = (
    "SCRIPTED answers written for the Fleet quickstart (notebooks/quickstart_script.py), not a real model's "
    "output. Set FLEET_LM_MODEL to a real model to run the notebook for real."
)

PORTS = ["Nantucket", "Valparaíso", "Callao", "Honolulu", "Papeete", "Lahaina", "Talcahuano", "Sydney"]
WEATHER = ["fair", "fair", "fair", "rain", "fog", "calm", "squalls"]
NOTES = {
    "storm": [
        "Split the fore topsail; bent a new one at dawn.",
        "Heavy seas stove the starboard whaleboat.",
        "Carried away the main topgallant yard.",
        "Pumps manned all night; six inches in the well.",
        "Lay to under close-reefed main topsail.",
    ],
    "port": [
        "Took on water and wood.",
        "Shipped two hands; one deserted.",
        "Traded for fresh fruit and yams.",
        "Cooper at work on casks.",
        "Liberty for the larboard watch.",
    ],
    "sea": [
        "Saw sperm whales to leeward; lowered, no luck.",
        "Tried out 40 barrels.",
        "Sighted a sail to windward.",
        "Mending sails.",
        "Set a lookout at each masthead.",
        "Spoke the ship Essex bound home.",
    ],
}


def make_ship_log(seed: int = 1851) -> str:
    """Two years of daily entries: ``date | place | weather | note``, storms mostly in southern winter."""
    rng = random.Random(seed)
    day, lines, port, stay = dt.date(1851, 1, 1), [], None, 0
    while day < dt.date(1853, 1, 1):
        if stay == 0:
            port = rng.choice(PORTS) if port is None and rng.random() < 0.08 else None
            stay = rng.randint(4, 12) if port else 0
        storm_chance = 0.22 if day.month in (5, 6, 7, 8) else 0.05
        weather = "storm" if rng.random() < storm_chance and not port else rng.choice(WEATHER)
        place = f"in port at {port}" if port else f"at sea {rng.randint(2, 58)}°S {rng.randint(70, 170)}°W"
        kind = "storm" if weather == "storm" else ("port" if port else "sea")
        lines.append(f"{day.isoformat()} | {place} | {weather} | {rng.choice(NOTES[kind])}")
        stay = max(stay - 1, 0)
        day += dt.timedelta(days=1)
    return "\n".join(lines) + "\n"


def step(reasoning: str, code: str) -> dict[str, str]:
    return {"reasoning": reasoning, "code": code}


FIRST = [
    step(
        "I should look at the attachment before parsing it: its size and first lines.",
        'lines = open("files/ship_log.txt", encoding="utf-8").read().splitlines()\n'
        'print(f"{len(lines)} entries")\n'
        'print("\\n".join(lines[:4]))',
    ),
    step(
        "Each line is `date | place | weather | note`. I'll parse every line, count the days in each port and "
        "the storms in each month, printing the months as I go.",
        "import time\nfrom collections import Counter\n\nports, storms = Counter(), Counter()\n"
        "for line in lines:\n"
        '    date, place, weather, note = [part.strip() for part in line.split("|")]\n'
        '    if place.startswith("in port at "):\n'
        '        ports[place.removeprefix("in port at ")] += 1\n'
        '    if weather == "storm":\n'
        "        storms[date[:7]] += 1\n"
        "months = sorted({line[:7] for line in lines})\n"
        "for month in months:\n"
        '    print(month, "#" * storms[month], storms[month], flush=True)\n'
        "    time.sleep(0.05)\n"
        'print("most days in port:", ports.most_common(3))',
    ),
    step(
        "The notes of the stormiest month tell what the storms did; a sub-model can sum them up.",
        "worst = max(sorted(storms), key=storms.get)\n"
        'notes = [l.split("|")[3].strip() for l in lines if l.startswith(worst) and "| storm |" in l]\n'
        'summary = llm_query("In one sentence, what did these storms do to the ship?\\n" + "\\n".join(notes))\n'
        'print(worst, "-", summary)',
    ),
    step(
        "Now the chart, saved under artifacts/ so that it is shown to the user.",
        'import os\nos.environ.setdefault("MPLCONFIGDIR", "/tmp/matplotlib")\nimport matplotlib\n'
        'matplotlib.use("Agg")\nimport matplotlib.pyplot as plt\n\n'
        "fig, ax = plt.subplots(figsize=(9, 3.5))\n"
        'ax.bar(months, [storms[m] for m in months], color="#1f3a5f")\n'
        'ax.set_title("Storms logged per month aboard the Albatross")\nax.set_ylabel("storm days")\n'
        'ax.tick_params(axis="x", rotation=60, labelsize=8)\nfig.tight_layout()\n'
        'fig.savefig("artifacts/storms_per_month.png", dpi=100)\nprint("saved artifacts/storms_per_month.png")',
    ),
    step(
        "I have the counts, the summary and the chart: time to answer.",
        "top, visits = ports.most_common(1)[0]\n"
        'table = "\\n".join(f"| {m} | {storms[m]} |" for m in months)\n'
        'SUBMIT(answer=f"The *Albatross* spent most days in port at **{top}** ({visits} days).\\n\\n"\n'
        '       f"She logged {sum(storms.values())} storm days; the worst month was {worst}: {summary}\\n\\n"\n'
        '       f"| month | storms |\\n|---|---|\\n{table}\\n\\n"\n'
        '       "The chart is saved as `artifacts/storms_per_month.png`.")',
    ),
]
SECOND = [
    step(
        "The sandbox may have restarted since the last turn, so I re-read the log and compare months.",
        "from collections import Counter\n"
        'lines = open("files/ship_log.txt", encoding="utf-8").read().splitlines()\n'
        "storms, in_port, days = Counter(), Counter(), Counter()\n"
        "for line in lines:\n"
        '    date, place, weather, note = [p.strip() for p in line.split("|")]\n'
        "    days[date[:7]] += 1\n"
        '    storms[date[:7]] += weather == "storm"\n'
        '    in_port[date[:7]] += place.startswith("in port at ")\n'
        "calm = min(sorted(days), key=lambda m: (storms[m], -in_port[m]))\n"
        'print(calm, "storms:", storms[calm], "days in port:", in_port[calm], "of", days[calm])',
    ),
    step(
        "That answers it.",
        'SUBMIT(answer=f"The calmest month was **{calm}**, with {storms[calm]} storm days; "\n'
        '       f"the ship spent {in_port[calm]} of its {days[calm]} days in port and the rest at sea.")',
    ),
]
THIRD = [
    step(
        "This is a search in a long text; the long-context-search skill fits, so I load its card first.",
        'card = load_skill("long-context-search")\nprint("\\n".join(card.splitlines()[:12]))',
    ),
    step(
        "The card says: measure first, narrow with code, keep positions to cite, verify quotes. "
        "I'll search every line for the Essex and keep line numbers.",
        "import re\n"
        'text = open("files/ship_log.txt", encoding="utf-8").read()\nlines = text.splitlines()\n'
        'print(len(text), "characters,", len(lines), "lines")\n'
        'hits = [(n, line) for n, line in enumerate(lines, 1) if re.search(r"\\bEssex\\b", line)]\n'
        "months = sorted({line[:7] for _, line in hits})\n"
        'print(len(hits), "entries in", len(months), "months; first:", hits[0])',
    ),
    step(
        "The first quote really occurs in the text; time to answer with it.",
        "first_line, first = hits[0]\nassert first in text\n"
        'SUBMIT(answer=f"She spoke the *Essex* {len(hits)} times, in {len(months)} months: "\n'
        "       f\"{', '.join(months)}.\\n\\nFirst entry (line {first_line}):\\n\\n> {first}\")",
    ),
]
FOURTH = [
    step(
        "A standing preference for later turns: keep it as a memory, which outlives this kernel and sandbox.",
        'remember("The user wants dates written as day month year, e.g. 3 March 1851.", kind="preference")\n'
        'print([m["content"] for m in search_memories("dates")])',
    ),
    step(
        "Kept and found again; confirm.",
        'SUBMIT(answer="Noted: from now on I write dates as day month year (3 March 1851). "\n'
        '       "The note is a memory of this session (`%fleet memory` lists it).")',
    ),
]
SCRIPTS = {"Which port": FIRST, "calmest": SECOND, "speak the Essex": THIRD, "day month year": FOURTH}


def sub_answer(prompt: str) -> str:
    if prompt.startswith("In one sentence"):
        return "They split sails, carried away spars and kept all hands at the pumps through the night."
    return "I can only answer the quickstart's scripted questions."


def main() -> None:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from scripted_lm import ScriptedLM

    from fleet_kernel.demo import ensure_kernelspec, run_quickstart

    LOG.parent.mkdir(exist_ok=True)
    LOG.write_text(make_ship_log(), encoding="utf-8")
    with ScriptedLM(SCRIPTS, sub=sub_answer) as lm, tempfile.TemporaryDirectory() as home:
        fresh = Path(home) / CASSETTE.name  # recorded apart: the run copies the committed cassette beside the notebook
        os.environ.update({**lm.env(), "FLEET_HOME": home, "FLEET_LM_RECORD": str(fresh)})
        ensure_kernelspec()
        run_quickstart(Path(home) / "out")
        data = json.loads(fresh.read_text(encoding="utf-8"))
    data.update({"label": LABEL, "model": "scripted"})
    CASSETTE.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {LOG} and {CASSETTE} ({len(data['exchanges'])} exchanges)")


if __name__ == "__main__":
    main()
