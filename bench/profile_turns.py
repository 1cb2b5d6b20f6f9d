"""Profile driver: Fleet turns in-process (``--api``: through a ``fleet serve``), for py-spy.

    py-spy record --format raw -o turns.txt -- .venv/bin/python bench/profile_turns.py --turns 20
    .venv/bin/python bench/profile_turns.py --top turns.txt     # top frames by own and inclusive samples

With ``--api`` the server's pid is printed so ``py-spy record --pid`` can sample it while the turns run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def top(path: str, count: int = 25) -> None:
    """Print the frames with most own (leaf) samples and most inclusive samples in a py-spy raw file."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = [f for f in stack.split(";") if f and not f.startswith(("thread ", "process "))]
        if not frames:
            continue
        samples = int(n)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    for title, counter in (("own", own), ("inclusive", inclusive)):
        print(f"\ntop {count} by {title} samples (of {total})")
        for frame, samples in counter.most_common(count):
            print(f"{100 * samples / total:6.1f}%  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--api", action="store_true")
    parser.add_argument("--concurrent", type=int, default=1, help="with --api: turns at once, each in its session")
    parser.add_argument("--top", metavar="RAW_FILE")
    args = parser.parse_args()
    if args.top:
        top(args.top)
        return
    from engine import MODEL, Api, InProcess, ScriptedLM

    home = tempfile.mkdtemp(prefix="fleet-profile-")
    with ScriptedLM() as server:
        env = {**os.environ, "FLEET_HOME": home, **server.env(), "FLEET_LM_MODEL": MODEL}
        if args.api:
            api = Api(env, server)
            print(f"fleet serve pid {api.process.pid}", flush=True)
            try:
                for i in range(0, args.turns, args.concurrent):
                    api.run(
                        lambda c, i=i: asyncio.gather(
                            *(api.turn(c, args.iterations, f"profile {i + k}") for k in range(args.concurrent))
                        )
                    )
            finally:
                api.close()
        else:
            inproc = InProcess(env, server)
            try:
                for _ in range(args.turns):
                    inproc.turn(args.iterations)
            finally:
                inproc.close()


if __name__ == "__main__":
    main()
