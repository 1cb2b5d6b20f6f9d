"""The hard-link mirror of the Python install never changes the install itself, even through a linked path."""

from __future__ import annotations

import os
from pathlib import Path

from fleet_kernel.sandbox import _pyfarm


def make_venv(root: Path, base: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text(f"home = {base}/bin\ncommand = {base}/bin/python3 -m venv {root}\n")
    os.symlink(f"{base}/bin/python3", root / "bin" / "python3")
    return root


def test_a_venv_reached_through_a_link_is_mirrored_not_rewritten(tmp_path: Path) -> None:
    base = tmp_path / "base"
    (base / "bin").mkdir(parents=True)
    real = make_venv(tmp_path / "real-venv", base)
    linked = tmp_path / "linked-venv"
    os.symlink(real, linked)  # a checkout whose .venv is a link to another one
    config = (real / "pyvenv.cfg").read_text()
    farms = tmp_path / "farms"
    farms.mkdir(mode=0o700)

    root = _pyfarm._build(farms, "key", [str(base), str(linked)])

    assert (real / "pyvenv.cfg").read_text() == config  # the install is untouched ...
    assert os.readlink(real / "bin" / "python3") == f"{base}/bin/python3"
    mirror = root / "1"
    assert not mirror.is_symlink()  # ... and the mirror is a folder of its own, rewritten to neutral paths
    assert f"{_pyfarm.NEUTRAL_ROOT}/0/bin" in (mirror / "pyvenv.cfg").read_text()
    assert os.readlink(mirror / "bin" / "python3") == f"{_pyfarm.NEUTRAL_ROOT}/0/bin/python3"
