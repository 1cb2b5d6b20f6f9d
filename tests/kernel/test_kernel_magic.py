"""``%load_ext fleet_kernel`` in a stock python3 ipykernel, driven over ZMQ: turns next to Python cells."""

from __future__ import annotations

import os

import pytest
from kernel_harness import WIDGET_VIEW, PythonKernel, click, wait_for_state, widget_models
from scripted_lm import step


@pytest.mark.slow
def test_help_and_a_turn_with_a_dataframe_and_a_10_mb_string(py: PythonKernel, scripted_lm) -> None:
    assert "%fleet session" in py.ok("%fleet help").text()
    py.ok(
        "import pandas as pd\ndf = pd.DataFrame({'city': ['a', 'b', 'c'], 'n': [1, 2, 39]})\nbig = 'x' * 10_000_000 + 'END'"
    )
    scripted_lm.add(
        "count",
        [
            step(
                "look",
                "print('rows', len(df), 'sum', int(df['n'].sum()), type(df).__name__, flush=True)\n"
                "print('big', len(big), big[-3:])\nseen = id(big)",
            ),
            step("again", "print('sent once:', id(big) == seen)"),
            step("done", "SUBMIT(answer=f\"total {int(df['n'].sum())} and {len(big)}\")"),
        ],
    )
    run = py.ok("%%fleet --in df,big --out answer\ncount the rows")
    text = run.text()
    assert "rows 3 sum 42 DataFrame" in text and "big 10000003 END" in text
    assert "sent once: True" in text  # the same object in the second iteration: not sent again
    assert "total 42 and 10000003" in run.result["data"]["text/plain"]
    assert run.result["execution_count"] == run.reply["content"]["execution_count"]
    assert py.value("answer") == repr("total 42 and 10000003")
    # the values reached the prompt only as a preview, never whole
    prompts = [str(r) for r in scripted_lm.requests]
    assert all(len(p) < 200_000 for p in prompts)
    assert any("DataFrame" in p and "3 rows x 2 columns" in p for p in prompts)


@pytest.mark.slow
def test_streams_before_the_reply_and_later_cells_continue_the_session(py: PythonKernel, scripted_lm) -> None:
    scripted_lm.add("first", [step("say", "print('first line', flush=True)"), step("done", "SUBMIT(answer='one')")])
    msg_id = py.submit("%%fleet\nfirst task")
    seen = py.wait_for_output(msg_id, "first line")
    assert not any(m["msg_type"] == "execute_result" for m in seen)
    run = py.collect(msg_id, timeout=90)
    assert run.reply["content"]["status"] == "ok"
    assert run.result["metadata"]["fleet"]["status"] == "completed"
    session = run.result["metadata"]["fleet"]["session_id"]
    scripted_lm.add("second", [step("done", "SUBMIT(answer='two')")])
    again = py.ok("%%fleet\nsecond task")
    assert again.result["metadata"]["fleet"]["session_id"] == session
    assert session in py.ok("%fleet session").text()
    py.ok("%fleet session new fresh")
    scripted_lm.add("third", [step("done", "SUBMIT(answer='three')")])
    third = py.ok("%%fleet\nthird task")
    assert third.result["metadata"]["fleet"]["session_id"] != session


