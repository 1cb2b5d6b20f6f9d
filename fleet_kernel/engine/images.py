"""Images the model sees: ``--in`` images and image attachments, ``look()`` from sandbox code, and
``llm_query(prompt, images=[...])`` to the sub-model.

An image is carried as PNG or JPEG bytes (``Picture``) and reaches a model as an OpenAI ``image_url``
content part holding a ``data:`` URL, which LiteLLM passes on to every multimodal provider. Root requests
get theirs from ``ImageChatAdapter``: the turn's pinned images (its ``--in`` images and image attachments)
on every step, and an image ``look()`` asked for on the next step only. Bytes are checked by their first
bytes, never by a name or a claimed type, and bounded in size, so nothing else is ever sent as an image.
"""

from __future__ import annotations

import base64
import binascii
import io
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from fleet_kernel.engine.reask import ReaskingChatAdapter
from fleet_kernel.errors import ValidationError

MAX_IMAGE_BYTES = 5 * 1024 * 1024
"""The largest image sent to a model (providers refuse larger ones; a plot is ~100 KB)."""
MAX_IMAGES = 8
"""At most this many images in one request (``llm_query``'s, or a root step's)."""
WHAT_IMAGES_ARE = (
    "an image is PNG or JPEG bytes (at most 5 MB), a PIL image, or a uint8 NumPy array HxW, HxWx3 or HxWx4"
)


@dataclass(frozen=True)
class Picture:
    """One image: its MIME type (``image/png`` or ``image/jpeg``) and bytes."""

    mime: str
    data: bytes

    def part(self) -> dict[str, Any]:
        """The OpenAI chat content part that shows it to a model."""
        url = f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"
        return {"type": "image_url", "image_url": {"url": url}}

    def describe(self) -> str:
        return f"{self.mime.split('/')[1].upper()}, {len(self.data):,} bytes"


def sniff(data: bytes) -> str | None:
    """The image type of ``data`` by its signature, or None for anything but PNG and JPEG."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    return None


def from_bytes(data: bytes, where: str) -> Picture:
    """``data`` as a ``Picture``. Raises ``ValidationError`` (naming ``where``) for anything else."""
    mime = sniff(data)
    if mime is None:
        raise ValidationError(f"{where} is not a PNG or JPEG image: {WHAT_IMAGES_ARE}")
    if len(data) > MAX_IMAGE_BYTES:
        raise ValidationError(f"{where} is {len(data) / 1048576:.1f} MB: {WHAT_IMAGES_ARE}")
    return Picture(mime, bytes(data))


def from_value(value: Any, where: str) -> Picture | None:
    """A notebook value as a ``Picture``: PNG/JPEG bytes, a PIL image, an image-shaped uint8 array; else None.

    PIL and NumPy are only looked at when the notebook already imported them.
    """
    if isinstance(value, (bytes, bytearray)):
        return from_bytes(bytes(value), where) if sniff(bytes(value[:8])) else None
    pil = sys.modules.get("PIL.Image")
    if pil is not None and isinstance(value, pil.Image):
        return from_bytes(_png(value), where)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray) and _image_shaped(value):
        from PIL import Image  # noqa: PLC0415 - a dependency of Fleet's; loaded only for an array that is an image

        return from_bytes(_png(Image.fromarray(value)), where)
    return None


def _image_shaped(array: Any) -> bool:
    shape = array.shape
    return str(array.dtype) == "uint8" and (len(shape) == 2 or (len(shape) == 3 and shape[2] in (3, 4)))


def _png(image: Any) -> bytes:
    if image.mode not in ("RGB", "RGBA", "L", "LA", "P", "1"):
        image = image.convert("RGBA")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def from_workspace(path: str, workspace: Path) -> Picture:
    """The image at ``path`` (``artifacts/plot.png`` or ``/workspace/artifacts/plot.png``) in the workspace.

    Raises ``ValidationError`` for a path outside the workspace, a missing file or one that is not an image.
    """
    posix = PurePosixPath(path)
    if posix.is_absolute():
        try:
            posix = posix.relative_to("/workspace")
        except ValueError:
            raise ValidationError(f"{path} is not under /workspace: give a path such as artifacts/plot.png") from None
    root = workspace.resolve()
    target = (root / posix).resolve()
    if root not in target.parents or not target.is_file():
        raise ValidationError(f"{path}: no such file under /workspace (save the image under artifacts/ first)")
    size = target.stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise ValidationError(f"{path} is {size / 1048576:.1f} MB: {WHAT_IMAGES_ARE}")
    return from_bytes(target.read_bytes(), path)


def data_url_name(url: str) -> str | None:
    """The file a ``data:`` URL came from (``;name=artifacts/plot.png``, as the sandbox writes it), if named."""
    head = url.partition(",")[0]
    names = [p.removeprefix("name=") for p in head.split(";")[1:] if p.startswith("name=")]
    return names[0] if names else None


def from_sandbox(item: Any, workspace: Path, where: str) -> Picture:
    """One image sandbox code passed: a workspace path, or bytes (which cross from the sandbox as a
    ``data:`` URL, see ``sandbox.runtime``)."""
    if isinstance(item, str) and item.startswith("data:"):
        _, _, encoded = item.partition(",")
        where = data_url_name(item) or where
        try:
            data = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise ValidationError(f"{where} is not a PNG or JPEG image: {WHAT_IMAGES_ARE}") from None
        return from_bytes(data, where)
    if isinstance(item, str):
        return from_workspace(item, workspace)
    raise ValidationError(f"{where} must be image bytes or a path such as artifacts/plot.png")


class TurnImages:
    """The images of one turn's root requests: pinned ones on every step, looked-at ones on the next."""

    def __init__(self, pinned: list[Picture]) -> None:
        self.pinned = pinned[:MAX_IMAGES]
        self._next: list[Picture] = []
        self._lock = threading.Lock()

    def show(self, picture: Picture) -> None:
        with self._lock:
            self._next = [*self._next, picture][-MAX_IMAGES:]

    def take(self) -> list[Picture]:
        """The images for the request being made now (a looked-at image is then shown)."""
        with self._lock:
            shown, self._next = self._next, []
        return [*self.pinned, *shown][-MAX_IMAGES:]


