"""Hostile programs in every sandbox CI can run (``local``, ``pyodide``): each is contained, and the next execute works.

The same programs run on each backend. Where a backend legitimately behaves differently (Pyodide has no
processes and no page 0 to fault on, and its real boundary is Deno's permissions rather than the file
system Python sees), the contained behaviour of that backend is asserted explicitly. Daytona's test
fake runs the runtime in a plain subprocess, so it is no isolation boundary and is not tested here.

One factory and one interpreter serve a whole backend (a Pyodide start costs ~1 s); each test first
runs ``PRELUDE`` (the state check and helpers) because earlier tests may have restarted the worker.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from dspy.primitives.code_interpreter import CodeExecutionError

from fleet_kernel.config import Limits, Policy, SandboxLimits, Settings
from fleet_kernel.sandbox import SandboxCrashed, SandboxFactory, SandboxInterpreter, observer, open_sandbox, probe_bwrap
from fleet_kernel.sandbox._pyfarm import NEUTRAL_ROOT
from fleet_kernel.sandbox._support import python_paths
from fleet_kernel.workspace import Workspace

BACKENDS = ("local", "pyodide")
SECRET = "sk-secret-xyz"
MARKER = "TOP" + "SECRET"  # never written whole into a program, so finding it means reading it
EXEC_TIMEOUT_S = 10  # generous: a loaded CI machine must not turn slow programs into timeouts
MAX_OUTPUT = 100_000
FORWARDED_MAX = MAX_OUTPUT + 1024 + 200  # the host's cap: limit, slack for the runtime's notice, its own notice

# Helpers every program may use; the same source on every backend. ``_deno`` is Deno's API in Pyodide
# (reachable through the ``js`` module: the boundary there is Deno's permissions), else None.
PRELUDE = r"""
import ctypes, gc, io, json, os, socket, subprocess, sys, time
state = 'kept'
try:
    import js
    _deno = js.Deno
except ImportError:
    js = _deno = None


def _attempt(action):
    try:
        result = action()
    except BaseException as exc:  # a JS error's own text starts with its name (NotCapable: ...)
        return (str(exc) if type(exc).__name__ == 'JsException' else f"{type(exc).__name__}: {exc}")[:300]
    return "OK " + repr(result)[:300]


def _channel(newline=True):
    # The worker's own end of the protocol channel: local, a pipe fd it inherited; Pyodide, the runner's bridge.
    if _deno is not None:
        import _fleet_bridge
        return _fleet_bridge.write  # the runner ends every write with a newline
    fd = min(f.fileno() for f in gc.get_objects() if isinstance(f, io.BufferedWriter) and f.fileno() > 2)
    def send(text):
        data = memoryview((text + ('\n' if newline else '')).encode())
        while data:
            data = data[os.write(fd, data):]
    return send
"""


def unavailable(backend: str) -> str | None:
    if backend == "local":
        return probe_bwrap()
    from fleet_kernel.sandbox.pyodide import probe_pyodide

    return probe_pyodide()


@dataclass
class Box:
    """One backend's sandbox in a FLEET_HOME that holds things worth stealing."""

    backend: str
    home: Path
    workspace: Path
    other: Path  # another session's workspace
    database: Path
    factory: SandboxFactory
    current: SandboxInterpreter | None = field(default=None, repr=False)

    def interpreter(self) -> SandboxInterpreter:
        if self.current is None:
            self.current = self.factory()
        return self.current

    def discard(self) -> None:
        """After a terminal failure: the next test gets a new interpreter from the same factory."""
        if self.current is not None:
            self.current.shutdown()
        self.current = None

    def host_path(self, sandbox_path: str) -> str:
        """Where Deno (which sees the host) finds a /workspace path."""
        return os.path.realpath(self.workspace) + sandbox_path.removeprefix("/workspace")


