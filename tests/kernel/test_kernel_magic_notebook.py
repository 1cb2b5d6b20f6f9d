"""``%%fleet`` sees the notebook: its variables' catalogue, ``notebook("name")``, recent cells, the user's tools.

A real python3 ipykernel with ``%load_ext fleet_kernel`` over ZMQ, the scripted LM, the local sandbox.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kernel_harness import PythonKernel
from scripted_lm import step


def _prompts(scripted_lm: Any) -> str:
    return "\n".join(_text(r) for r in scripted_lm.root_requests())


def _text(request: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content", "")) for m in request["messages"])


@pytest.mark.slow
def test_the_catalogue_names_variables_but_never_their_values(py: PythonKernel, scripted_lm) -> None:
    py.ok(
        "import pandas as pd\n"
        "df = pd.DataFrame({'city': ['Zanzibar', 'Quito'], 'pop': [123457, 98765]})\n"
        "_private = 5\nnotes = 'secret plan xyzzy'"
    )
    for n in range(3):  # the cell that made them is no longer among the recent cells
        py.ok(f"step_{n} = {n}")
    py.ok("api_key = 'sk-never-leaves'")
    scripted_lm.add(
        "catalogue",
        [
            step("fetch", "d = notebook('df')\nprint('shape', d.shape, type(d).__name__, int(d['pop'].sum()))"),
            step("secret", "try:\n    notebook('api_key')\nexcept Exception as e:\n    print('refused:', e)"),
            step("done", "SUBMIT(answer='ok')"),
        ],
    )
    run = py.ok("%%fleet\ncatalogue please")
    text = run.text()
    assert "shape (2, 2) DataFrame 222222" in text
    assert "refused:" in text and "'api_key' is not a notebook variable you may fetch" in text
    events = py.stored_events(run.result["metadata"]["fleet"]["turn_id"])
    fetches = [e.data["args_preview"] for e in events if e.type == "tool.started" and e.data["name"] == "notebook"]
    assert fetches == ["df", "api_key"]
    assert [e.data["ok"] for e in events if e.type == "tool.finished"] == [True, False]
    first = _text(scripted_lm.root_requests()[0])
    assert "- df: DataFrame 2x2 [city: " in first and "pop: int64]" in first and "notes: str len 17" in first
    assert "Zanzibar" not in first and "123457" not in first and "xyzzy" not in first  # names, never values
    assert "- api_key" not in first and "sk-never-leaves" not in _prompts(scripted_lm) and "_private" not in first
    assert "In [" in first and "step_2 = 2" in first and "api_key = <hidden>" in first  # the recent cells
    assert "notebook(" in first


def test_an_in_value_is_a_turn_input_and_not_also_a_notebook_variable(py: PythonKernel, scripted_lm) -> None:
    """Listed twice, an ``--in`` value invited Qwen2.5-Coder-1.5B to fetch ``notebook("sales")`` instead of
    using its ``sales`` input (docs/real-models.md); it is listed once, as the input it is."""
    py.ok("sales = 'amount\\n1.5\\n2.5'\nregion = 'north'")
    scripted_lm.add("sum the sales", [step("done", "SUBMIT(answer='4.0')")])
    py.ok("%%fleet --in sales\nsum the sales")
    first = _text(scripted_lm.root_requests()[0])
    assert "Variable: `sales`" in first  # the input
    assert "- region: str len 5" in first and "- sales:" not in first  # the notebook's other variables


@pytest.mark.slow
def test_previews_and_context_off(py: PythonKernel, scripted_lm) -> None:
    py.ok("label = 'hello previews'")
    py.ok("%fleet context previews")
    scripted_lm.add("peek", [step("done", "SUBMIT(answer='seen')")])
    py.ok("%%fleet\npeek")
    assert "label: str len 14 = 'hello previews'" in _prompts(scripted_lm)
    assert "context off" in py.ok("%fleet context off").text()
    scripted_lm.requests.clear()
    scripted_lm.add(
        "blind",
        [
            step("try", "try:\n    notebook('label')\nexcept NameError as e:\n    print('no notebook:', e)"),
            step("d", "SUBMIT(answer='x')"),
        ],
    )
    run = py.ok("%%fleet\nblind")
    assert "no notebook:" in run.text()
    first = _text(scripted_lm.root_requests()[0])
    assert "label" not in first and "hello previews" not in first and "notebook(" not in first


@pytest.mark.slow
def test_the_last_error_is_in_the_prompt(py: PythonKernel, scripted_lm) -> None:
    failed = py.run("values = [1, 2]\nvalues[7]")
    assert failed.reply["content"]["status"] == "error"
    scripted_lm.add("fix", [step("done", "SUBMIT(answer='index 7 is past the end')")])
    py.ok("%%fleet\nfix the error above")
    first = _text(scripted_lm.root_requests()[0])
    assert "The last cell failed" in first and "IndexError" in first and "values[7]" in first


@pytest.mark.slow
def test_user_tools_run_in_the_notebook_and_errors_reach_the_model(py: PythonKernel, scripted_lm) -> None:
    py.ok(
        "import threading\ncalls = []\n"
        "def area(width: int, height: int = 2) -> int:\n"
        "    '''The area of a width x height rectangle.'''\n"
        "    calls.append(threading.current_thread().name)\n    return width * height\n"
        "def boom(x):\n    '''Always fails.'''\n    raise ValueError(f'boom on {x}')\n"
        "def total(frame):\n    '''The sum of a frame's n column.'''\n    return int(frame['n'].sum())\n"
    )
    scripted_lm.add(
        "tools",
        [
            step(
                "call",
                "print('area', area(3, height=4))\n"
                "try:\n    boom(5)\nexcept Exception as e:\n    print('tool said:', type(e).__name__, e)\n"
                "import pandas as pd\nprint('total', total(pd.DataFrame({'n': [1, 2, 3]})))",
            ),
            step("done", "SUBMIT(answer='done')"),
        ],
    )
    run = py.ok("%%fleet --tools area,boom,total\ntools please")
    text = run.text()
    assert "area 12" in text and "tool said: ValueError boom on 5" in text and "total 6" in text
    assert py.value("calls") == "['MainThread']"  # the user's code ran on the kernel's own thread
    events = py.stored_events(run.result["metadata"]["fleet"]["turn_id"])
    calls = [(e.data["name"], e.type) for e in events if e.type.startswith("tool.") and "name" in e.data]
    assert calls == [("area", "tool.started"), ("boom", "tool.started"), ("total", "tool.started")]
    finished = [e.data for e in events if e.type == "tool.finished"]
    assert [f["ok"] for f in finished] == [True, False, True] and all(f["duration_ms"] >= 0 for f in finished)
    first = _text(scripted_lm.root_requests()[0])
    assert "area" in first and "The area of a width x height rectangle." in first
    # session-wide tools, listed and removed
    assert "area" in py.ok("%fleet tools add area").text()
    scripted_lm.add("again", [step("call", "print('again', area(2))"), step("done", "SUBMIT(answer='ok')")])
    assert "again 4" in py.ok("%%fleet\nagain").text()
    assert "No notebook functions" in py.ok("%fleet tools remove area").text()
    failed = py.run("%%fleet --tools nothing_here\nx")
    assert failed.reply["content"]["ename"] == "NameError"
    both = py.run("%%fleet --in area --tools area\nx")
    assert both.reply["content"]["ename"] == "UsageError"
    assert "%fleet context off|names|previews" in py.ok("%fleet help").text()


@pytest.mark.slow
def test_interrupt_stops_a_user_tool_in_flight_and_the_turn(start_python, scripted_lm) -> None:
    py = start_python()
    py.ok(
        "import time\ndef slow():\n    '''Takes a minute.'''\n    print('tool running', flush=True)\n    time.sleep(60)\n"
    )
    scripted_lm.add("slowly", [step("call", "slow()")])
    msg_id = py.submit("%%fleet --tools slow\nslowly")
    py.wait_for_output(msg_id, "tool running")
    started = time.monotonic()
    py.km.interrupt_kernel()
    run = py.collect(msg_id, timeout=30)
    assert run.reply["content"]["ename"] == "TurnCancelled", run.reply["content"]
    assert time.monotonic() - started < 20
    assert py.value("1 + 1") == "2"
