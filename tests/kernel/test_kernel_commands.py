"""Tests for %fleet commands through a real kernel: sessions, attachments, export, the API sidecar, install."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import nbformat
import pytest
from kernel_harness import Kernel
from scripted_lm import step


@pytest.mark.slow
def test_attach_puts_the_file_in_the_workspace_for_the_next_turn(kernel: Kernel, scripted_lm, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("the secret word is albatross\n")
    run = kernel.run(f"%fleet attach {notes}")
    assert "Attached notes.txt as /workspace/files/notes.txt" in run.text()
    read = "print(open('files/notes.txt').read())"
    scripted_lm.add("secret", [step("read it", read), step("done", "SUBMIT(answer='albatross')")])
    turn = kernel.run("what is the secret word?")
    assert "the secret word is albatross" in "".join(c["text"] for c in turn.of("stream"))
    workspace = kernel.home / "workspaces" / kernel.session_id()
    assert (workspace / "files" / "notes.txt").read_text() == "the secret word is albatross\n"
    other = tmp_path / "other" / "notes.txt"
    other.parent.mkdir()
    other.write_text("a different file of the same name\n")
    again = kernel.run(f"%fleet attach {other}").text()
    assert "Attached notes.txt as /workspace/files/notes-2.txt" in again and "already held another notes.txt" in again
    assert (workspace / "files" / "notes.txt").read_text() == "the secret word is albatross\n"


@pytest.mark.slow
def test_export_writes_the_session_as_a_notebook(kernel: Kernel, scripted_lm, tmp_path: Path) -> None:
    scripted_lm.add("first", [step("done", "SUBMIT(answer='one')")])
    kernel.run("the first task")
    target = tmp_path / "out" / "session.ipynb"
    run = kernel.run(f"%fleet export {target}")
    assert "Wrote 1 turns" in run.text()
    nb = nbformat.read(target, as_version=4)
    title, turn = nb.cells
    assert nb.metadata.kernelspec.name == "fleet" and turn.source == "the first task"
    assert title.cell_type == "markdown" and title.source.startswith("# the first task\n")
    assert "scripted" in title.source and "created 20" in title.source  # the model and the dates


@pytest.mark.slow
def test_export_names_the_file_after_the_session(kernel: Kernel, scripted_lm, tmp_path: Path) -> None:
    scripted_lm.add("Ünïcode", [step("done", "SUBMIT(answer='ok')")])
    kernel.run("Ünïcode: a title / with *punctuation*!")
    session_id = kernel.run("%fleet session").text().split()[1].rstrip(":")
    run = kernel.run(f"%fleet export {tmp_path}")
    short = session_id.partition("_")[2][:8]
    written = tmp_path / f"fleet-unicode-a-title-with-punctuation-{short}.ipynb"
    assert str(written) in run.text() and written.exists()


@pytest.mark.slow
def test_session_use_continues_a_session_with_its_history(start_kernel, scripted_lm) -> None:
    first = start_kernel()
    scripted_lm.add("colour", [step("done", "SUBMIT(answer='my favourite colour is teal')")])
    first.run("remember my favourite colour")
    session_id = first.run("%fleet session").text().split()[1].rstrip(":")
    second = start_kernel()
    assert "Using session" in second.run(f"%fleet session use {session_id}").text()
    scripted_lm.add("which colour", [step("done", "SUBMIT(answer='teal')")])
    run = second.run("which colour did I say?")
    assert run.result["metadata"]["fleet"]["session_id"] == session_id
    prompt = json.dumps(scripted_lm.requests[-1])
    assert "my favourite colour is teal" in prompt  # the earlier turn fed this one
    listing = second.run("%fleet session list").text()
    assert session_id in listing and "remember my favourite colour" in listing


@pytest.mark.slow
def test_serve_starts_the_api_on_the_kernel_store(start_kernel, scripted_lm) -> None:
    kernel = start_kernel()  # closed by this test
    kernel.graceful = True
    scripted_lm.add("hello", [step("done", "SUBMIT(answer='hi')")])
    kernel.run("say hello to the API")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = kernel.run(f"%fleet serve {port}", timeout=60)
    assert run.reply["content"]["status"] == "ok", run.text()
    pid = int(re.search(r"pid (\d+)", run.text()).group(1))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/sessions", timeout=5) as response:
            sessions = json.load(response)["sessions"]
        assert [s["title"] for s in sessions] == ["say hello to the API"]
        kernel.close()  # the API keeps serving the store after the kernel exits
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=5) as response:
            assert response.status == 200
    finally:
        os.kill(pid, signal.SIGTERM)


def test_model_sandbox_and_output_commands(kernel: Kernel) -> None:
    assert "openai/scripted" in kernel.run("%fleet model").text()
    assert "replay/x.json" in kernel.run("%fleet model replay/x.json").text()
    assert "unknown sandbox" in kernel.run("%fleet sandbox nowhere").reply["content"]["evalue"]
    assert "text streams (text)" in kernel.run("%fleet output text").text()
    help_run = kernel.run("%fleet help")
    (display,) = help_run.of("stream")  # text mode now: commands answer as plain text
    assert "%fleet export" in display["text"]


@pytest.mark.slow
def test_help_has_a_header_per_column_and_status_names_the_sandbox_turns_use(kernel: Kernel, scripted_lm) -> None:
    (help_md,) = [c["data"]["text/markdown"] for c in kernel.run("%fleet help").of("display_data")]
    header = next(line for line in help_md.splitlines() if line.startswith("| "))
    assert [cell.strip() for cell in header.strip("|").split("|")] == ["command", "what it does"]
    scripted_lm.add("where", [step("done", "SUBMIT(answer='here')")])
    footer = kernel.run("where does code run?").result["data"]["text/plain"].splitlines()[0]
    sandbox = re.search(r"sandbox (\S+)", footer).group(1)
    assert f"sandbox: {sandbox} (the default here)" in kernel.run("%fleet status").text()


def test_the_kernel_module_imports_nothing_heavy() -> None:
    heavy = ("dspy", "litellm", "sqlalchemy", "pydantic")
    code = f"import sys, fleet_kernel.kernel.kernel\nprint(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_fleet_kernel_install_writes_a_spec_jupyter_reads(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from jupyter_client.kernelspec import KernelSpecManager

    from fleet_kernel.cli import main

    result = CliRunner().invoke(main, ["kernel", "install", "--prefix", str(tmp_path)])
    assert result.exit_code == 0, result.output
    manager = KernelSpecManager(kernel_dirs=[str(tmp_path / "share" / "jupyter" / "kernels")])
    spec = manager.get_kernel_spec("fleet")
    assert spec.display_name == "Fleet RLM" and spec.language == "markdown" and spec.interrupt_mode == "message"
    assert spec.argv[:4] == [sys.executable, "-Xfrozen_modules=off", "-m", "fleet_kernel"]
    assert (Path(spec.resource_dir) / "logo-64x64.png").is_file()


@pytest.mark.slow
def test_usage_shows_the_last_turn_against_its_budget(start_kernel, scripted_lm, tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text("[limits]\nmax_turn_tokens = 500000\n")
    kernel = start_kernel(FLEET_CONFIG=str(config))
    scripted_lm.add("hello", [step("done", "SUBMIT(answer='hi')")])
    kernel.run("say hello")
    text = kernel.run("%fleet usage").text()
    assert re.search(r"last turn: [\d,]+ tokens of 500,000 \(limits\.max_turn_tokens\), \$0\.0000", text), text


@pytest.mark.slow
def test_skill_commands_choose_the_cards_of_the_next_turns(kernel: Kernel, scripted_lm) -> None:
    card = kernel.home / "skills" / "harbour-notes"
    card.mkdir(parents=True)
    try:
        check_skill_commands(kernel, scripted_lm, card)
    finally:
        shutil.rmtree(card)  # the kernel's next tests see no card of this test's


def check_skill_commands(kernel: Kernel, scripted_lm, card: Path) -> None:
    import sqlite3

    (card / "SKILL.md").write_text(
        "---\nname: harbour-notes\ndescription: Tide tables.\n---\n# Tides\n\nHigh water at noon.\n"
    )
    (card / "tides.csv").write_text("day,high\nmon,12:00\n")
    listing = kernel.run("%fleet skill list").text()
    assert "harbour-notes (home): Tide tables." in listing and "tabular-analysis (bundled)" in listing
    shown = kernel.run("%fleet skill show harbour-notes").text()
    assert "High water at noon." in shown and "Resources: tides.csv" in shown
    bad = kernel.run("%fleet skill use harbour-notes no-such-card")
    assert bad.reply["content"]["status"] == "error" and "unknown skill 'no-such-card'" in bad.text()
    assert "harbour-notes, tabular-analysis" in kernel.run("%fleet skill use harbour-notes tabular-analysis").text()
    assert "* harbour-notes" in kernel.run("%fleet skill list").text()

    def prompt_of(task: str) -> str:
        (body, *_) = [b for b in scripted_lm.requests if task in json.dumps(b)]
        return json.dumps(body)

    scripted_lm.add("tide task", [step("done", "SUBMIT(answer='noon')")])
    kernel.run("the tide task")
    assert "High water at noon." in prompt_of("the tide task") and "Load with explicit types" in prompt_of(
        "the tide task"
    )
    kernel.run("%fleet skill clear")
    scripted_lm.add("later task", [step("done", "SUBMIT(answer='ok')")])
    kernel.run("a later task")
    assert "High water at noon." not in prompt_of("a later task")
    assert "harbour-notes: Tide tables." in prompt_of("a later task")  # the catalogue is always there
    with sqlite3.connect(kernel.home / "fleet.db") as db:
        found = "SELECT data FROM events WHERE type = 'turn.started' AND session_id = ? ORDER BY ts"
        started = [json.loads(d) for (d,) in db.execute(found, (kernel.session_id(),))]
    assert [s["skills"] for s in started] == [["harbour-notes", "tabular-analysis"], []]


@pytest.mark.slow
def test_memory_commands_show_search_and_forget_what_turns_remembered(kernel: Kernel, scripted_lm) -> None:
    assert "No session yet" in kernel.run("%fleet memory").text()
    keep = "print(remember('the deploy window is Friday 18:00', kind='fact'), remember('likes terse answers'))"
    scripted_lm.add("keep two things", [step("keep", keep), step("done", "SUBMIT(answer='kept')")])
    kernel.run("keep two things")
    listed = kernel.run("%fleet memory").text()
    assert "the deploy window is Friday 18:00" in listed and "[fact]" in listed and "likes terse answers" in listed
    found = kernel.run("%fleet memory search deploy").text()
    assert "deploy window" in found and "terse" not in found
    memory_id = found.split()[0]
    assert f"Forgot {memory_id}" in kernel.run(f"%fleet memory forget {memory_id}").text()
    assert "No memory matches" in kernel.run("%fleet memory search deploy").text()
    assert "no memory" in kernel.run(f"%fleet memory forget {memory_id}").reply["content"]["evalue"]
    assert "usage" in kernel.run("%fleet memory forget").reply["content"]["evalue"]


@pytest.mark.slow
def test_model_command_sets_the_sessions_model(kernel: Kernel, scripted_lm) -> None:
    assert "The next turns use openai/other" in kernel.run("%fleet model openai/other").text()
    session_id = kernel.run("%fleet session").text().split()[1].rstrip(":")
    assert "Model: openai/other" in kernel.run("%fleet model").text()
    scripted_lm.add("which model", [step("done", "SUBMIT(answer='ok')")])
    kernel.run("which model runs this?")
    assert any(r.get("model") == "other" for r in scripted_lm.requests)
    assert session_id.startswith("ses_")
