"""Images reach the model: an ``--in`` image and an image attachment on every root step, ``look()`` on the next
step, ``llm_query(prompt, images=[...])`` to the sub-model; the real runner and sandbox, the scripted LM."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image
from scripted_lm import ScriptedLM, step

from fleet_kernel.engine import TurnRunner
from fleet_kernel.engine.images import MAX_IMAGE_BYTES, from_value
from fleet_kernel.engine.inputs import encode
from fleet_kernel.engine.sessions import Sessions
from fleet_kernel.errors import ValidationError
from fleet_kernel.events import Event
from fleet_kernel.store import Store


def _png(width: int = 8, height: int = 6) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


async def _events(runner: TurnRunner, session_id: str, task: str, **options: Any) -> list[Event]:
    handle = await runner.start(session_id, task, **options)
    return [event async for event in handle.events()]


def test_values_that_are_images_and_values_that_are_not() -> None:
    png = _png()
    assert from_value(png, "x") is not None and from_value(png, "x").mime == "image/png"  # type: ignore[union-attr]
    assert from_value(Image.new("L", (3, 3)), "x") is not None
    array = from_value(np.zeros((4, 5, 3), dtype=np.uint8), "x")
    assert array is not None and Image.open(io.BytesIO(array.data)).size == (5, 4)
    assert from_value(np.zeros((4, 5), dtype=np.float64), "x") is None  # not an image: an ordinary value
    assert from_value(b"plain bytes", "x") is None
    with pytest.raises(ValidationError, match="PNG or JPEG"):
        from_value(b"\x89PNG\r\n\x1a\n" + b"0" * (MAX_IMAGE_BYTES + 1), "big")
    value = encode("img", png)
    assert value.image is not None and type(value).__name__ == "image"


async def test_an_input_image_is_on_every_root_step_and_bound_as_png_bytes(
    runner: TurnRunner, store: Store, scripted_lm: ScriptedLM
) -> None:
    png = _png()
    scripted_lm.add(
        "describe the image",
        [
            step("check", f"print(type(img).__name__, len(img), img[:4] == b'\\x89PNG', len(img) == {len(png)})"),
            step("done", "SUBMIT(answer='a red square')"),
        ],
    )
    session = await store.create_session()
    events = await _events(runner, session.session_id, "describe the image", inputs=[encode("img", png)])
    assert events[-1].type == "turn.completed", events[-1].data
    outputs = "".join(str(e.data.get("text", "")) for e in events if e.type == "output")
    assert "bytes" in outputs and "True True" in outputs
    roots = [i for i, body in enumerate(scripted_lm.requests) if scripted_lm.is_root(body)]
    assert len(roots) == 2
    for index in roots:
        assert [(i["mime"], i["bytes"]) for i in scripted_lm.images if i["request"] == index] == [
            ("image/png", len(png))
        ]


async def test_look_shows_a_saved_image_on_the_next_step_only(
    runner: TurnRunner, store: Store, scripted_lm: ScriptedLM
) -> None:
    scripted_lm.add(
        "plot and look",
        [
            step(
                "plot",
                "from PIL import Image\nImage.new('RGB', (20, 10)).save('/workspace/artifacts/plot.png')\n"
                "print(look('artifacts/plot.png'))",
            ),
            step("seen", "print('after the look')"),
            step(
                "refused",
                "try:\n    look('artifacts/nothing.png')\nexcept Exception as exc:\n    print('refused:', exc)",
            ),
            step("done", "SUBMIT(answer='looked')"),
        ],
    )
    session = await store.create_session()
    events = await _events(runner, session.session_id, "plot and look")
    assert events[-1].type == "turn.completed", events[-1].data
    outputs = "".join(str(e.data.get("text", "")) for e in events if e.type == "output")
    assert "artifacts/plot.png (PNG, " in outputs and "is attached to your next step" in outputs
    looked = [e.data for e in events if e.type == "tool.started" and e.data["name"] == "look"]
    assert "name=artifacts/plot.png" in looked[0]["args_preview"]  # the user sees which file, not just bytes
    assert "refused:" in outputs and "no such file" in outputs
    roots = [i for i, body in enumerate(scripted_lm.requests) if scripted_lm.is_root(body)]
    seen = [[i["mime"] for i in scripted_lm.images if i["request"] == index] for index in roots]
    assert seen == [[], ["image/png"], [], []]  # shown on the step after look(), then no more


async def test_llm_query_sends_images_to_the_sub_model(
    runner: TurnRunner, store: Store, scripted_lm: ScriptedLM
) -> None:
    png = _png(30, 40)
    scripted_lm.add(
        "crops",
        [
            step(
                "ask",
                "from PIL import Image\nimport io\nImage.new('RGB', (4, 4)).save('/workspace/artifacts/crop.png')\n"
                "print(llm_query('what is in these?', images=[img, 'artifacts/crop.png']))\n"
                "print(llm_query('no images'))\n"
                "try:\n    llm_query('bad', images=[b'\\xffnot an image'])\nexcept Exception as exc:\n    print('bad:', exc)",
            ),
            step("done", "SUBMIT(answer='asked')"),
        ],
    )
    session = await store.create_session()
    events = await _events(runner, session.session_id, "crops", inputs=[encode("img", png)])
    assert events[-1].type == "turn.completed", events[-1].data
    outputs = "".join(str(e.data.get("text", "")) for e in events if e.type == "output")
    assert f"[images: image/png {len(png)} bytes, image/png" in outputs, outputs
    assert "sub-answer: no images" in outputs
    assert "bad:" in outputs and "PNG or JPEG" in outputs
    sub = [i for i in scripted_lm.images if not i["root"]]
    assert [i["mime"] for i in sub] == ["image/png", "image/png"]


async def test_an_image_attachment_is_shown_to_the_model(
    runner: TurnRunner, store: Store, scripted_lm: ScriptedLM, settings: Any
) -> None:
    png = _png(12, 12)
    scripted_lm.add("the scan", [step("done", "SUBMIT(answer='seen')")])
    session = await store.create_session()
    sessions = Sessions(store, settings)
    photo = await sessions.attach(session.session_id, "scan.png", png, "image/png")
    text = await sessions.attach(session.session_id, "notes.txt", b"just text", "text/plain")
    events = await _events(
        runner,
        session.session_id,
        "the scan",
        attachment_ids=[photo.attachment.attachment_id, text.attachment.attachment_id],
    )
    assert events[-1].type == "turn.completed", events[-1].data
    assert [(i["mime"], i["bytes"], i["root"]) for i in scripted_lm.images] == [("image/png", len(png), True)]