@pytest.fixture(scope="module", params=BACKENDS)
def box(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    backend = request.param
    if (reason := unavailable(backend)) is not None:
        pytest.skip(f"{backend} sandbox unavailable: {reason}")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FLEET_LM_API_KEY", SECRET)  # before any worker starts
        home = tmp_path_factory.mktemp(backend) / "fleet-home"
        workspace = Workspace.for_session(home / "workspaces", "session-a").root
        other = Workspace.for_session(home / "workspaces", "session-b").root
        database = home / "fleet.db"
        database.write_text(f"SQLite format 3 {MARKER} the store")
        (other / "files" / "secret.txt").write_text(f"{MARKER} of session b")
        # Links a turn on another backend could have left in this session's workspace, made before the worker starts.
        (workspace / "files" / "odd").mkdir()
        for link, target in {
            "files/db-link": database,
            "files/other-session": other,
            "files/odd/a,b": database,
            "artifacts/evil-link": database,
        }.items():
            os.symlink(target, workspace / link)
        policy = Policy(
            limits=Limits(exec_timeout_s=EXEC_TIMEOUT_S),
            sandbox=SandboxLimits(memory_mb=512, max_processes=32, max_output_bytes=MAX_OUTPUT),
        )
        settings = Settings(home=home, database_url="sqlite://", sandbox=backend, policy=policy)
        made = Box(backend, home, workspace, other, database, open_sandbox(settings, workspace))
        try:
            yield made
        finally:
            made.factory.close()


@pytest.fixture
def interp(box: Box) -> SandboxInterpreter:
    interpreter = box.interpreter()
    interpreter.execute(PRELUDE)
    return interpreter


class Seen:
    """A SandboxObserver counting what the host passed on (what would become ``output`` events)."""

    def __init__(self) -> None:
        self.chars = 0

    def on_output(self, stream: str, text: str) -> None:
        self.chars += len(text)

    def on_tool_start(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return name

    def on_tool_end(self, call_id: str, ok: bool, result: Any) -> None:
        pass


@pytest.fixture
def seen() -> Iterator[Seen]:
    recorder = Seen()
    token = observer.set(recorder)
    yield recorder
    observer.reset(token)


def still_works(interp: SandboxInterpreter, state_kept: bool = True) -> None:
    assert interp.execute("1 + 1") == "2"
    if state_kept:
        assert interp.execute("state") == "'kept'"


def run(interp: SandboxInterpreter, code: str) -> Any:
    try:
        return interp.execute(code)
    except CodeExecutionError as exc:
        return f"ERROR: {exc}"


def restarted(out: str) -> bool:
    return out.startswith("ERROR") and "It was restarted" in out


# -- reading what is not the workspace's ----------------------------------------------------------


@pytest.mark.slow
def test_host_files_are_invisible(box: Box, interp: SandboxInterpreter) -> None:
    targets = {  # what the code asks for (a /workspace path, or a host path) -> where Deno would find it
        str(Path.home()): None,
        "/etc/shadow": None,
        "/etc/hostname": None,
        str(box.database): None,
        str(box.other): None,
        str(box.other / "files" / "secret.txt"): None,
        "/root/.bash_history": None,
        "/workspace/files/db-link": box.host_path("/workspace/files/db-link"),
        "/workspace/files/other-session/files/secret.txt": box.host_path(
            "/workspace/files/other-session/files/secret.txt"
        ),
        "/workspace/files/odd/a,b": box.host_path("/workspace/files/odd/a,b"),
    }
    program = f"""
found = {{}}
for path, host in {targets!r}.items():
    found[path] = {{'python': _attempt(lambda: os.listdir(path) if os.path.isdir(path) else open(path, 'rb').read())}}
    if _deno is not None:
        found[path]['deno'] = _attempt(lambda: bytes(_deno.readFileSync(host or path).to_py()))
        found[path]['deno dir'] = _attempt(lambda: [e.name for e in _deno.readDirSync(host or path)])
json.dumps(found)"""
    out = run(interp, program)
    assert MARKER not in out
    found = json.loads(eval(out))
    python = (*python_paths(), NEUTRAL_ROOT)  # where it is on the host, and where the local sandbox mounts it
    for path, result in found.items():
        if path == str(Path.home()) and result["python"].startswith("OK"):  # only the way to a bound Python install
            way = {Path(p).relative_to(path).parts[0] for p in python if Path(p).is_relative_to(path)}
            assert way and set(eval(result["python"][3:])) <= way, (path, result, python)
        else:
            assert result["python"].startswith("FileNotFoundError"), (path, result)
        if box.backend == "pyodide":  # Python sees Pyodide's in-memory file system; Deno is the boundary
            assert result["deno"].startswith("NotCapable") and result["deno dir"].startswith("NotCapable"), (
                path,
                result,
            )

    sweep = f"""
hits = []
for top in ('/etc', '/run', '/tmp', '/workspace', '/dev', '/home', '/root', '/mnt', '/opt', '/srv', '/var'):
    for d, dirs, fs in os.walk(top):
        dirs[:] = [x for x in dirs if not os.path.join(d, x).startswith({python!r})]  # the read-only Python install
        for f in fs:
            p = os.path.join(d, f)
            try:
                if os.path.isfile(p) and not os.path.islink(p) and {MARKER[:3]!r} + {MARKER[3:]!r} in open(p, 'rb').read(1 << 20).decode('latin-1'):
                    hits.append(p)
            except OSError:
                pass
hits"""
    assert run(interp, sweep) == "[]"
    if box.backend == "local":
        allowed = {
            "bin",
            "sbin",
            "lib",
            "lib32",
            "lib64",
            "libx32",
            "usr",
            "etc",
            "proc",
            "dev",
            "tmp",
            "run",
            "workspace",
        }
        top = set(eval(run(interp, "os.listdir('/')")))
        assert top <= allowed | {Path(p).parts[1] for p in python}, top
        stray = run(
            interp,
            f"[os.path.join(d, f) for top in {sorted(top - allowed)!r} for d, _, fs in os.walk('/' + top) "
            f"for f in fs if not d.startswith({python!r})]",
        )
        assert stray == "[]", stray
        # everywhere but the read-only Python install (checked above), which is slow to grep on a loaded machine
        grep = (
            "subprocess.run(['grep', '-rlsD', 'skip', '--exclude-dir=python', 'TOP' + 'SECRET', "
            "'/etc', '/run', '/tmp', '/workspace', '/dev'], capture_output=True, text=True).stdout"
        )
        assert run(interp, grep) == "''"
    still_works(interp)


def test_a_link_named_with_deno_list_separator_at_the_top_is_refused(tmp_path: Path) -> None:
    """A comma cannot be escaped in ``--deny-read``; a top-level link so named would stay readable: Pyodide refuses."""
    workspace = Workspace(tmp_path / "workspace").ensure().root
    (tmp_path / "secret.txt").write_text(MARKER)
    os.symlink(tmp_path / "secret.txt", workspace / "a,b")
    for backend in BACKENDS:
        if unavailable(backend) is not None:
            continue
        settings = Settings(home=tmp_path / "home", database_url="sqlite://", sandbox=backend)
        factory = open_sandbox(settings, workspace)
        try:
            interpreter = factory()
            if backend == "local":  # the link points into the sandbox's own (empty) view of the host
                assert "FileNotFoundError" in run(interpreter, "open('/workspace/a,b').read()")
            else:
                with pytest.raises(SandboxCrashed, match="remove the symbolic link"):
                    interpreter.execute("1")
        finally:
            factory.close()


def test_secrets_in_the_host_environment_do_not_leak(box: Box, interp: SandboxInterpreter) -> None:
    assert os.environ["FLEET_LM_API_KEY"] == SECRET
    program = """
blobs = {'os.environ': repr(dict(os.environ))}
for pid in (os.listdir('/proc') if os.path.isdir('/proc') else []):
    if pid.isdigit() or pid == 'self':
        for name in ('environ', 'cmdline'):
            try:
                blobs[f'{pid}/{name}'] = open(f'/proc/{pid}/{name}', 'rb').read().decode('latin-1')
            except OSError:
                pass
if _deno is not None:
    blobs['Deno.env'] = _attempt(lambda: _deno.env.toObject())
    blobs['Deno.env.get'] = _attempt(lambda: _deno.env.get('FLEET_LM_API_KEY'))
json.dumps(blobs)"""
    out = run(interp, program)
    assert SECRET not in out and SECRET[::-1] not in out
    blobs = json.loads(eval(out))
    names = set(eval(run(interp, "sorted(os.environ)")))
    if box.backend == "local":
        assert names <= {
            "PATH",
            "HOME",
            "LANG",
            "PWD",
            "MALLOC_ARENA_MAX",
            "OPENBLAS_NUM_THREADS",
            "OMP_NUM_THREADS",
            "MKL_NUM_THREADS",
            "XDG_CACHE_HOME",
            "MPLCONFIGDIR",
            "LD_LIBRARY_PATH",
        }, names
        assert {"1/environ", "self/environ"} <= set(blobs)  # it did read /proc: there was nothing to find
    else:  # Emscripten's made-up environment; Deno's real one is behind --allow-env
        assert names <= {"HOME", "LANG", "LD_LIBRARY_PATH", "LOGNAME", "PATH", "PWD", "PYTHONINSPECT", "USER", "_"}
        assert blobs["Deno.env"].startswith("NotCapable") and blobs["Deno.env.get"].startswith("NotCapable")
    # Nor is it in the environment of any process the sandbox runs in (bwrap, Deno), seen from the host.
    for pid in _descendants(os.getpid()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone meanwhile
            continue
        assert SECRET.encode() not in environ, pid
    still_works(interp)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


# -- network ----------------------------------------------------------------------------------------


_HITS: list[str] = []


class _Counting(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        _HITS.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _host_address() -> str | None:
    """This machine's address on its default route (not loopback), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent
            return str(probe.getsockname()[0])
        except OSError:
            return None


@pytest.mark.slow
def test_no_network_at_all(box: Box, interp: SandboxInterpreter) -> None:
    """Stand-ins for the LM server (loopback) and the API (all interfaces) listen on the host; nothing reaches them."""
    lm = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    api = ThreadingHTTPServer(("0.0.0.0", 0), _Counting)  # reachable from anywhere but the sandbox
    _HITS.clear()
    accepted: list[Any] = []
    for server in (lm, api):
        server.verify_request = lambda request, address: accepted.append(address) or True  # type: ignore[method-assign]
        threading.Thread(target=server.serve_forever, daemon=True).start()
    lm_port, api_port = lm.server_address[1], api.server_address[1]
    targets = [
        ("127.0.0.1", lm_port),
        ("127.0.0.1", api_port),
        ("localhost", api_port),
        ("1.1.1.1", 53),
        ("1.1.1.1", 443),
    ]
    if (address := _host_address()) is not None:
        targets.append((address, api_port))
    try:
        program = f"""
found = {{}}
for host, port in {targets!r}:
    found[f'{{host}}:{{port}}'] = _attempt(lambda: socket.create_connection((host, port), timeout=2))
import urllib.request
found['urlopen'] = _attempt(lambda: urllib.request.urlopen('http://127.0.0.1:{lm_port}/v1/models', timeout=2).read())
found['udp'] = _attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('1.1.1.1', 53)))
if _deno is not None:
    from pyodide.code import run_js
    found['Deno.listen'] = _attempt(lambda: run_js("Deno.listen({{port: 0}})"))
    found['WebSocket'] = _attempt(lambda: run_js("new WebSocket('ws://127.0.0.1:{api_port}/')"))
    # Asynchronous: a promise whose work never runs (the worker's JS event loop is blocked while Python serves).
    found['Deno.connect'] = _attempt(lambda: run_js("Deno.connect({{hostname: '127.0.0.1', port: {lm_port}}})"))
    found['fetch'] = _attempt(lambda: run_js("fetch('http://127.0.0.1:{api_port}/')"))
json.dumps(found)"""
        found = json.loads(eval(run(interp, program)))
        for name, result in found.items():
            if box.backend == "local":
                assert result.startswith(("OSError", "URLError")) and "Address family not supported" in result, (
                    name,
                    result,
                )
            elif name in ("Deno.listen", "WebSocket"):
                assert result.startswith("NotCapable"), (name, result)
            elif name in ("Deno.connect", "fetch"):  # the listeners below prove nothing came of it
                assert result.startswith(("OK", "NotCapable")), (name, result)
            else:
                assert result.startswith(("OSError", "URLError", "gaierror")), (name, result)
        if box.backend == "local":
            assert run(interp, "len(socket.socketpair())") == "2"  # asyncio and multiprocessing still work
        assert run(interp, "'marker'") == "'marker'"  # pending async work in the sandbox had its turn
        for server in (lm, api):  # the host's own request: accepted after anything the sandbox sent first
            probe = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
            probe.request("GET", "/host-marker")
            assert probe.getresponse().status == 200
            probe.close()
        assert len(accepted) == 2 and _HITS == ["/host-marker"] * 2, (accepted, _HITS)
    finally:
        for server in (lm, api):
            server.shutdown()
            server.server_close()
    still_works(interp)


# -- writing where it may not -------------------------------------------------------------------------


def test_writes_outside_the_workspace_change_nothing_on_the_host(box: Box, interp: SandboxInterpreter) -> None:
    tag = uuid.uuid4().hex[:8]
    outside = {
        path: (path.read_bytes() if path.exists() else None)
        for path in (
            box.home / f"escape-{tag}.txt",
            box.database,
            box.other / "files" / "secret.txt",
            box.other / "files" / f"new-{tag}.txt",
            box.workspace.parent / f"escape-{tag}.txt",
            Path("/tmp") / f"fleet-escape-{tag}.txt",
            Path.home() / f"fleet-escape-{tag}.txt",
        )
    }
    paths = [str(path) for path in outside]
    program = f"""
import base64
found = {{}}
for path in {paths!r} + ['/workspace/files/db-link', '/workspace/artifacts/evil-link']:
    found[path] = _attempt(lambda: open(path, 'w').write('ESCAPED'))
    found[path + ' (made dirs)'] = _attempt(lambda: (os.makedirs(os.path.dirname(os.path.realpath(path)), exist_ok=True),
                                                     open(path, 'w').write('ESCAPED')))
    if _deno is not None:
        found[path + ' (Deno)'] = _attempt(lambda: _deno.writeTextFileSync(path, 'ESCAPED'))
send = _channel()
for relative in ('artifacts/../../escape-{tag}.txt', 'memory/../../session-b/files/secret.txt',
                 'artifacts/evil-link', 'artifacts/../../../escape-{tag}.txt'):
    send(json.dumps({{'type': 'workspace_file', 'path': relative,
                      'data': base64.b64encode(b'ESCAPED').decode()}}))
json.dumps(found)"""
    found = json.loads(eval(run(interp, program)))
    assert run(interp, "'marker'") == "'marker'"  # the host has handled every message sent before this step
    leaked = {
        str(path): before
        for path, before in outside.items()
        if (path.read_bytes() if path.exists() else None) != before
    }
    for path in outside:
        if path.parent in (Path("/tmp"), Path.home()) and path.exists():
            path.unlink()  # clean up before failing
    assert leaked == {}, (leaked, found)
    assert box.database.read_text().endswith("the store") and os.path.islink(box.workspace / "artifacts" / "evil-link")
    if box.backend == "pyodide":
        for name, result in found.items():
            if name.endswith("(Deno)"):
                assert result.startswith("NotCapable"), (name, result)
    still_works(interp)


def test_system_is_read_only_and_privileges_are_gone(box: Box, interp: SandboxInterpreter) -> None:
    if box.backend == "local":
        for path in ("/usr/evil", "/evil", "/etc/passwd"):
            assert "Read-only file system" in run(interp, f"open({path!r}, 'w')"), path
        status = run(interp, "print(open('/proc/self/status').read())")
        assert "CapEff:\t0000000000000000" in status and "NoNewPrivs:\t1" in status and "Seccomp:\t2" in status
        assert run(interp, "ctypes.CDLL(None).unshare(0x10000000)") == "-1"  # CLONE_NEWUSER: denied by seccomp
    else:  # what Deno itself could do for the code, through the js module: every permission is off
        program = """
from pyodide.code import run_js
attempts = {
    'write': lambda: _deno.writeTextFileSync('/workspace/escape.txt', 'x'),
    'run': lambda: run_js("new Deno.Command('/bin/true').outputSync()"),
    'ffi': lambda: run_js("Deno.dlopen('libc.so.6', {})"),
    'sys': lambda: _deno.hostname(),
    'env': lambda: _deno.env.get('HOME'),
    'net': lambda: run_js("Deno.listen({port: 0})"),
    'import': lambda: run_js("import('https://deno.land/std/version.ts')"),
}
json.dumps({name: _attempt(attempt) for name, attempt in attempts.items()})"""
        found = json.loads(eval(run(interp, program)))
        assert all(found[name].startswith("NotCapable") for name in ("write", "run", "ffi", "sys", "env", "net")), found
        assert found["import"].startswith("OK")  # a promise that never settles: the event loop is blocked
        assert not (box.workspace / "escape.txt").exists()
    still_works(interp)


# -- resource bombs -------------------------------------------------------------------------------------


def test_fork_bomb_is_contained(box: Box, interp: SandboxInterpreter) -> None:
    started = time.monotonic()
    out = run(interp, "while True:\n    os.fork()")
    if box.backend == "local":
        assert "ERROR" in out and ("BlockingIOError" in out or "timed out" in out), out
        assert run(interp, "len([p for p in os.listdir('/proc') if p.isdigit()])") in ("'2'", "2")  # init + us
    else:  # WebAssembly has no processes
        assert "OSError" in out and "Function not implemented" in out, out
        assert "does not support processes" in run(interp, "subprocess.Popen(['sh', '-c', ':(){ :|:& };:'])")
    assert time.monotonic() - started < 10
    still_works(interp)


@pytest.mark.slow
def test_memory_bomb_is_a_memory_error_or_an_oom_restart(box: Box, interp: SandboxInterpreter) -> None:
    out = run(interp, "hog = bytearray(4 * 1024 ** 3)")
    if box.backend == "local":
        assert "MemoryError" in out, out
    else:  # 32-bit WebAssembly cannot even index 4 GiB
        assert "OverflowError" in out, out
    still_works(interp)
    out = run(interp, "hogs = []\nwhile True:\n    hogs.append(bytearray(64 * 1024 ** 2))")
    assert "MemoryError" in out or "ran out of memory (limit 512 MB)" in out, out
    still_works(interp, state_kept="MemoryError" in out)


def test_memory_bomb_in_a_child_process_is_killed(box: Box, interp: SandboxInterpreter) -> None:
    code = (
        "r = subprocess.run([sys.executable, '-c', 'import os\\nx = [os.urandom(1) * 2**26 for _ in range(64)]'])\n"
        "r.returncode"
    )
    out = run(interp, code)
    if box.backend == "local":
        assert out.splitlines()[-1] in ("1", "-9")  # MemoryError (rlimit) or killed (cgroup)
    else:
        assert "does not support processes" in out, out
    still_works(interp)


@pytest.mark.slow
def test_infinite_loop_times_out(interp: SandboxInterpreter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interp, "_exec_timeout_s", 3)  # the module's generous 10 s would spin a core for 10 s
    started = time.monotonic()
    assert "timed out after 3 s" in run(interp, "while True:\n    pass")
    assert time.monotonic() - started < 3 + 30  # interrupted, not left running
    still_works(interp)


# -- output floods --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_output_flood_is_capped_and_fast(box: Box, interp: SandboxInterpreter, seen: Seen) -> None:
    started = time.monotonic()
    out = run(interp, "for _ in range(1000):\n    sys.stdout.write('x' * 100_000)")
    assert len(out) < 101_000 and out.endswith("[output truncated: more than 100000 characters]")
    assert seen.chars < FORWARDED_MAX
    seen.chars = 0
    out = run(interp, "os.system('head -c 100000000 /dev/zero | tr \"\\\\0\" y')")
    if box.backend == "local":
        assert out.startswith("yyyy") and len(out) < 101_000
    else:  # Deno refuses to run a process, and Pyodide cannot survive being refused
        assert restarted(out) and "NotCapable" in out, out
    assert seen.chars < FORWARDED_MAX
    assert time.monotonic() - started < 8
    still_works(interp, state_kept=box.backend == "local")
    interp.execute(PRELUDE)
    started, seen.chars = time.monotonic(), 0
    out = run(interp, "sys.__stdout__.write('y' * 100_000_000)\nsys.__stdout__.flush()")  # the C-level stream
    assert seen.chars < FORWARDED_MAX and len(out or "") < 101_000, (seen.chars, len(out or ""))
    assert time.monotonic() - started < 8
    still_works(interp)


@pytest.mark.slow
def test_flooding_the_protocol_channel_is_capped_by_the_host(box: Box, interp: SandboxInterpreter, seen: Seen) -> None:
    """Code can write to its own end of the channel, past the runtime's cap: the host caps what it passes on."""
    started = time.monotonic()
    out = run(
        interp, '_channel()(\'{"type": "out", "stream": "stdout", "text": "\' + \'z\' * 100_000_000 + \'"}\')\n\'sent\''
    )
    assert seen.chars < FORWARDED_MAX, seen.chars
    if box.backend == "local" or out == "'sent'":
        assert out == "'sent'"
        still_works(interp)
    else:  # copying 100 MB through Pyodide and Deno outgrew its memory limit, or the time limit on a loaded machine
        assert restarted(out) and ("ran out of memory" in out or "timed out" in out), out
        still_works(interp, state_kept=False)
    assert time.monotonic() - started < 20


@pytest.mark.slow
def test_a_forged_done_with_a_malformed_or_huge_tail_is_checked_and_capped(
    interp: SandboxInterpreter, seen: Seen
) -> None:
    """``done`` may carry output not yet sent (``tail``); code can forge one: the host checks its shape
    and caps what it passes on, like ``out``."""
    exec_id = next(interp._ids) + 1  # the id of the next execution (code that guesses it right)
    tail = "['junk', [1], 5, ['stdout', 'z' * 5_000_000], ['stdout', 'more']]"
    forged = (
        f"_channel()(json.dumps({{'type': 'done', 'id': {exec_id}, 'kind': 'result', 'output': 'forged', "
        f"'tail': {tail}}}))\ntime.sleep(0.5)"
    )
    assert run(interp, forged) == "forged"  # code may end its own step with a result of its choice
    assert 0 < seen.chars < FORWARDED_MAX, seen.chars
    still_works(interp)  # the real done of that step arrives late, while the next one runs: the host ignores it


def test_a_line_without_end_on_the_protocol_channel_is_terminal_and_bounded(
    box: Box, interp: SandboxInterpreter
) -> None:
    """Before the host bounded its reads, this grew the host process by ~1 GB a second."""
    started, peak = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    with pytest.raises(SandboxCrashed, match="broke protocol") as failure:
        interp.execute("send = _channel(newline=False)\nwhile True:\n    send('y' * 1_000_000)")
    if box.backend == "local":
        assert "larger than 256 MiB" in str(failure.value)
    else:  # the runner ends each of the code's writes with a newline: the first one is no JSON
        assert "not a JSON message" in str(failure.value)
    assert time.monotonic() - started < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 1024 * 1024  # the host grew by < 1 GiB
    with pytest.raises(SandboxCrashed):  # terminal for this interpreter: its turn ends with this error
        interp.execute("1 + 1")
    box.discard()
    assert box.interpreter().execute("1 + 1") == "2"  # the next interpreter of the same factory works


def test_a_message_written_in_pieces_arrives_whole(box: Box, interp: SandboxInterpreter, seen: Seen) -> None:
    """The host reads the channel as the bytes come: half a line waits for its other half (a write cut
    short, a pause in between), it is neither a message nor lost."""
    if box.backend != "local":
        pytest.skip("the Pyodide runner ends every write of the code's with a newline")
    code = (
        "send = _channel(newline=False)\n"
        'send(\'{"type": "out", "stream": "stdout", \')\n'
        "time.sleep(0.5)\n"
        "send('\"text\": \"' + 'w' * 5000 + '\"}\\n')\n"
        "'sent'"
    )
    assert run(interp, code) == "'sent'"
    assert seen.chars == 5000
    still_works(interp)


# -- crashes ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_segfault_restarts_the_worker(box: Box, interp: SandboxInterpreter) -> None:
    out = run(interp, "print('before')\ntime.sleep(0.2)\nimport ctypes\nctypes.string_at(0)")
    if box.backend == "local":
        assert out.startswith("ERROR: before\n") and "segmentation fault" in out and "restarted" in out, out
        still_works(interp, state_kept=False)
    else:  # address 0 is ordinary WebAssembly memory
        assert out.startswith("before\nb'"), out
        still_works(interp)
    interp.execute(PRELUDE)
    out = run(interp, "print('before')\ntime.sleep(0.2)\nimport ctypes\nctypes.string_at(2 ** 32 - 8, 100)")
    assert out.startswith("ERROR: before") and restarted(out), out
    assert ("segmentation fault" if box.backend == "local" else "memory access out of bounds") in out, out
    still_works(interp, state_kept=False)
    interp.execute(PRELUDE)
    out = run(interp, "import faulthandler\nfaulthandler._sigsegv()")
    assert restarted(out) and ("segmentation fault" if box.backend == "local" else "fatal error") in out, out
    still_works(interp, state_kept=False)


@pytest.mark.slow
def test_killing_the_parent_or_itself(box: Box, interp: SandboxInterpreter) -> None:
    out = run(interp, "os.kill(os.getppid(), 9)\nsubprocess.Popen(['sleep', '60'])\nos.kill(-1, 9)\n'survived'")
    if box.backend == "local":  # the parent is the pid namespace's init, which ignores signals from inside
        assert out == "'survived'"
    else:  # Emscripten refuses signals to others
        assert "PermissionError" in out, out
    still_works(interp)
    if box.backend == "pyodide":  # through Deno: the host (its parent), anyone else, and the runner's own exits
        program = """
kills = [_attempt(lambda: _deno.kill(pid, 'SIGKILL')) for pid in (_deno.ppid, 1, -1, 0, -_deno.pid, _deno.pid + 1)]
json.dumps(kills + [_attempt(lambda: _deno.exit(1)), _attempt(lambda: js.close())])"""
        found = json.loads(eval(run(interp, program)))
        assert [r.split(":")[0] for r in found] == ["NotCapable"] * 6 + ["Error", "Error"], found
        assert all("not available in the sandbox" in r for r in found[6:]), found
        still_works(interp)
        out = run(interp, "_deno.kill(_deno.pid, 'SIGKILL')\ntime.sleep(2)")  # Deno lets a process signal itself
        assert restarted(out) and "killed by SIGKILL" in out, out
        still_works(interp, state_kept=False)
        interp.execute(PRELUDE)
        out = run(interp, "js.postMessage(js.Object.fromEntries([['exit', 0]]))\ntime.sleep(2)")  # ends Deno
        assert restarted(out) and "exited unexpectedly" in out, out
        still_works(interp, state_kept=False)
        interp.execute(PRELUDE)
    out = run(interp, "os._exit(0)")
    assert restarted(out) and "exited" in out, out
    still_works(interp, state_kept=False)
    interp.execute(PRELUDE)
    out = run(interp, "os.kill(os.getpid(), 9)")
    assert restarted(out) and ("killed" in out if box.backend == "local" else "exit(137)" in out), out
    still_works(interp, state_kept=False)


# -- turning the host's own handling of the workspace against it ---------------------------------------


def test_the_host_never_follows_a_link_the_code_made(box: Box, interp: SandboxInterpreter) -> None:
    """Before each turn the host chmods the workspace's folders, it scans artifacts/ and it saves uploads in files/:
    a link the code put in their place would have had it chmod, collect or overwrite host files. Runs last: it
    rearranges the workspace the other tests share."""
    victims = box.home.parent / "victims"
    victims.mkdir()
    (victims / "private.txt").write_text(MARKER)
    (victims / "private.txt").chmod(0o600)
    (victims / "ssh").mkdir(mode=0o700)
    (victims / "ssh" / "id_rsa").write_text(MARKER)
    upload_target = victims / "planted-upload.csv"
    program = f"""
import shutil
found = {{}}
found['memory'] = _attempt(lambda: (os.remove('/workspace/memory/MEMORIES.md'),
                                    os.symlink({str(victims / "private.txt")!r}, '/workspace/memory/MEMORIES.md')))
found['artifacts'] = _attempt(lambda: (shutil.rmtree('/workspace/artifacts'),
                                       os.symlink({str(victims / "ssh")!r}, '/workspace/artifacts')))
found['files'] = _attempt(lambda: os.symlink({str(upload_target)!r}, '/workspace/files/upload.csv'))
found['shell'] = _attempt(lambda: subprocess.run(['ln', '-s', '/etc', '/workspace/files/etc'], capture_output=True,
                                                 text=True).stderr)
json.dumps(found)"""
    found = json.loads(eval(run(interp, program)))
    if box.backend == "local":  # seccomp: no symbolic links at all
        for name in ("memory", "artifacts", "files"):
            assert "PermissionError" in found[name] and "Operation not permitted" in found[name], (name, found)
        assert "Operation not permitted" in found["shell"], found
    else:  # links in Pyodide's in-memory file system, which never reach the host
        assert found["memory"].startswith("OK") and found["files"].startswith("OK"), found
    workspace = Workspace(box.workspace).ensure()  # what the runner does before the next turn
    artifacts = workspace.scan("artifacts")  # what becomes artifact records after a turn
    saved = workspace.add_file("upload.csv", b"uploaded")  # what the API does with an upload
    assert (victims / "private.txt").stat().st_mode & 0o777 == 0o600
    assert (victims / "ssh").stat().st_mode & 0o777 == 0o700
    assert not upload_target.exists() and (box.workspace / saved).read_bytes() == b"uploaded"
    assert not any(MARKER in (box.workspace / path).read_text(errors="replace") for path in artifacts), artifacts
    assert not any(
        os.path.islink(box.workspace / name) for name in ("files", "artifacts", "memory", "memory/MEMORIES.md", saved)
    )
    interp.execute(PRELUDE)
    still_works(interp)
