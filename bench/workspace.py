"""Workspace copy benchmark: the local sandbox's copy-in and copy-back of a many-file workspace, beside `cp -a`.

    .venv/bin/python bench/workspace.py [--files 100000] [--repeat 3]

Every turn on the local sandbox copies the session workspace into the sandbox's tmpfs and what changed
back out (`fleet_kernel/sandbox/_stage.py`), so a workspace of many small files costs each turn this much.
The sandbox's copy is made in a tmpfs (here `/dev/shm`), as the stage's is. `cp -a` of the same tree is
what a plain copy costs (it checks nothing: it follows no policy on links,
FIFOs, quotas or owners).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet_kernel.sandbox import _stage


def make_tree(root: Path, files: int) -> None:
    folder = root / "files" / "many"
    folder.mkdir(parents=True)
    for n in range(files):
        (folder / f"f{n}.txt").write_text("x" * 50)


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    owner = 65534 if os.geteuid() == 0 else None  # the stage hands files to the sandbox's uid when it can
    memory = "/dev/shm" if os.path.isdir("/dev/shm") else None  # the sandbox's copy lives in a tmpfs
    with (
        tempfile.TemporaryDirectory(prefix="fleet-bench-ws-") as tmp,
        tempfile.TemporaryDirectory(prefix="fleet-bench-stage-", dir=memory) as staged,
    ):
        host, stage = Path(tmp) / "host", Path(staged) / "stage"
        host.mkdir()
        make_tree(host, args.files)
        copy_in, copy_out, cp = [], [], []
        for _ in range(args.repeat):
            shutil.rmtree(stage, ignore_errors=True)
            stage.mkdir()
            snapshot: dict[str, tuple[int, int, int]] = {}

            def into(snapshot: dict[str, tuple[int, int, int]] = snapshot) -> None:
                snapshot.update(_stage.copy_in(str(host), str(stage), owner))

            copy_in.append(timed(into))
            copy_out.append(timed(lambda s=snapshot: _stage.copy_out(str(stage), str(host), s)))
            shutil.rmtree(stage)
            cp.append(timed(lambda: subprocess.run(["cp", "-a", str(host), str(stage)], check=True)))
    print(f"\nA workspace of {args.files:,} files, median seconds of {args.repeat}\n")
    print(f"{'copy':<40} | {'seconds':>8}")
    print("-" * 51)
    for name, figures in (
        ("Fleet copy-in (host -> sandbox)", copy_in),
        ("Fleet copy-back, nothing changed", copy_out),
        ("cp -a (no policy)", cp),
    ):
        print(f"{name:<40} | {statistics.median(figures):>8.2f}")


if __name__ == "__main__":
    main()