@pytest.mark.slow
def test_interrupt_cancels_the_turn_and_python_lives_on(start_python, scripted_lm) -> None:
    py = start_python()
    py.ok("kept = 41")
    scripted_lm.add("sleepy", [step("wait", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")])
    msg_id = py.submit("%%fleet --out never\na sleepy task")
    py.wait_for_output(msg_id, "sleeping")
    py.km.interrupt_kernel()
    run = py.collect(msg_id, timeout=30)
    content = run.reply["content"]
    assert content["status"] == "error" and content["ename"] == "TurnCancelled", content
    assert run.result["metadata"]["fleet"]["status"] == "cancelled"
    assert py.km.is_alive()
    assert py.value("kept + 1") == "42"
    assert py.value("'never' in globals()") == "False"
    scripted_lm.add("again", [step("done", "SUBMIT(answer='back again')")])
    assert "back again" in py.ok("%%fleet\nagain please").result["data"]["text/plain"]


@pytest.mark.slow
def test_an_interrupt_the_os_hands_to_another_thread_still_cancels_the_turn(
    start_python, scripted_lm, tmp_path
) -> None:
    py = start_python()
    # The kernel's SIGINT goes to the process and the OS may give it to any thread that does not block
    # it; Python runs the handler on the main thread only, next time that thread runs Python code.
    go = tmp_path / "go"
    py.ok(
        "import os, signal, threading, time\n"
        "bystander = threading.Thread(target=time.sleep, args=(120,), daemon=True)\n"
        "bystander.start()\n"
        "def deliver():\n"
        f"    while not os.path.exists({str(go)!r}):\n"
        "        time.sleep(0.05)\n"
        "    signal.pthread_kill(bystander.ident, signal.SIGINT)\n"
        "threading.Thread(target=deliver, daemon=True).start()"
    )
    scripted_lm.add("sleepy", [step("wait", "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")])
    msg_id = py.submit("%%fleet\na sleepy task")
    py.wait_for_output(msg_id, "sleeping")
    go.touch()
    run = py.collect(msg_id, timeout=30)
    assert run.reply["content"]["ename"] == "TurnCancelled", run.reply["content"]
    assert run.result["metadata"]["fleet"]["status"] == "cancelled"


@pytest.mark.slow
def test_bad_options_and_unknown_names_say_what_to_do(py: PythonKernel, scripted_lm) -> None:
    run = py.run("%%fleet --in nowhere\ntask")
    assert run.reply["content"]["ename"] == "NameError" and "nowhere" in run.reply["content"]["evalue"]
    run = py.run("%%fleet --frobnicate\ntask")
    assert run.reply["content"]["ename"] == "UsageError"
    py.ok("import threading\nlock = threading.Lock()")
    run = py.run("%%fleet --in lock\ntask")
    assert run.reply["content"]["ename"] == "ValidationError" and "lock is a lock" in run.reply["content"]["evalue"], (
        run.reply["content"]
    )
    assert "Traceback" not in run.text()
    assert scripted_lm.requests == []


def test_model_and_dash_dash_model_keep_to_the_configured_provider(py: PythonKernel, scripted_lm) -> None:
    """``%fleet model`` and ``%%fleet --model`` ask the engine, as PATCH does: no key goes to ollama."""
    for code in ("%fleet model ollama/m", "%%fleet --model llamafile/m\ntask"):
        run = py.run(code)
        assert run.reply["content"]["ename"] == "ValidationError", run.reply["content"]
        assert "[lm] allowed_models" in run.reply["content"]["evalue"]
    assert "openai/scripted" in py.ok("%fleet model").text()
    assert "openai/other" in py.ok("%fleet model openai/other").text()
    assert scripted_lm.requests == []


@pytest.mark.slow
def test_the_api_sees_the_notebook_session_and_its_events(py: PythonKernel, scripted_lm) -> None:
    import httpx
    from live_api import LiveServer, iter_frames

    from fleet_kernel.config import load_settings

    settings = load_settings(py.env)

    scripted_lm.add("visible", [step("say", "print('hello api', flush=True)"), step("done", "SUBMIT(answer='seen')")])
    run = py.ok("%%fleet\na visible task")
    meta = run.result["metadata"]["fleet"]
    with LiveServer(settings) as api:
        sessions = httpx.get(f"{api.url}/api/sessions", timeout=10).json()["sessions"]
        assert meta["session_id"] in [s["session_id"] for s in sessions]
        turns = httpx.get(f"{api.url}/api/sessions/{meta['session_id']}/turns", timeout=10).json()["turns"]
        assert [(t["task"], t["status"], t["answer"]) for t in turns] == [("a visible task", "completed", "seen")]
        url = f"{api.url}/api/sessions/{meta['session_id']}/turns/{meta['turn_id']}/events"
        with httpx.stream("GET", url, timeout=10) as response:
            types = [f.event for f in iter_frames(response) if f.event]
        assert types[0] == "turn.started" and types[-1] == "turn.completed" and "output" in types


@pytest.mark.slow
def test_schema_stores_the_validated_value(py: PythonKernel, scripted_lm) -> None:
    py.ok(
        "from pydantic import BaseModel\nclass Total(BaseModel):\n    total: int\n    label: str\n"
        "schema = {'type': 'object', 'properties': {'total': {'type': 'integer'}}, 'required': ['total']}"
    )
    scripted_lm.add("typed", [step("done", "SUBMIT(answer='done', result={'total': 7, 'label': 'seven'})")])
    py.ok("%%fleet --schema Total --out typed\na typed task")
    assert py.value("type(typed).__name__, typed.total, typed.label") == "('Total', 7, 'seven')"
    scripted_lm.add("plain dict", [step("done", "SUBMIT(answer='done', result={'total': 8})")])
    py.ok("%%fleet --schema schema --out as_dict\na plain dict task")
    assert py.value("as_dict") == "{'total': 8}"


@pytest.mark.slow
def test_nbclient_runs_a_notebook_of_python_and_fleet_cells(fleet_env: dict[str, str], scripted_lm, tmp_path) -> None:
    import nbformat
    from nbclient import NotebookClient

    scripted_lm.add("mean", [step("done", "SUBMIT(answer=str(sum(values) / len(values)))")])
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("%load_ext fleet_kernel"),
            nbformat.v4.new_code_cell("values = [1, 2, 3, 6]"),
            nbformat.v4.new_code_cell("%%fleet --in values --out mean\nthe mean of values"),
            nbformat.v4.new_code_cell("print('twice', float(mean) * 2)"),
        ]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with pytest.MonkeyPatch.context() as env:
        for key, value in fleet_env.items():
            env.setenv(key, value)
        NotebookClient(
            nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()
    turn = nb.cells[2].outputs
    assert turn[-1]["output_type"] == "execute_result" and "3.0" in turn[-1]["data"]["text/plain"]
    assert not any(o["output_type"] == "error" for o in turn)
    assert nb.cells[3].outputs[0]["text"] == "twice 6.0\n"


@pytest.mark.slow
def test_a_100_mb_string_is_handled(py: PythonKernel, scripted_lm) -> None:
    py.ok("huge = 'ab' * 50_000_000")
    scripted_lm.add("huge", [step("done", "SUBMIT(answer=f'{len(huge)} {huge.count(\"b\")}')")])
    run = py.ok("%%fleet --in huge --out counted\nmeasure huge", timeout=180)
    assert py.value("counted") == repr("100000000 50000000"), run.text()


@pytest.mark.slow
def test_inputs_above_the_cap_are_refused_with_the_setting_to_change(fleet_env, scripted_lm, tmp_path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text("[kernel]\nmax_input_mb = 1\n")
    kernel = PythonKernel({**fleet_env, "FLEET_CONFIG": str(config)}, load=False)
    try:
        kernel.ok("%load_ext fleet_kernel\nnotes = 'n' * 2_000_000")
        run = kernel.run("%%fleet --in notes --out nothing\nread the notes")
        content = run.reply["content"]
        assert content["ename"] == "InputTooLarge" and "max_input_mb" in content["evalue"], content
        assert kernel.value("'nothing' in globals()") == "False"
        assert scripted_lm.requests == []
    finally:
        kernel.close()


@pytest.mark.slow
def test_the_python_and_fleet_notebook_runs_offline_on_its_cassette(fleet_home, tmp_path, monkeypatch) -> None:
    import sys
    from pathlib import Path

    pytest.importorskip("matplotlib")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "notebooks"))
    for key in [k for k in os.environ if k.startswith("FLEET_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("FLEET_HOME", str(fleet_home))
    import python_and_fleet_script as script

    nb = script.run(tmp_path / "out")
    turn = nb.cells[7].outputs
    assert turn[-1]["output_type"] == "execute_result" and "west** grew fastest" in turn[-1]["data"]["text/plain"]
    assert [o["output_type"] for o in nb.cells[9].outputs] == ["display_data"]
    assert "image/png" in nb.cells[9].outputs[0]["data"]
    sys.modules.pop("python_and_fleet_script", None)


def test_the_extension_loads_from_the_ipython_config(fleet_env, scripted_lm, tmp_path) -> None:
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text('c.InteractiveShellApp.extensions = ["fleet_kernel"]\n')
    kernel = PythonKernel({**fleet_env, "IPYTHONDIR": str(tmp_path / "ipython")}, load=False)
    try:
        assert "%fleet session" in kernel.ok("%fleet help").text()
    finally:
        kernel.close()


@pytest.mark.slow
def test_terminal_ipython_prints_the_turn_as_text(fleet_env, scripted_lm, tmp_path) -> None:
    import subprocess
    import sys

    scripted_lm.add(
        "terminal", [step("say", "print('from the sandbox')"), step("done", "SUBMIT(answer='in a terminal')")]
    )
    code = (
        "ip = get_ipython()\nip.run_line_magic('load_ext', 'fleet_kernel')\n"
        "ip.run_cell_magic('fleet', '--out said', 'a terminal task')\nprint('said:', said)"
    )
    done = subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "--colors=nocolor", "-c", code],
        env={**os.environ, **fleet_env, "IPYTHONDIR": str(tmp_path / "ipython")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "from the sandbox" in done.stdout and "said: in a terminal" in done.stdout, done.stdout


def test_the_feedback_bar_marks_the_answer_in_a_python_kernel(py: PythonKernel, scripted_lm) -> None:
    scripted_lm.add("capital of Chad", [step("Say it.", 'SUBMIT(answer="N\'Djamena")')])
    # JupyterLab's notebook sends deletedCells: the magic shows widgets, as to a widget frontend
    content = {"code": "%%fleet\ncapital of Chad", "silent": False, "store_history": True, "user_expressions": {}}
    msg = py.kc.session.msg("execute_request", content, metadata={"deletedCells": []})
    py.kc.shell_channel.send(msg)
    run = py.collect(msg["header"]["msg_id"], timeout=90)
    assert run.reply["content"]["status"] == "ok", run.text()
    end = run.types.index("execute_result")
    buttons = [cid for cid, name in widget_models(run.messages[end:]).items() if name == "ButtonModel"]
    assert len(buttons) == 2 and WIDGET_VIEW in run.messages[-1]["content"]["data"]
    # the click arrives on IPython's thread; the mark is kept on Fleet's own loop
    click(py, buttons[0])
    wait_for_state(py, "marked good")
    assert "marked good" in py.ok("%fleet feedback").text()
