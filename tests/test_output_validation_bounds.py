"""Checking a model's ``result`` against an ``output_schema`` is bounded in time and size, and a schema
that would break the check later is refused when the turn is submitted."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticError

from fleet_kernel.engine.choices import MAX_RESULT_CHARS, check_output_schema, result_type
from fleet_kernel.errors import ValidationError

LIVENESS_S = 60  # generous: each check below takes well under a second when it is linear

UNIQUE_ROWS = {"type": "object", "properties": {"rows": {"type": "array", "uniqueItems": True}}}


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def validate(schema: dict[str, Any], value: Any, **options: Any) -> dict[str, Any]:
    """Validate in a thread, so a check that runs away fails the test instead of hanging it."""
    adapter = TypeAdapter(result_type(schema, **options))
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = adapter.validate_python(value)
        except PydanticError as exc:
            outcome["error"] = str(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(LIVENESS_S)
    assert not worker.is_alive(), "validating the result is still running"
    return outcome


@pytest.mark.slow
def test_unique_items_is_checked_in_linear_time() -> None:
    rows = [{"n": i, "tags": [str(i)]} for i in range(20_000)]
    assert validate(UNIQUE_ROWS, {"rows": rows}) == {"value": {"rows": rows}}
    error = validate(UNIQUE_ROWS, {"rows": [*rows, {"tags": ["7"], "n": 7.0}]})["error"]
    assert "more than once" in error and "'n': 7" in error


def test_unique_items_follows_json_equality() -> None:
    assert "error" in validate(UNIQUE_ROWS, {"rows": [1, 1.0]})
    assert "value" in validate(UNIQUE_ROWS, {"rows": [1, True, 0, False, [1], [True], {"a": 1}, {"a": True}]})


def test_enum_is_a_lookup() -> None:
    schema = {"type": "object", "properties": {"v": {"type": "array", "items": {"enum": [[i] for i in range(2_000)]}}}}
    assert "value" in validate(schema, {"v": [[1_999]] * 50_000})
    assert "is not one of" in validate(schema, {"v": [[1_999]] * 10 + [[2_000]]})["error"]


def test_a_result_over_the_size_cap_is_refused_before_validating() -> None:
    error = validate(UNIQUE_ROWS, {"rows": [{"n": i} for i in range(MAX_RESULT_CHARS // 8)]})["error"]
    assert f"the limit is {MAX_RESULT_CHARS}" in error


def test_a_deeply_nested_result_is_refused() -> None:
    for depth in (100, 5_000):  # 5,000 is too deep even for json.dumps
        error = validate(UNIQUE_ROWS, {"rows": [nested(depth)]})["error"]
        assert "nests deeper than 64 levels" in error


def test_validation_stops_with_the_turn() -> None:
    error = validate(UNIQUE_ROWS, {"rows": list(range(10))}, should_stop=lambda: True)["error"]
    assert "stopped" in error


@pytest.mark.parametrize("keyword", ["default", "enum", "const", "examples"])
def test_a_deeply_nested_value_in_a_schema_is_refused(keyword: str) -> None:
    value = [nested(200)] if keyword in ("enum", "examples") else nested(200)
    schema = {"type": "object", "properties": {"a": {keyword: value}}}
    with pytest.raises(ValidationError, match=rf"output_schema nests JSON deeper than \d+ levels at .*{keyword}"):
        check_output_schema(schema)
    shallow = {"type": "object", "properties": {"a": {keyword: [nested(3)] if keyword in ("enum", "examples") else 3}}}
    assert check_output_schema(shallow) is shallow
