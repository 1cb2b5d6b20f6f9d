"""The loopback fake Daytona, driven by the real, unmodified SDK: the contract the backend relies on."""

from __future__ import annotations

import inspect
import time

import pytest
from daytona import (
    CreateSandboxFromSnapshotParams,
    DaytonaAuthenticationError,
    DaytonaConnectionError,
    DaytonaNotFoundError,
    DaytonaTimeoutError,
    FileDownloadRequest,
    FileUpload,
    ListSandboxesQuery,
    SandboxState,
    VolumeMount,
)
from daytona_api_client import ApiClient, ConfigApi, Configuration, SandboxApi, VolumesApi
from daytona_toolbox_api_client import ApiClient as ToolboxClient
from daytona_toolbox_api_client import Configuration as ToolboxConfiguration
from daytona_toolbox_api_client import FileSystemApi, InterpreterApi, ProcessApi
from fake_server import FakeDaytona

# Every generated-client call the backend, the doctor and these tests make.
SDK_CALLS = [
    (
        SandboxApi,
        [
            "create_sandbox",
            "get_sandbox",
            "list_sandboxes",
            "delete_sandbox",
            "start_sandbox",
            "stop_sandbox",
            "set_autostop_interval",
            "replace_labels",
            "get_toolbox_proxy_url",
            "update_last_activity",
        ],
    ),
    (VolumesApi, ["get_volume_by_name", "create_volume", "list_volumes", "get_volume", "delete_volume"]),
    (ConfigApi, ["config_controller_get_config"]),
    (
        InterpreterApi,
        [
            "create_interpreter_context",
            "list_interpreter_contexts",
            "delete_interpreter_context",
            "execute_interpreter_code",
        ],
    ),
    (ProcessApi, ["execute_command", "code_run"]),
    (FileSystemApi, ["upload_files", "download_files", "get_file_info", "delete_file"]),
]


def serialized(api_class: type, name: str, host: str) -> tuple[str, str]:
    """(method, path) the SDK would request for ``name``, with placeholder arguments."""
    client = (
        ToolboxClient(ToolboxConfiguration(host=host))
        if api_class.__module__.startswith("daytona_toolbox")
        else ApiClient(Configuration(host=host))
    )
    serialize = getattr(api_class(client), f"_{name}_serialize")
    required = {
        p.name
        for p in inspect.signature(getattr(api_class, name)).parameters.values()
        if p.default is inspect.Parameter.empty and p.name != "self"
    }
    kwargs = {p: ("p1" if p in required else None) for p in inspect.signature(serialize).parameters}
    method, url, *_ = serialize(**kwargs)
    return method, url.split("//", 1)[1].split("/", 1)[1].split("?")[0]


def test_sdk_paths_match_fake_routes(fake: FakeDaytona) -> None:
    for api_class, names in SDK_CALLS:
        toolbox = api_class.__module__.startswith("daytona_toolbox")
        host = f"{fake.toolbox_url}/sandbox-1" if toolbox else fake.api_url
        for name in names:
            method, path = serialized(api_class, name, host)
            assert fake.matches(method, "/" + path), f"{api_class.__name__}.{name}: {method} /{path}"


def test_sandbox_lifecycle(client, fake: FakeDaytona) -> None:
    sandbox = client.create(CreateSandboxFromSnapshotParams(language="python", labels={"fleet_test": "1"}))
    assert sandbox.state == SandboxState.STARTED
    assert client.get(sandbox.id).labels["fleet_test"] == "1"
    assert [s.id for s in client.list(ListSandboxesQuery(labels={"fleet_test": "1"}))] == [sandbox.id]
    assert list(client.list(ListSandboxesQuery(labels={"fleet_test": "2"}))) == []
    sandbox.set_autostop_interval(7)
    sandbox.stop()
    assert sandbox.state == SandboxState.STOPPED
    sandbox.start()
    assert sandbox.state == SandboxState.STARTED and client.get(sandbox.id).auto_stop_interval == 7
    client.delete(sandbox, wait=True)
    with pytest.raises(DaytonaNotFoundError):
        client.get(sandbox.id)


