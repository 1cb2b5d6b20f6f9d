"""Error responses as the OpenAPI document lists them, so clients see the error body's shape."""

from __future__ import annotations

from typing import Any

from fleet_api.schemas import ErrorBody

_TEXT = {
    401: "missing or wrong bearer token (when FLEET_API_TOKEN is set)",
    404: "unknown id",
    409: "a turn is running in the session (error.turn_id names it)",
    413: "the upload is larger than storage.max_upload_mb",
    422: "invalid request: validation_error, invalid_json, ...",
    500: "a configuration problem, such as a malformed skill card (error.message names its file)",
    503: "the store or the sandbox is unavailable",
    507: "nothing was written: disk_full (the message names the disk) or workspace_quota ([sandbox] workspace_mb, "
    "workspace_files)",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody, "description": _TEXT[status]} for status in (401, *statuses, 422, 503)}
