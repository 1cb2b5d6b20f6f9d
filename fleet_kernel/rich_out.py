"""Rich values back from a ``%%fleet`` turn: ``--out NAME:df|arr|fig|path``.

The turn's code saves the value under ``/workspace/artifacts/`` in a format that carries data only
(Parquet for a table, ``.npy`` without pickle for an array, PNG for an image, any file for ``path``),
and the kernel reads it back after the turn, checking it on the way: a file the turn did not write, a
pickled array, anything that is not what was asked for, is refused with an error that says what can
come back. Nothing is ever unpickled. pandas, NumPy, pyarrow and PIL are imported only when used.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

KINDS = {
    "df": "a pandas DataFrame (saved as Parquet)",
    "arr": "a NumPy array (saved as .npy, without pickle)",
    "fig": "an image (saved as PNG)",
    "path": "a file saved under artifacts/ (its path)",
}
WHAT_COMES_BACK = "--out NAME brings back the answer text (or, with --schema, the structured result); " + "; ".join(
    f"--out NAME:{kind} {what}" for kind, what in KINDS.items()
)
_EXT = {"df": "parquet", "arr": "npy", "fig": "png"}


class Refused(Exception):
    """The saved value cannot come back as asked; the message says why and what can."""


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


@dataclass
class RichOut:
    """One ``--out NAME:KIND``: what the model is asked to save, and how the kernel takes it back."""

    name: str
    kind: str
    before: tuple[int, int, int] | None = None  # the file as it was before the turn (a turn must write it)

    @property
    def file(self) -> str:
        """Where the value is saved, relative to ``/workspace`` (none for ``path``: the answer names it)."""
        return f"artifacts/{self.name}.{_EXT[self.kind]}"

    def ask(self) -> str:
        """The words added to the task so the model saves the value where the kernel reads it."""
        target = f"/workspace/{self.file}" if self.kind != "path" else ""
        how = {
            "df": f"as a pandas DataFrame: save it with `value.to_parquet('{target}')`",
            "arr": f"as a NumPy array: save it with `numpy.save('{target}', value, allow_pickle=False)`",
            "fig": f"as an image: save it as a PNG file at `{target}` (matplotlib: `fig.savefig('{target}')`)",
            "path": "as a file: save it under /workspace/artifacts/ and SUBMIT its path (artifacts/...) as the answer",
        }[self.kind]
        return f"\n\n(The notebook takes back `{self.name}` {how}, before you SUBMIT.)"

    def note_before(self, workspace: Path | None) -> None:
        if workspace is not None and self.kind != "path":
            self.before = _stamp(workspace / self.file)

    def take(self, workspace: Path, answer: str, cap_bytes: int) -> Any:
        """The value the turn saved, checked. Raises ``Refused``."""
        rel = self._relative(answer) if self.kind == "path" else self.file
        root = workspace.resolve()
        path = (root / rel).resolve()
        if not path.is_relative_to(root / "artifacts") or not path.is_file():
            raise Refused(f"the turn saved no {rel} for --out {self.name}:{self.kind}. {WHAT_COMES_BACK}")
        if self.kind != "path" and _stamp(path) == self.before:
            raise Refused(f"the turn did not write {rel} (it is the one an earlier turn saved). {WHAT_COMES_BACK}")
        size = path.stat().st_size
        if size > cap_bytes:
            raise Refused(
                f"{rel} is {size / 1048576:,.1f} MB; the limit is {cap_bytes / 1048576:g} MB "
                "([kernel] max_input_mb in fleet.toml)"
            )
        if self.kind == "path":
            return path
        data = path.read_bytes()
        try:
            return {"df": _table, "arr": _array, "fig": _image}[self.kind](data)
        except Exception as exc:
            raise Refused(
                f"{rel} is not {KINDS[self.kind]}: {type(exc).__name__}: {str(exc)[:300]}. {WHAT_COMES_BACK}"
            ) from None

    def _relative(self, answer: str) -> str:
        text = answer.strip().strip("`'\"").strip()
        posix = PurePosixPath(text)
        if posix.is_absolute():
            posix = posix.relative_to("/workspace") if posix.is_relative_to("/workspace") else PurePosixPath("..")
        return os.fspath(posix)


def parse(spec: str | None) -> tuple[str | None, RichOut | None]:
    """``--out`` as ``(notebook name, RichOut or None)``. Raises ``ValueError`` with what can come back."""
    if spec is None:
        return None, None
    name, _, kind = spec.partition(":")
    if not name.isidentifier():
        raise ValueError(f"--out {spec!r}: {name!r} is not a Python name")
    if not kind:
        return name, None
    if kind not in KINDS:
        raise ValueError(f"--out {spec!r}: {kind!r} cannot come back. {WHAT_COMES_BACK}")
    return name, RichOut(name, kind)


def _table(data: bytes) -> Any:
    import pyarrow.parquet as pq  # noqa: PLC0415 - pyarrow only for a table. Parquet holds columns of data; no pickled objects (pyarrow >= 14)

    return pq.read_table(io.BytesIO(data)).to_pandas()


def _array(data: bytes) -> Any:
    import numpy as np  # noqa: PLC0415 - numpy only for an array

    return np.load(io.BytesIO(data), allow_pickle=False)  # an object array (a pickle) is refused here


def _image(data: bytes) -> Any:
    from PIL import Image  # noqa: PLC0415 - Pillow only for an image

    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG file")
    image = Image.open(io.BytesIO(data))
    image.load()
    image.info["png_bytes"] = data  # the bytes as saved, for the cell's display
    return image