def test_contexts_keep_state_apart(client) -> None:
    sandbox = client.create()
    interp = sandbox.code_interpreter
    first, second = interp.create_context(), interp.create_context()
    interp.run_code("x = 1", context=first)
    assert interp.run_code("print(x)", context=first).stdout == "1\n"
    assert interp.run_code("print(x)", context=second).error.name == "NameError"
    assert {c.id for c in interp.list_contexts()} == {first.id, second.id}
    interp.delete_context(first)
    assert [c.id for c in interp.list_contexts()] == [second.id]
    with pytest.raises(DaytonaConnectionError):  # the daemon closes with 1008: context not found
        interp.run_code("print(1)", context=first)


def test_output_streams_before_run_code_returns(client) -> None:
    sandbox = client.create()
    started, arrivals = time.perf_counter(), []
    result = sandbox.code_interpreter.run_code(
        "import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.3)",
        on_stdout=lambda m: arrivals.append((time.perf_counter() - started, m.output)),
        timeout=10,
    )
    total = time.perf_counter() - started
    assert [text for _, text in arrivals] == ["0\n", "1\n", "2\n"] and result.stdout == "0\n1\n2\n"
    assert arrivals[0][0] < total - 0.5  # the first print arrived while the code still ran


def test_timeout_closes_4008_and_keeps_the_context(client) -> None:
    sandbox = client.create()
    context = sandbox.code_interpreter.create_context()
    sandbox.code_interpreter.run_code("kept = 'yes'", context=context)
    started = time.perf_counter()
    with pytest.raises(DaytonaTimeoutError):
        sandbox.code_interpreter.run_code("import time\ntime.sleep(30)", context=context, timeout=1)
    assert time.perf_counter() - started < 20  # liveness: the code sleeps for 30 s
    assert sandbox.code_interpreter.run_code("print(kept)", context=context).stdout == "yes\n"


def test_errors_come_back_as_execution_errors(client) -> None:
    result = client.create().code_interpreter.run_code("print('before')\n1/0")
    assert result.stdout == "before\n" and result.error.name == "ZeroDivisionError"


def test_bulk_files_and_per_file_errors(client) -> None:
    fs = client.create().fs
    fs.upload_files([FileUpload(b"one", "/tmp/a/one.txt"), FileUpload(b"two", "two.txt")])
    results = fs.download_files(
        [
            FileDownloadRequest(source="/tmp/a/one.txt"),
            FileDownloadRequest(source="/home/daytona/two.txt"),
            FileDownloadRequest(source="/tmp/missing"),
        ]
    )
    assert [r.result for r in results[:2]] == [b"one", b"two"]
    assert results[2].result is None and "not found" in results[2].error
    assert fs.get_file_info("two.txt").size == 3
    fs.delete_file("two.txt")
    with pytest.raises(DaytonaNotFoundError):
        fs.get_file_info("two.txt")


def test_volume_subpaths_outlive_sandboxes(client, fake: FakeDaytona) -> None:
    volume = client.volume.get("fleet-test", create=True)
    assert client.volume.get("fleet-test").id == volume.id
    mount = [VolumeMount(volume_id=volume.id, mount_path="/workspace", subpath="sessions/s1")]
    first = client.create(CreateSandboxFromSnapshotParams(language="python", volumes=mount))
    first.code_interpreter.run_code("open('/workspace/note.txt', 'w').write('kept')")
    client.delete(first, wait=True)
    second = client.create(CreateSandboxFromSnapshotParams(language="python", volumes=mount))
    assert second.fs.download_file("/workspace/note.txt") == b"kept"
    assert second.process.exec("ls /workspace").result.split() == ["note.txt"]


def test_processes_see_only_the_sandbox_environment(client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_LM_API_KEY", "sk-host-only")
    sandbox = client.create(CreateSandboxFromSnapshotParams(language="python", env_vars={"VISIBLE": "1"}))
    listing = sandbox.process.exec("env").result
    assert "VISIBLE=1" in listing and "sk-host-only" not in listing
    assert "sk-host-only" not in sandbox.code_interpreter.run_code("import os; print(dict(os.environ))").stdout


def test_bad_key_is_an_authentication_error(fake: FakeDaytona) -> None:
    from daytona import Daytona, DaytonaConfig

    with pytest.raises(DaytonaAuthenticationError):
        Daytona(DaytonaConfig(api_key="wrong", api_url=fake.api_url)).create()
