"""A loopback fake of Daytona's API and toolbox, for driving the real, unmodified SDK in tests.

    with FakeDaytona() as fake:
        client = Daytona(DaytonaConfig(api_key=fake.api_key, api_url=fake.api_url))

Serves what SDK 0.226.1 calls (``test_sdk_paths_match_fake_routes`` checks it): sandboxes (create,
get, list by labels, start, stop, delete, auto-stop, labels), volumes, ``/config``, and under
``<toolbox>/<sandbox id>``: interpreter contexts and the execute WebSocket (streamed frames, FIFO per
context, timeout -> SIGINT -> 2 s grace -> close 4008, slow consumer -> 1008), ``process/execute``,
``process/code-run``, bulk upload/download (multipart, per-file errors), ``files/info`` and
``DELETE /files``.
Every request is recorded in ``requests``; ``fail(method, path_part, status)`` injects errors.
Runs on its own thread and event loop, on 127.0.0.1 port 0.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web
from fake_sandbox import FakeSandbox, Mount, now

ORG = "org-fake"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


RECORDED = web.RequestKey("recorded", Recorded)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"statusCode": status, "message": message, "error": message}, status=status)


class FakeDaytona:
    """The fake server; state lives on the server loop and is read by tests after calls return."""

    def __init__(self, *, api_key: str = "fake-daytona-key", root: Path | None = None, grace_s: float = 2.0) -> None:
        self.api_key = api_key
        self.grace_s = grace_s
        self._tmp = None if root else tempfile.TemporaryDirectory(prefix="fake-daytona-")
        self.root = root or Path(self._tmp.name)  # type: ignore[union-attr]
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.requests: list[Recorded] = []
        self.failures: list[list[Any]] = []  # [method, path part, status, message, remaining]
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-daytona", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/api"

    @property
    def toolbox_url(self) -> str:
        return f"{self.base_url}/toolbox"

    # -- test controls --------------------------------------------------------------------------

    def fail(self, method: str, path_part: str, status: int, message: str = "injected failure", times: int = 1) -> None:
        """The next ``times`` requests whose path contains ``path_part`` answer ``status``."""
        self.failures.append([method.upper(), path_part, status, message, times])

    def matches(self, method: str, path: str) -> bool:
        """Whether a route of this fake answers ``method path`` (checked against the SDK's own paths)."""
        assert self._runner is not None
        for route in self._runner.app.router.routes():
            info = route.resource.get_info() if route.resource is not None else {}
            pattern = info.get("pattern")
            found = pattern.fullmatch(path) if pattern is not None else info.get("path") == path
            if found and route.method in (method, "*"):
                return True
        return False

    def call(self, coro: Any) -> Any:
        """Run a coroutine on the server loop (for state changes from test code)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    # -- server lifecycle -----------------------------------------------------------------------

    def start(self) -> FakeDaytona:
        self._thread.start()
        self.call(self._start())
        return self

    async def _start(self) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=1024**3)
        app.add_routes(self._routes())
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        async def shutdown() -> None:
            for sandbox in list(self.sandboxes.values()):
                await sandbox.stop_processes()
            if self._runner is not None:
                await self._runner.cleanup()

        try:
            self.call(shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if self._tmp is not None:
                self._tmp.cleanup()

    def __enter__(self) -> FakeDaytona:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        multipart = request.content_type.startswith("multipart/")
        body = await request.read() if request.can_read_body and not multipart else b""
        request[RECORDED] = Recorded(request.method, request.path, dict(request.headers), body)
        self.requests.append(request[RECORDED])
        for failure in self.failures:
            method, part, status, message, remaining = failure
            if remaining > 0 and method == request.method and part in request.path:
                failure[4] -= 1
                return _error(status, message)
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error(401, "Invalid credentials")
        try:
            return await handler(request)
        except KeyError as exc:
            return _error(404, f"not found: {exc.args[0]}")

    def _routes(self) -> list[web.RouteDef]:
        api, box = "/api", "/toolbox/{sid}"
        return [
            web.post(f"{api}/sandbox", self.create_sandbox),
            web.get(f"{api}/sandbox", self.list_sandboxes),
            web.get(f"{api}/sandbox/{{sid}}", self.get_sandbox),
            web.delete(f"{api}/sandbox/{{sid}}", self.delete),
            web.post(f"{api}/sandbox/{{sid}}/start", self.start_sandbox),
            web.post(f"{api}/sandbox/{{sid}}/stop", self.stop_sandbox),
            web.post(f"{api}/sandbox/{{sid}}/autostop/{{n}}", self.autostop),
            web.put(f"{api}/sandbox/{{sid}}/labels", self.labels),
            web.get(f"{api}/sandbox/{{sid}}/toolbox-proxy-url", self.proxy_url),
            web.post(f"{api}/sandbox/{{sid}}/last-activity", self.activity),
            web.get(f"{api}/volumes", self.list_volumes),
            web.post(f"{api}/volumes", self.create_volume),
            web.get(f"{api}/volumes/by-name/{{name}}", self.volume_by_name),
            web.get(f"{api}/volumes/{{vid}}", self.get_volume),
            web.delete(f"{api}/volumes/{{vid}}", self.delete_volume),
            web.get(f"{api}/config", self.config),
            web.post(f"{box}/process/interpreter/context", self.create_context),
            web.get(f"{box}/process/interpreter/context", self.list_contexts),
            web.delete(f"{box}/process/interpreter/context/{{cid}}", self.delete_context),
            web.get(f"{box}/process/interpreter/execute", self.execute),
            web.post(f"{box}/process/execute", self.process_execute),
            web.post(f"{box}/process/code-run", self.code_run),
            web.post(f"{box}/files/bulk-upload", self.upload),
            web.post(f"{box}/files/bulk-download", self.download),
            web.get(f"{box}/files/info", self.file_info),
            web.delete(f"{box}/files", self.delete_file),
        ]

    # -- sandboxes ------------------------------------------------------------------------------

    def _sandbox(self, request: web.Request) -> FakeSandbox:
        key = request.match_info["sid"]
        for sandbox in self.sandboxes.values():
            if key in (sandbox.id, sandbox.name):
                return sandbox
        raise KeyError(f"sandbox {key}")

    def dto(self, sb: FakeSandbox) -> dict[str, Any]:
        return {
            "id": sb.id,
            "organizationId": ORG,
            "name": sb.name,
            "snapshot": "fake-python",
            "user": "daytona",
            "env": sb.env,
            "labels": sb.labels,
            "public": False,
            "networkBlockAll": False,
            "kvm": False,
            "target": "local",
            "cpu": 1,
            "gpu": 0,
            "memory": 1,
            "disk": 3,
            "state": sb.state,
            "desiredState": sb.state,
            "autoStopInterval": sb.auto_stop_interval,
            "autoArchiveInterval": sb.auto_archive_interval,
            "autoDeleteInterval": sb.auto_delete_interval,
            "volumes": sb.volumes,
            "createdAt": sb.created_at,
            "updatedAt": sb.updated_at,
            "lastActivityAt": sb.updated_at,
            "toolboxProxyUrl": self.toolbox_url,
        }

    async def create_sandbox(self, request: web.Request) -> web.Response:
        body = await request.json()
        sid = uuid.uuid4().hex
        mounts, volumes = [], []
        for vol in body.get("volumes") or []:
            volume = self.volumes[vol["volumeId"]]
            source = Path(volume["_dir"]) / (vol.get("subpath") or "").strip("/")
            mounts.append(Mount(vol["mountPath"], source))
            volumes.append({"volumeId": vol["volumeId"], "mountPath": vol["mountPath"], "subpath": vol.get("subpath")})
        sandbox = FakeSandbox(
            id=sid,
            name=body.get("name") or sid,
            root=self.root / "sandboxes" / sid,
            env=dict(body.get("env") or {}),
            labels=dict(body.get("labels") or {}),
            mounts=mounts,
            volumes=volumes,
            auto_stop_interval=body.get("autoStopInterval", 15),
            auto_archive_interval=body.get("autoArchiveInterval", 10080),
            auto_delete_interval=body.get("autoDeleteInterval", -1),
        )
        self.sandboxes[sid] = sandbox
        return web.json_response(self.dto(sandbox))

    async def list_sandboxes(self, request: web.Request) -> web.Response:
        wanted = json.loads(request.query.get("labels") or "{}")
        items = [
            self.dto(sb) for sb in self.sandboxes.values() if all(sb.labels.get(k) == v for k, v in wanted.items())
        ]
        return web.json_response({"items": items, "nextCursor": None})

    async def get_sandbox(self, request: web.Request) -> web.Response:
        return web.json_response(self.dto(self._sandbox(request)))

    async def delete(self, request: web.Request) -> web.Response:
        sandbox = self._sandbox(request)
        await sandbox.stop_processes()
        sandbox.state = "destroyed"
        del self.sandboxes[sandbox.id]
        shutil.rmtree(sandbox.root, ignore_errors=True)
        return web.json_response(self.dto(sandbox))

    async def start_sandbox(self, request: web.Request) -> web.Response:
        sandbox = self._sandbox(request)
        sandbox.state, sandbox.updated_at = "started", now()
        return web.json_response(self.dto(sandbox))

    async def stop_sandbox(self, request: web.Request) -> web.Response:
        sandbox = self._sandbox(request)
        await sandbox.stop_processes()  # a stop ends every REPL: variables do not survive it
        sandbox.state, sandbox.updated_at = "stopped", now()
        return web.json_response(self.dto(sandbox))

    async def autostop(self, request: web.Request) -> web.Response:
        sandbox = self._sandbox(request)
        sandbox.auto_stop_interval = int(request.match_info["n"])
        return web.json_response(self.dto(sandbox))

    async def labels(self, request: web.Request) -> web.Response:
        sandbox = self._sandbox(request)
        sandbox.labels = dict((await request.json())["labels"])
        return web.json_response({"labels": sandbox.labels})

    async def proxy_url(self, request: web.Request) -> web.Response:
        self._sandbox(request)
        return web.json_response({"url": self.toolbox_url})

    async def activity(self, request: web.Request) -> web.Response:
        self._sandbox(request).updated_at = now()
        return web.Response(status=201)

    async def config(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "version": "fake",
                "oidc": {"issuer": "", "clientId": "", "audience": "", "provider": ""},
                "linkedAccountsEnabled": False,
                "announcements": {},
                "proxyTemplateUrl": "",
                "proxyToolboxUrl": self.toolbox_url,
                "defaultSnapshot": "fake-python",
                "dashboardUrl": "",
                "maxAutoArchiveInterval": 43200,
                "maintananceMode": False,
                "environment": "fake",
            }
        )

    # -- volumes --------------------------------------------------------------------------------

    def _volume_dto(self, volume: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in volume.items() if not k.startswith("_")}

    async def list_volumes(self, request: web.Request) -> web.Response:
        return web.json_response([self._volume_dto(v) for v in self.volumes.values()])

    async def create_volume(self, request: web.Request) -> web.Response:
        name = (await request.json())["name"]
        vid = uuid.uuid4().hex
        folder = self.root / "volumes" / vid
        folder.mkdir(parents=True)
        self.volumes[vid] = {
            "id": vid,
            "name": name,
            "organizationId": ORG,
            "state": "ready",
            "createdAt": now(),
            "updatedAt": now(),
            "lastUsedAt": None,
            "errorReason": None,
            "_dir": str(folder),
        }
        return web.json_response(self._volume_dto(self.volumes[vid]))

    async def volume_by_name(self, request: web.Request) -> web.Response:
        for volume in self.volumes.values():
            if volume["name"] == request.match_info["name"]:
                return web.json_response(self._volume_dto(volume))
        return _error(404, f"Volume with name {request.match_info['name']} not found")

    async def get_volume(self, request: web.Request) -> web.Response:
        return web.json_response(self._volume_dto(self.volumes[request.match_info["vid"]]))

    async def delete_volume(self, request: web.Request) -> web.Response:
        volume = self.volumes.pop(request.match_info["vid"])
        shutil.rmtree(volume["_dir"], ignore_errors=True)
        return web.Response(status=200)

    # -- toolbox: interpreter -------------------------------------------------------------------

    def _started(self, request: web.Request) -> FakeSandbox:
        sandbox = self._sandbox(request)
        if sandbox.state != "started":
            raise web.HTTPConflict(
                text=json.dumps({"statusCode": 409, "message": f"sandbox is {sandbox.state}"}),
                content_type="application/json",
            )
        return sandbox

    async def create_context(self, request: web.Request) -> web.Response:
        body = await request.json() if request.body_exists else {}
        context = await self._started(request).create_context(body.get("cwd"))
        context.grace_s = self.grace_s
        return web.json_response(context.info())

    async def list_contexts(self, request: web.Request) -> web.Response:
        contexts = [c.info() for c in self._started(request).contexts.values() if c.id != "default"]
        return web.json_response({"contexts": contexts})

    async def delete_context(self, request: web.Request) -> web.Response:
        sandbox = self._started(request)
        context = sandbox.contexts.pop(request.match_info["cid"], None)
        if context is None:
            return _error(404, "context not found")
        await context.shutdown()
        return web.json_response({"message": "Context deleted successfully"})

    async def execute(self, request: web.Request) -> web.WebSocketResponse:
        sandbox = self._started(request)
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        first = await ws.receive()
        if first.type != WSMsgType.TEXT:
            await ws.close(code=1002, message=b"failed to read first message")
            return ws
        req = json.loads(first.data)
        self.requests.append(Recorded("WS", request.path, dict(request.headers), first.data.encode()))
        context_id = req.get("contextId")
        context = sandbox.contexts.get(context_id) if context_id else await sandbox.default_context()
        if context is None or not context.active:
            await ws.close(code=1008, message=b"context is not active" if context else b"context not found")
            return ws
        context.grace_s = self.grace_s
        timeout = float(req["timeout"]) if req.get("timeout") is not None else 600.0

        async def close(code: int, message: str) -> None:
            await ws.close(code=code, message=message.encode())

        async def answer_pings() -> None:  # aiohttp replies to pings while reading; the SDK pings every 20 s
            async for _ in ws:
                pass

        reader = asyncio.get_running_loop().create_task(answer_pings())
        try:
            await context.execute(req["code"], req.get("envs"), timeout, ws.send_str, close)
        finally:
            reader.cancel()
        return ws

    # -- toolbox: processes and files -----------------------------------------------------------

    async def process_execute(self, request: web.Request) -> web.Response:
        body = await request.json()
        result = await self._started(request).run_command(
            body["command"], body.get("cwd"), body.get("envs"), body.get("timeout")
        )
        if result is None:
            return _error(408, f"Command execution timed out after {body.get('timeout')} seconds.")
        return web.json_response({"exitCode": result[0], "result": result[1]})

    async def code_run(self, request: web.Request) -> web.Response:
        body = await request.json()
        sandbox = self._started(request)
        script = sandbox.host_path(f"/tmp/code-run-{uuid.uuid4().hex}.py")
        script.write_text(body["code"])
        argv = " ".join(f"'{a}'" for a in body.get("argv") or [])
        command = f"python3 /tmp/{script.name} {argv}".strip()
        result = await sandbox.run_command(command, None, body.get("envs"), body.get("timeout"))
        script.unlink(missing_ok=True)
        if result is None:
            return _error(408, "Code execution timed out")
        return web.json_response({"exitCode": result[0], "result": result[1]})

    async def upload(self, request: web.Request) -> web.Response:
        sandbox = self._started(request)
        paths: dict[str, str] = {}
        data: dict[str, bytes] = {}
        async for part in await request.multipart():
            name = part.name or ""  # type: ignore[union-attr]
            payload = await part.read()  # type: ignore[union-attr]
            index = name[len("files[") : name.index("]")]
            (paths if name.endswith(".path") else data)[index] = payload.decode() if name.endswith(".path") else payload
            request[RECORDED].body += bytes(payload)
        for index, dest in paths.items():
            target = sandbox.host_path(dest)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data.get(index, b""))
        return web.Response(status=200)

    async def download(self, request: web.Request) -> web.StreamResponse:
        """One part per path, as the daemon writes it: ``name="file"`` with the bytes or ``name="error"``."""
        sandbox = self._started(request)
        boundary = uuid.uuid4().hex
        body = bytearray()
        for path in (await request.json())["paths"]:
            target = sandbox.host_path(path)
            if target.is_file():
                name, kind, content = "file", "application/octet-stream", target.read_bytes()
            else:
                error = {"message": f"file not found: {path}", "statusCode": 404, "code": "FILE_NOT_FOUND"}
                name, kind, content = "error", "application/json", json.dumps(error).encode()
            body += (
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{path}"\r\n'
                f"Content-Type: {kind}\r\nContent-Length: {len(content)}\r\n\r\n"
            ).encode()
            body += content + b"\r\n"
        body += f"--{boundary}--\r\n".encode()
        return web.Response(body=bytes(body), headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})

    async def file_info(self, request: web.Request) -> web.Response:
        target = self._started(request).host_path(request.query["path"])
        if not target.exists():
            return _error(404, f"file not found: {request.query['path']}")
        stat = target.stat()
        return web.json_response(
            {
                "name": target.name,
                "isDir": target.is_dir(),
                "size": stat.st_size,
                "modTime": now(),
                "mode": oct(stat.st_mode),
                "permissions": oct(stat.st_mode)[-3:],
                "owner": "daytona",
                "group": "daytona",
            }
        )

    async def delete_file(self, request: web.Request) -> web.Response:
        target = self._started(request).host_path(request.query["path"])
        if target.is_dir():
            if request.query.get("recursive") != "true":
                return _error(400, "directory not empty; use recursive")
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        else:
            return _error(404, "file not found")
        return web.Response(status=204)
