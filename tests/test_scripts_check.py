"""What README.md and docs/ name exists and runs: each script's ``--check``, the bench scripts, every path.

``--check`` runs a script as far as it can without installing, building or downloading: the commands it would
run resolve (``fleet serve --help``, the model packages' imports, the tools of a first build), so a renamed
command fails here and in CI (``.ci/run`` runs the same checks after the set-up).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = "|".join(re.escape(p.name) for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci")
REPO_PATH = re.compile(rf"(?<![\w/.$~-])((?:{TOP})/[\w./*{{}}-]*[\w*}}])")
OUTSIDE = re.compile(r"(?<![\w/.$~-])(\.\./[\w./-]+)")
LINK = re.compile(r"\]\(([^)#\s]+)")
DOC_NAME = re.compile(r"(?<![\w/.-])([A-Z][A-Z_]+\.md)\b")
NOT_IN_THE_REPOSITORY = {"MEMORIES.md"}  # the session workspace's memory mirror (memory/MEMORIES.md)


def _named(pattern: str) -> list[str]:
    return sorted({m for doc in DOCS for m in re.findall(pattern, doc.read_text(encoding="utf-8"))})


SCRIPTS = _named(r"scripts/([\w-]+\.sh)")
BENCH = _named(r"bench/(\w+\.py)")


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """Run with this test's virtual environment as the scripts' ``FLEET_VENV`` and this checkout's code."""
    environment = {**os.environ, "FLEET_VENV": sys.prefix, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(args, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)


def test_the_docs_name_the_scripts() -> None:
    assert {"demo.sh", "test.sh", "setup.sh", "real-model.sh", "check.sh"} <= set(SCRIPTS), SCRIPTS


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_each_named_script_passes_its_check(script: str) -> None:
    done = _run(["bash", f"scripts/{script}", "--check"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{script} --check: all checks passed" in done.stdout
    assert "FAILED" not in done.stdout
    if script == "real-model.sh":  # it names the serve command it checks, and downloads nothing
        assert "ok      fleet serve --help" in done.stdout
        assert "Installing the model" not in done.stdout and "Building llama.cpp" not in done.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_named_script_says_how_to_use_it_and_starts_nothing(script: str) -> None:
    done = _run(["bash", f"scripts/{script}", "--help"])
    assert done.returncode == 0 and "--check" in done.stdout, done.stdout + done.stderr
    assert "==>" not in done.stdout  # no step started


def test_a_check_fails_and_says_what_when_a_command_is_missing(tmp_path: Path) -> None:
    done = _run(["bash", "scripts/real-model.sh", "--check"], FLEET_VENV=str(tmp_path / "no-venv"))
    assert done.returncode == 1
    assert "FAILED  fleet serve --help" in done.stdout
    assert "real-model.sh --check: " in done.stderr and "failed" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("bench", BENCH)
def test_each_named_bench_script_starts(bench: str) -> None:
    done = _run([sys.executable, f"bench/{bench}", "--help"])
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


def test_every_path_the_docs_mention_exists() -> None:
    """A file the README or docs name (``docs/api.md``, ``scripts/demo.sh``, a Markdown link) is in the
    repository; nothing points outside it (``../shared/...``)."""
    missing = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for path in REPO_PATH.findall(text):
            path = path.rstrip(".")
            if "{" in path:  # a placeholder (docs/{name}.md)
                continue
            if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                missing.append(f"{doc.name}: {path}")
        missing += [f"{doc.name}: {path} (outside the repository)" for path in OUTSIDE.findall(text)]
        for name in set(DOC_NAME.findall(text)) - NOT_IN_THE_REPOSITORY:
            if not list(ROOT.glob(f"**/{name}")):
                missing.append(f"{doc.name}: {name}")
        for target in LINK.findall(text):
            if "://" not in target and not target.startswith("mailto:") and not (doc.parent / target).exists():
                missing.append(f"{doc.name}: link {target}")
    assert missing == [], missing
