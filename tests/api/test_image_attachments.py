"""Over HTTP, an image attachment a turn names in ``attachment_ids`` is shown to the model as an image."""

from __future__ import annotations

import io

import httpx
from live_api import events_of
from PIL import Image
from scripted_lm import ScriptedLM, step


def test_an_image_attachment_reaches_the_model_as_an_image(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM
) -> None:
    out = io.BytesIO()
    Image.new("RGB", (24, 16), (250, 250, 0)).save(out, format="JPEG")
    photo = out.getvalue()
    image = client.post(
        "/api/attachments", data={"session_id": session_id}, files={"file": ("scan.jpg", photo, "image/jpeg")}
    ).json()
    notes = client.post(
        "/api/attachments", data={"session_id": session_id}, files={"file": ("notes.txt", b"text", "text/plain")}
    ).json()
    scripted_lm.add("read the scan", [step("done", "SUBMIT(answer='yellow')")])
    body = {"task": "read the scan", "attachment_ids": [image["attachment_id"], notes["attachment_id"]]}
    with client.stream("POST", f"/api/sessions/{session_id}/turns", json=body) as response:
        assert response.status_code == 200, response.read()
        frames = events_of(response)
    assert frames[-1].event == "turn.completed", frames[-1]
    # the JPEG as sent, on the root request; the text file stays a file only
    assert [(i["mime"], i["bytes"], i["root"]) for i in scripted_lm.images] == [("image/jpeg", len(photo), True)]
