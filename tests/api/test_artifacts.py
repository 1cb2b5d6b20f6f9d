"""Attachments reach the sandbox under files/, artifacts come back with their content type, DELETE removes all."""

from __future__ import annotations

import asyncio
import base64
import hashlib

import httpx
import pytest
from live_api import assert_error, run_turn
from scripted_lm import ScriptedLM, step

from fleet_kernel.config import Settings

# A 1x1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
CODE = f"""
import base64
rows = open('/workspace/files/sales.csv').read().splitlines()
print('rows:', len(rows) - 1, rows[1])
with open('/workspace/artifacts/chart.png', 'wb') as f:
    f.write(base64.b64decode({base64.b64encode(PNG).decode()!r}))
with open('/workspace/artifacts/summary.csv', 'w') as f:
    f.write('region,total\\nnorth,10\\n')
"""


@pytest.mark.slow
def test_attachment_in_artifact_out(
    client: httpx.Client, session_id: str, scripted_lm: ScriptedLM, settings: Settings
) -> None:
    data = b"region,sales\nnorth,10\nsouth,20\n"
    att = client.post(
        "/api/attachments", data={"session_id": session_id}, files={"file": ("sales.csv", data, "text/csv")}
    ).json()
    scripted_lm.add("chart the sales", [step("Read and chart.", CODE), step("Done.", "SUBMIT(answer='charted')")])
    frames = run_turn(client, session_id, "chart the sales")
    assert frames[-1].event == "turn.completed", frames[-1].data
    output = "".join(f.envelope["data"]["text"] for f in frames if f.event == "output")
    assert "rows: 2 north,10" in output
    artifacts = {f.envelope["data"]["path"]: f.envelope["data"] for f in frames if f.event == "artifact"}
    assert set(artifacts) == {"artifacts/chart.png", "artifacts/summary.csv"}
    png = artifacts["artifacts/chart.png"]
    assert png["mime"] == "image/png" and png["size"] == len(PNG) and png["sha256"] == hashlib.sha256(PNG).hexdigest()

    meta = client.get(f"/api/artifacts/{png['artifact_id']}").json()
    assert meta["turn_id"] == frames[0].envelope["turn_id"] and meta["session_id"] == session_id
    assert {k: meta[k] for k in ("path", "mime", "size", "sha256")} == {
        k: png[k] for k in ("path", "mime", "size", "sha256")
    }
    content = client.get(f"/api/artifacts/{png['artifact_id']}/content")
    assert content.content == PNG and content.headers["content-type"] == "image/png"
    assert content.headers["x-content-type-options"] == "nosniff"
    csv = client.get(f"/api/artifacts/{artifacts['artifacts/summary.csv']['artifact_id']}/content")
    assert csv.headers["content-type"].startswith("text/csv") and csv.text.startswith("region,total")
    tree = client.get("/api/volume/tree", params={"session_id": session_id}).json()
    assert {"files/sales.csv", "artifacts/chart.png"} <= {e["path"] for e in tree["entries"]}

    # DELETE removes the turns, events, attachments, artifacts and the workspace.
    turn_id = frames[0].envelope["turn_id"]
    assert client.delete(f"/api/sessions/{session_id}").status_code == 204
    assert_error(client.get(f"/api/artifacts/{png['artifact_id']}"), 404)
    assert_error(client.get(f"/api/artifacts/{png['artifact_id']}/content"), 404)
    assert_error(client.get(f"/api/attachments/{att['attachment_id']}"), 404)
    assert_error(client.get(f"/api/sessions/{session_id}/turns/{turn_id}"), 404)
    assert_error(client.get(f"/api/sessions/{session_id}/turns/{turn_id}/events"), 404)
    assert not (settings.workspaces_dir / session_id).exists()
    assert not blob_exists(settings, png["sha256"])


def blob_exists(settings: Settings, sha256: str) -> bool:
    from fleet_kernel.errors import NotFoundError
    from fleet_kernel.store import Store

    async def look() -> bool:
        store = await Store.open(settings.database_url)
        try:
            await store.get_blob(sha256)
            return True
        except NotFoundError:
            return False
        finally:
            await store.close()

    return asyncio.run(look())


def test_unknown_artifact(client: httpx.Client) -> None:
    assert_error(client.get("/api/artifacts/art_missing"), 404, "not_found")
    assert_error(client.get("/api/artifacts/../etc/content"), 404)
