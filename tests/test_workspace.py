"""Tests for fleet_kernel.workspace: layout, attachments without overwrite, links never followed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fleet_kernel import safe_files, workspace
from fleet_kernel.workspace import Workspace


def test_layout_and_manifest(tmp_path: Path) -> None:
    ws = Workspace.for_session(tmp_path, "ses_1")
    assert (ws.root / "memory" / "MEMORIES.md").read_text().startswith("# Memories")
    ws.add_file("notes.txt", b"hello")
    manifest = ws.manifest()
    assert "files/notes.txt  (5 bytes, text/plain)" in manifest and "memory/MEMORIES.md" in manifest


def test_attachments_never_overwrite_a_different_file(tmp_path: Path) -> None:
    ws = Workspace.for_session(tmp_path, "ses_1")
    assert ws.add_file("../../report.csv", b"a") == "files/report.csv"
    assert ws.add_file("report.csv", b"a") == "files/report.csv"  # same bytes: same file
    assert ws.add_file("report.csv", b"b") == "files/report-2.csv"
    assert (ws.root / "files" / "report.csv").read_bytes() == b"a"


def test_paths_cannot_escape(tmp_path: Path) -> None:
    ws = Workspace.for_session(tmp_path, "ses_1")
    assert ws.resolve("/files/a.txt") == (ws.root / "files" / "a.txt").resolve()  # absolute = workspace-relative
    for bad in ("../ses_2", "files/../../x", "/../../etc/passwd"):
        with pytest.raises(ValueError):
            ws.resolve(bad)


def test_links_planted_by_code_are_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_text("TOPSECRET")
    os.chmod(secret / "key.txt", 0o600)
    ws = Workspace.for_session(tmp_path / "workspaces", "ses_1")
    (ws.root / "memory" / "MEMORIES.md").unlink()
    os.symlink(secret / "key.txt", ws.root / "memory" / "MEMORIES.md")
    os.rmdir(ws.root / "artifacts")
    os.symlink(secret, ws.root / "artifacts")
    os.symlink(secret / "key.txt", ws.root / "files" / "upload.txt")

    assert ws.scan("artifacts") == {}
    Workspace.for_session(tmp_path / "workspaces", "ses_1")
    assert oct((secret / "key.txt").stat().st_mode & 0o777) == "0o600"
    assert not (ws.root / "artifacts").is_symlink() and not (ws.root / "memory" / "MEMORIES.md").is_symlink()
    assert ws.add_file("upload.txt", b"new") == "files/upload-2.txt"
    assert (secret / "key.txt").read_text() == "TOPSECRET"


def test_safe_reads_take_one_descriptor_and_follow_nothing(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_text("TOPSECRET")
    ws = Workspace.for_session(tmp_path / "workspaces", "ses_1")
    art = ws.root / "artifacts"
    (art / "ok.txt").write_text("ok")
    os.symlink(secret / "key.txt", art / "link.txt")
    os.symlink(secret, art / "dir")  # a folder swapped for a link: never listed or read through
    os.mkfifo(art / "pipe.txt")  # would block a plain open() for reading forever
    with open(art / "sparse.bin", "wb") as handle:
        handle.truncate(1 << 30)

    assert safe_files.read_path(ws.root, "artifacts/ok.txt")[0] == b"ok"
    for rel in ("artifacts/link.txt", "artifacts/dir/key.txt", "artifacts/pipe.txt", "artifacts/../ok.txt"):
        with pytest.raises(safe_files.Refused):
            safe_files.read_path(ws.root, rel)
    with pytest.raises(safe_files.Refused, match="over the"):
        safe_files.read_path(ws.root, "artifacts/sparse.bin", max_bytes=1 << 20)
    with pytest.raises(safe_files.Refused, match="stopped"):
        safe_files.read_path(ws.root, "artifacts/sparse.bin", should_stop=lambda: True)
    assert {e.path: e.kind for e in safe_files.walk(ws.root, ["artifacts"])} == {
        "dir": "symlink",
        "link.txt": "symlink",
        "ok.txt": "file",
        "pipe.txt": "other",
        "sparse.bin": "file",
    }
    assert set(ws.scan("artifacts", max_bytes=1 << 20)) == {"artifacts/ok.txt"}
    assert ws.scan("artifacts", should_stop=lambda: True) == {}
    sizes = {rel: st.st_size for rel, st in ws.files("artifacts")}
    assert sizes == {"artifacts/ok.txt": 2, "artifacts/sparse.bin": 1 << 30}


def test_names_are_shown_on_one_line(tmp_path: Path) -> None:
    ws = Workspace.for_session(tmp_path, "ses_1")
    (ws.root / "files" / os.fsdecode(b"bad-\xff.txt")).write_bytes(b"x")
    (ws.root / "files" / "a\nb\u2028c\x1b.txt").write_bytes(b"x")
    manifest = ws.manifest().splitlines()
    assert "  files/bad-\\xff.txt  (1 bytes, text/plain)" in manifest
    assert "  files/a\\nb\\u2028c\\x1b.txt  (1 bytes, text/plain)" in manifest
    assert [rel for rel, _ in ws.files("files")] == ["files/a\nb\u2028c\x1b.txt"]  # not UTF-8: left out


def test_the_listing_of_a_huge_folder_is_bounded_and_counts_what_it_leaves_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 30,000 files in one folder: the prompt's listing looks at a bounded number of them, not all, every turn.
    ws = Workspace(tmp_path / "ws").ensure()
    for n in range(30_000):
        (ws.root / "files" / f"f{n:05d}.txt").write_bytes(b"x")
    looked_at: list[int] = []
    real_list_dir = safe_files.list_dir

    def counting(fd: int, **options: Any) -> list[tuple[str, os.stat_result]]:
        found = real_list_dir(fd, **options)
        looked_at.append(len(found))
        return found

    monkeypatch.setattr(safe_files, "list_dir", counting)
    lines = ws.manifest().splitlines()
    assert sum(looked_at) <= 2 * workspace.LISTING_VISITS  # files/ and artifacts/, each within the budget
    assert sum(line.startswith("  files/f") for line in lines) == 50
    assert any(f"and more than {workspace.LISTING_VISITS - 50:,} more files" in line for line in lines), lines


def test_the_listing_says_how_many_files_it_left_out(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws").ensure()
    for n in range(1_000):
        (ws.root / "files" / f"f{n:04d}.txt").write_bytes(b"x")
    lines = ws.manifest().splitlines()
    assert sum(line.startswith("  files/f") for line in lines) == 50
    assert any("and 950 more files" in line for line in lines), lines


def test_a_folder_swapped_for_a_link_between_its_listing_and_its_opening_is_not_walked_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the API's tree and the artifact scan meet when code swaps folders while they run, made
    certain: right after ``artifacts`` is listed (``d`` a folder), ``d`` becomes a link to a host folder."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_text("TOPSECRET")
    ws = Workspace.for_session(tmp_path / "workspaces", "ses_1")
    folder = ws.root / "artifacts" / "d"
    (folder / "inner").mkdir(parents=True)
    listed = safe_files.list_dir

    def list_then_swap(fd: int, **kwargs: Any) -> list[tuple[str, os.stat_result]]:
        found = listed(fd, **kwargs)
        if folder.is_dir() and not folder.is_symlink():
            folder.rename(folder.with_name("d.real"))
            folder.symlink_to(secret)
        return found

    monkeypatch.setattr(safe_files, "list_dir", list_then_swap)
    walked = {e.path for e in safe_files.walk(ws.root, ["artifacts"])}
    assert "d" in walked and not any(path.startswith("d/") for path in walked), walked