def turn_images(inputs: list[Any], files: list[Any], workspace: Path) -> TurnImages:
    """A turn's pinned images: its ``--in`` images (``NotebookValue.image``), then its attachments (``TurnFile``)
    whose bytes are PNG or JPEG; an attachment too large to send stays a file only."""
    pinned = [value.image for value in inputs if getattr(value, "image", None) is not None]
    for file in files:
        if file.size > MAX_IMAGE_BYTES:
            continue
        try:
            with (workspace / file.path).open("rb") as handle:
                if sniff(handle.read(8)) is None:
                    continue
            pinned.append(from_workspace(file.path, workspace))
        except (OSError, ValidationError):
            continue
    return TurnImages(pinned)


class ImageChatAdapter(ReaskingChatAdapter):
    """``ReaskingChatAdapter`` that adds the turn's images to the last user message of each request."""

    def __init__(self, images: TurnImages) -> None:
        super().__init__()
        self.images = images

    def format(self, signature: Any, demos: list[dict[str, Any]], inputs: dict[str, Any]) -> list[dict[str, Any]]:
        messages = super().format(signature, demos, inputs)
        pictures = self.images.take()
        if not pictures:
            return messages
        last = dict(messages[-1])
        text = last.get("content")
        parts = text if isinstance(text, list) else [{"type": "text", "text": str(text or "")}]
        last["content"] = [*parts, *(p.part() for p in pictures)]
        return [*messages[:-1], last]


def look_tool(images: TurnImages, workspace: Path) -> Callable[[str], str]:
    """``look(path)`` for sandbox code: the image is attached to the model's next step."""

    def look(path: str) -> str:
        """See an image file (PNG/JPEG) at your next step."""
        # the sandbox sends a file's bytes (as a data: URL): its /workspace reaches the host after the turn
        where = (data_url_name(path) or "the image") if str(path).startswith("data:") else str(path)
        picture = from_sandbox(path, workspace, where)
        images.show(picture)
        return f"{where} ({picture.describe()}) is attached to your next step"

    return look


def query_with_images(sub_lm: Any, workspace: Path) -> Callable[..., str]:
    """The sub-model called with a prompt and images (``llm_query(prompt, images=[...])``)."""

    def ask(prompt: str, images: list[Any]) -> str:
        if not isinstance(images, list) or len(images) > MAX_IMAGES:
            raise ValidationError(f"images must be a list of at most {MAX_IMAGES} images")
        pictures = [from_sandbox(item, workspace, f"images[{i}]") for i, item in enumerate(images)]
        content = [{"type": "text", "text": prompt}, *(p.part() for p in pictures)]
        response = sub_lm(messages=[{"role": "user", "content": content}])
        text = getattr(response, "text", None)
        if text is None and isinstance(response, list) and response:
            first = response[0]
            text = first.get("text") if isinstance(first, dict) else first
        if not isinstance(text, str):
            raise TypeError(f"the sub-model returned no text ({type(response).__name__})")
        return text

    return ask


def with_image_queries(rlm: Any, workspace: Path) -> None:
    """Give ``rlm``'s ``llm_query`` an ``images`` argument; without it, it is dspy's own ``llm_query``."""
    make = rlm._make_llm_tools

    def make_llm_tools(budget: Any = None, max_workers: int = 8) -> dict[str, Callable[..., Any]]:
        tools: dict[str, Callable[..., Any]] = make(budget, max_workers)
        plain = tools["llm_query"]
        ask = query_with_images(rlm.sub_lm, workspace)

        def llm_query(prompt: str, images: list[Any] | None = None) -> str:
            """Query the LLM with a prompt string, and optionally images (PNG/JPEG bytes or workspace paths)."""
            if not images:
                return str(plain(prompt))
            if not prompt:
                raise ValueError("prompt cannot be empty")
            if budget is not None:
                budget.reserve(1)
            return ask(prompt, images)

        tools["llm_query"] = llm_query
        return tools

    rlm._make_llm_tools = make_llm_tools
