"""The notebook's catalogue (``kernel.namespace``) and its bridge's calls and values (``kernel.notebook_bridge``)."""

from __future__ import annotations

import json
import os
import threading
import time

import pandas as pd
import pytest

from fleet_kernel.cancel import CancelToken
from fleet_kernel.kernel import namespace
from fleet_kernel.kernel.notebook_bridge import VALUE_TAG, MainThreadCalls, check_tool, from_wire, to_wire
from fleet_kernel.sandbox.runtime import _tool_value


def test_the_catalogue_lists_types_and_sizes_never_values() -> None:
    ns = {
        "df": pd.DataFrame({"city": ["Zanzibar"], "n": [7]}),
        "rows": [1, 2, 3],
        "note": "a very private sentence",
        "os": os,
        "helper": len,
        "_hidden": 1,
        "In": [],
        "get_ipython": object(),
        "API_KEY": "sk-1",
        "db_password": "p",
        "my_token": "t",
        "Credentials": {},
        "secret_plan": "s",
    }
    text = namespace.variables(ns)
    assert "- df: DataFrame 1x2 [city: " in text and "n: int64]" in text
    assert "- rows: list len 3" in text and "- note: str len 23" in text
    assert "Zanzibar" not in text and "private" not in text
    for hidden in ("os", "helper", "_hidden", "In", "get_ipython", "API_KEY", "password", "token", "Credentials"):
        assert f"- {hidden}" not in text
    assert namespace.allowed_names(ns) == ["df", "rows", "note"]
    assert namespace.variables(ns, "off") == ""
    assert "= 'a very private sentence'" in namespace.variables(ns, "previews")


def test_the_catalogue_is_bounded_however_big_the_namespace() -> None:
    ns = {f"value_{i}": list(range(i % 50)) for i in range(20_000)}
    ns["wide"] = pd.DataFrame({f"column_{i}": [i] for i in range(500)})
    for mode in ("names", "previews"):
        text = namespace.variables(ns, mode)
        assert len(text) <= namespace.MAX_CATALOGUE_CHARS + 100
        assert "more names not listed" in text
        assert "wide: DataFrame 1x500" in text and "... 488 more" in text  # the newest first
    assert len(namespace.preview("x" * 100_000)) <= namespace.PREVIEW_CHARS
    long_names = pd.DataFrame({"c" * 5000 + str(i): [i] for i in range(3)})
    assert len(namespace.variables({"long_names": long_names})) <= namespace.MAX_LINE_CHARS


class Awkward:
    @property
    def shape(self) -> tuple[int, ...]:
        raise RuntimeError("no shape today")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


def test_objects_whose_attributes_raise_are_listed_by_type() -> None:
    assert namespace.variables({"odd": Awkward()}) == "- odd: Awkward"
    assert namespace.variables({"odd": Awkward()}, "previews").startswith("- odd: Awkward = <Awkward instance at")


def test_recent_cells_show_sources_outputs_and_the_last_error_with_secrets_masked() -> None:
    inputs = ["", "import math", "api_key = 'sk-live-123'", "math.pi * 2", "x = [1]\nx[5]", "%%fleet\nfix it"]
    try:
        [1][5]
    except IndexError as exc:
        error = exc
    text = namespace.recent_cells(inputs, {3: 6.283185307179586}, error, current=5)
    assert "In [1]" not in text and "In [2]:\napi_key = <hidden>" in text and "sk-live" not in text
    assert "In [3]:\nmath.pi * 2\nOut[3]: 6.283185307179586" in text
    assert "In [4]:\nx = [1]\nx[5]" in text and "%%fleet" not in text
    assert "The last cell failed" in text and "IndexError: list index out of range" in text
    big = namespace.recent_cells(["", "y" * 50_000], {1: "z" * 50_000}, None, current=2)
    assert len(big) <= namespace.MAX_CELLS_CHARS + 10


def test_values_cross_tagged_as_in_values_and_come_back_whole() -> None:
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    wire = to_wire(frame, 1e9)
    assert wire[VALUE_TAG] == "DataFrame" and "pickle" not in json.dumps(wire)
    assert _tool_value(wire).equals(frame)  # the sandbox's side rebuilds it
    assert _tool_value(to_wire(b"\x00\xff", 1e9)) == b"\x00\xff"
    assert _tool_value(to_wire({"k": [1, 2.5, None]}, 1e9)) == {"k": [1, 2.5, None]}
    assert _tool_value(to_wire("text", 1e9)) == "text" and to_wire(3, 1e9) == 3
    with pytest.raises(ValueError, match="limit is"):
        to_wire("x" * 2000, 1000)
    with pytest.raises(ValueError, match="object"):
        to_wire(object(), 1e9)
    assert from_wire([{VALUE_TAG: "DataFrame", "payload": frame.to_json(orient="split")}])[0].equals(frame)


def test_calls_run_on_the_waiting_thread_and_time_out_or_stop_with_the_turn() -> None:
    calls, cancel = MainThreadCalls(), CancelToken()
    results: dict[str, object] = {}

    def caller(key: str, fn: object, timeout: float) -> None:
        try:
            results[key] = calls.call(key, fn, timeout, cancel)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - what the tool thread would send the model
            results[key] = exc

    worker = threading.Thread(target=caller, args=("name", lambda: threading.current_thread().name, 5))
    worker.start()
    while worker.is_alive():
        calls.wait(0.05)
        calls.run_pending()
    assert results["name"] == threading.current_thread().name
    slow = threading.Thread(target=caller, args=("slow", lambda: 1, 0.2))
    slow.start()
    slow.join()  # nobody ran it: given up after its timeout
    assert isinstance(results["slow"], TimeoutError) and "longer than 0.2 s" in str(results["slow"])
    stuck = threading.Thread(target=caller, args=("stuck", lambda: 1, 60))
    stuck.start()
    time.sleep(0.2)
    cancel.cancel("interrupted")
    stuck.join(2)
    assert isinstance(results["stuck"], RuntimeError) and "interrupted" in str(results["stuck"])
    calls.run_pending()  # the abandoned calls are dropped, not run


def test_tool_names_are_checked() -> None:
    assert check_tool("area", len) is None
    assert "not a function" in str(check_tool("x", 3))
    assert "cannot be a tool name" in str(check_tool("notebook", len))
    assert "cannot be a tool name" in str(check_tool("_private", len))


def test_a_tool_whose_annotations_pydantic_cannot_describe_keeps_its_names_and_docstring() -> None:
    import dspy

    from fleet_kernel.kernel.notebook_bridge import NotebookBridge

    def total(frame: pd.DataFrame, column: str = "n") -> int:
        """The sum of one column of a frame."""
        return int(frame[column].sum())

    bridge = NotebookBridge({}, frozenset(), {"total": total}, MainThreadCalls(), CancelToken(), 5, 1e9, fetch=False)
    (tool,) = bridge.host_tools()
    spec = dspy.Tool(tool)
    assert spec.name == "total" and spec.desc == "The sum of one column of a frame."
    assert set(spec.args) == {"frame", "column"}
