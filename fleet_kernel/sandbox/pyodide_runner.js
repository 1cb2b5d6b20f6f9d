// Fleet's Pyodide runner: hosts fleet_kernel/sandbox/runtime.py in Pyodide and speaks its protocol
// as JSON lines on stdin/stdout, like the local backend's worker process.
//
//   deno run --cached-only --no-prompt --allow-read=<this file>,<runtime.py>,<DENO_DIR>,<workspace> \
//     pyodide_runner.js '{"runtime": ..., "workspace": ..., "max_output_bytes": ..., "max_file_bytes": ...}'
//
// Why two threads: Pyodide runs in a Worker whose Python blocks in one synchronous runPython call
// (serve()), because only synchronous Python can be interrupted through an interrupt buffer. The
// main thread owns stdin: it forwards messages through a SharedArrayBuffer mailbox the worker waits
// on with Atomics.wait (which also blocks sandboxed code while a host tool runs), turns "interrupt"
// into SIGINT on the interrupt buffer, and raises SIGUSR1 every 50 ms while code runs so the
// runtime can flush buffered output (Pyodide has no threads for a flusher). The worker writes its
// messages straight to stdout. The session workspace is copied into Pyodide's /workspace before
// each execution, and changed files under artifacts/ and memory/ go back to the host as
// workspace_file / workspace_delete messages before "done" (Deno may not write anything itself).
//
// No remote imports: Pyodide comes from the npm cache prefetched at install time (--cached-only).
// Start-up: a memory snapshot of an initialised Pyodide, made once at install time ('{"make_snapshot":
// path}', the only run with a write permission), starts the interpreter in ~0.6 s instead of ~3 s.
// _makeSnapshot/_loadSnapshot are Pyodide's experimental API, hence the exact version pin.

const WORKER_NAME = "fleet-pyodide";
const MAILBOX_BYTES = 1 << 20; // larger messages cross in several chunks
const [FLAG, LENGTH, MORE, RUNNING] = [0, 1, 2, 3]; // indices in the control array
const SIGINT = 2;
const SIGUSR1 = 10; // asks the runtime to flush its output buffer
const FLUSH_MS = 50;
const SNAPSHOT_TIMEOUT_MS = 15000; // a snapshot start takes < 1 s idle, ~3 s on a loaded machine

// ---------------------------------------------------------------------------------------- main

async function runMain() {
  const config = JSON.parse(Deno.args[0] ?? "{}");
  if (config.make_snapshot) return await makeSnapshot(config.make_snapshot);
  const control = new Int32Array(new SharedArrayBuffer(4 * 4));
  const data = new Uint8Array(new SharedArrayBuffer(MAILBOX_BYTES));
  const interrupt = new Int32Array(new SharedArrayBuffer(4));
  const worker = new Worker(import.meta.url, { type: "module", name: WORKER_NAME });
  worker.onerror = (event) => {
    event.preventDefault();
    console.error(`fleet pyodide runner: the worker failed: ${event.message}`);
    Deno.exit(3);
  };
  worker.onmessage = (event) => Deno.exit(event.data?.exit ?? 0);
  worker.postMessage({ config, control, data, interrupt });

  setInterval(() => {
    if (Atomics.load(control, RUNNING) === 1) Atomics.compareExchange(interrupt, 0, 0, SIGUSR1);
  }, FLUSH_MS);

  const mailbox = new Mailbox(control, data);
  for await (const line of readLines(Deno.stdin.readable)) {
    if (isInterrupt(line)) {
      if (Atomics.load(control, RUNNING) === 1) {
        Atomics.store(interrupt, 0, SIGINT);
        Atomics.notify(control, FLAG); // wakes a worker that waits for a tool reply
      }
    } else {
      mailbox.put(line);
    }
  }
  Deno.exit(0); // the host went away
}

function isInterrupt(line) {
  if (line.length > 200) return false;
  try {
    return JSON.parse(new TextDecoder().decode(line)).type === "interrupt";
  } catch {
    return false;
  }
}

async function* readLines(readable) {
  let parts = [];
  for await (const chunk of readable) {
    let start = 0;
    for (let end = chunk.indexOf(10); end !== -1; end = chunk.indexOf(10, start)) {
      parts.push(chunk.subarray(start, end));
      yield concat(parts);
      parts = [];
      start = end + 1;
    }
    if (start < chunk.length) parts.push(chunk.slice(start));
  }
  if (parts.length) yield concat(parts);
}

function concat(parts) {
  if (parts.length === 1) return parts[0];
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let offset = 0;
  for (const part of parts) {
    out.set(part, offset);
    offset += part.length;
  }
  return out;
}

/** Main-thread end of the mailbox: hands messages to the worker in order, chunk by chunk. */
class Mailbox {
  constructor(control, data) {
    this.control = control;
    this.data = data;
    this.queue = [];
    this.pumping = false;
  }

  put(message) {
    this.queue.push(message);
    if (!this.pumping) this.pump();
  }

  async pump() {
    this.pumping = true;
    const { control, data } = this;
    while (this.queue.length) {
      const message = this.queue.shift();
      let offset = 0;
      do {
        while (Atomics.load(control, FLAG) !== 0) await Atomics.waitAsync(control, FLAG, 1).value;
        const size = Math.min(data.length, message.length - offset);
        data.set(message.subarray(offset, offset + size));
        offset += size;
        control[LENGTH] = size;
        control[MORE] = offset < message.length ? 1 : 0;
        Atomics.store(control, FLAG, 1);
        Atomics.notify(control, FLAG);
      } while (offset < message.length);
    }
    this.pumping = false;
  }
}

async function importPyodide() {
  return (await import("npm:pyodide@0.29.4/pyodide.js")).default.loadPyodide;
}

async function makeSnapshot(path) {
  const loadPyodide = await importPyodide();
  const pyodide = await loadPyodide({ _makeSnapshot: true });
  Deno.writeFileSync(`${path}.partial`, pyodide.makeMemorySnapshot());
  Deno.renameSync(`${path}.partial`, path);
  Deno.exit(0);
}

// -------------------------------------------------------------------------------------- worker

async function runWorker({ config, control, data, interrupt }) {
  // Anything Pyodide or sandboxed code logs must never reach stdout, which carries the protocol.
  for (const name of ["log", "info", "debug", "trace", "dir", "table"]) console[name] = console.error;
  // Sandboxed code reaches JS through the js module: it must not end the worker behind the host's back
  // (the main thread would wait forever); a runaway is the host's to kill.
  const refuse = (what) => () => {
    throw new Error(`${what} is not available in the sandbox`);
  };
  Deno.exit = refuse("Deno.exit");
  self.close = refuse("close");
  const pyodide = await startPyodide(config.snapshot);
  pyodide.setInterruptBuffer(interrupt);
  const stdout = new StdoutWriter();
  const mirror = new WorkspaceMirror(pyodide.FS, config.workspace, config.max_file_bytes, (m) => stdout.send(m));
  if (config.workspace_bytes) mirror.limit(config.workspace_bytes, config.workspace_files);
  // C-level writes to fds 1 and 2 arrive here without the GIL, so they cannot go through the runtime's
  // streams: they are streamed as they are (os.write, the common case, is rerouted in BOOTSTRAP),
  // capped per execution like the runtime's own output (sys.__stdout__ reaches this path).
  const rawOutput = new CappedOutput(config.max_output_bytes ?? 1000000, (m) => stdout.send(m));
  for (const [fd, name] of [[1, "stdout"], [2, "stderr"]]) {
    const decoder = new TextDecoder();
    const write = (bytes) => {
      const text = decoder.decode(bytes, { stream: true });
      if (Atomics.load(control, RUNNING) === 1) rawOutput.write(name, text);
      else console.error(text);
      return bytes.length;
    };
    if (fd === 1) pyodide.setStdout({ write });
    else pyodide.setStderr({ write });
  }
  const runtimeSource = Deno.readTextFileSync(config.runtime);
  mirror.syncIn();
  pyodide.registerJsModule("_fleet_bridge", {
    config: JSON.stringify(config),
    runtime_source: runtimeSource,
    write: (text) => stdout.write(text),
    receive: (inToolCall) => receive(control, data, interrupt, inToolCall),
    begin_execution: () => {
      Atomics.store(interrupt, 0, 0); // an interrupt meant for an earlier execution
      rawOutput.reset();
      mirror.syncIn();
      Atomics.store(control, RUNNING, 1);
    },
    end_execution: () => {
      Atomics.store(control, RUNNING, 0);
      mirror.syncOut();
    },
    wait: (seconds) => Atomics.wait(interrupt, 0, 0, Math.max(0, seconds * 1000)),
  });
  pyodide.runPython(BOOTSTRAP, { filename: "<fleet bootstrap>" });
}

async function startPyodide(snapshot) {
  const loadPyodide = await importPyodide();
  if (snapshot) {
    // A damaged snapshot fails inside Emscripten's instantiation, whose promise then never settles.
    let timer;
    const stuck = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error("it did not load within 15 s")), SNAPSHOT_TIMEOUT_MS);
    });
    try {
      return await Promise.race([loadPyodide({ stdin: () => null, _loadSnapshot: Deno.readFileSync(snapshot) }), stuck]);
    } catch (error) {
      console.error(`fleet pyodide runner: snapshot ${snapshot} unusable, starting without it: ${error}`);
    } finally {
      clearTimeout(timer);
    }
  }
  return await loadPyodide({ stdin: () => null });
}

/** Worker end of the mailbox: blocks until a whole message (or an interrupt during a tool call) is there. */
function receive(control, data, interrupt, inToolCall) {
  const parts = [];
  for (;;) {
    while (Atomics.load(control, FLAG) === 0) {
      if (inToolCall && !parts.length && Atomics.load(interrupt, 0) === SIGINT) { // never mid-message
        Atomics.store(interrupt, 0, 0);
        return new TextEncoder().encode('{"type": "interrupt"}');
      }
      Atomics.wait(control, FLAG, 0);
    }
    parts.push(data.slice(0, control[LENGTH]));
    const more = control[MORE] === 1;
    Atomics.store(control, FLAG, 0);
    Atomics.notify(control, FLAG);
    if (!more) return concat(parts);
  }
}

/** Protocol lines to the host, written synchronously so they keep their order. */
class StdoutWriter {
  constructor() {
    this.encoder = new TextEncoder();
  }

  send(message) {
    this.write(JSON.stringify(message));
  }

  write(text) {
    let bytes = this.encoder.encode(text + "\n");
    while (bytes.length) bytes = bytes.subarray(Deno.stdout.writeSync(bytes));
  }
}

/** "out" messages for C-level output: at most `limit` characters per execution, in chunks of 256 KiB. */
class CappedOutput {
  static CHUNK = 256 * 1024;

  constructor(limit, send) {
    this.limit = limit;
    this.send = send;
    this.reset();
  }

  reset() {
    this.total = 0;
    this.truncated = false;
  }

  write(stream, text) {
    if (this.total >= this.limit) {
      if (this.truncated) return;
      this.truncated = true;
      text = `\n[output truncated: more than ${this.limit} characters]\n`;
    } else if (this.total + text.length > this.limit) {
      text = text.slice(0, this.limit - this.total);
    }
    this.total += text.length;
    for (let start = 0; start < text.length; start += CappedOutput.CHUNK) {
      this.send({ type: "out", stream, text: text.slice(start, start + CappedOutput.CHUNK) });
    }
  }
}

/** Mirrors the host workspace into Pyodide's /workspace and reports what the code changed. */
class WorkspaceMirror {
  static ROOT = "/workspace";
  static WRITABLE = ["artifacts", "memory"]; // what the sandbox may change on the host

  constructor(fs, hostRoot, maxFileBytes, send) {
    this.fs = fs;
    this.hostRoot = hostRoot;
    this.maxFileBytes = maxFileBytes;
    this.send = send;
    this.host = new Map(); // path -> host signature at the last copy in
    this.local = new Map(); // path -> /workspace signature at the last sync
    fs.mkdirTree(WorkspaceMirror.ROOT);
    for (const sub of ["files", ...WorkspaceMirror.WRITABLE]) fs.mkdirTree(`${WorkspaceMirror.ROOT}/${sub}`);
  }

  /**
   * The workspace quota inside Pyodide's filesystem: growing a file or making an entry under /workspace
   * past it fails with ENOSPC, an OSError code can handle. Usage is counted as it grows and recounted
   * exactly (deletions included) only when the count says the quota is reached.
   */
  limit(maxBytes, maxEntries) {
    const fs = this.fs;
    const MEMFS = fs.filesystems.MEMFS;
    const root = WorkspaceMirror.ROOT;
    const inside = (node) => {
      const path = fs.getPath(node);
      return path === root || path.startsWith(`${root}/`);
    };
    const recount = () => {
      let bytes = 0, entries = 0;
      const walk = (dir) => {
        for (const name of fs.readdir(dir)) {
          if (name === "." || name === "..") continue;
          const stat = fs.lstat(`${dir}/${name}`);
          entries += 1;
          if (fs.isDir(stat.mode)) walk(`${dir}/${name}`);
          else bytes += stat.size;
        }
      };
      walk(root);
      return { bytes, entries };
    };
    let used = recount();
    const full = () => new fs.ErrnoError(51); // ENOSPC (errno.ENOSPC in Pyodide's Python)
    const fileOps = MEMFS.ops_table.file.stream;
    const write = fileOps.write;
    fileOps.write = function (stream, buffer, offset, length, position, canOwn) {
      const grow = Math.max(0, position + length - (stream.node.usedBytes ?? 0));
      if (grow > 0 && inside(stream.node)) {
        if (used.bytes + grow > maxBytes) used = recount();
        if (used.bytes + grow > maxBytes) throw full();
        used.bytes += grow;
      }
      return write.call(this, stream, buffer, offset, length, position, canOwn);
    };
    const dirOps = MEMFS.ops_table.dir.node;
    const mknod = dirOps.mknod;
    dirOps.mknod = function (parent, name, mode, dev) {
      if (inside(parent)) {
        if (used.entries + 1 > maxEntries) used = recount();
        if (used.entries + 1 > maxEntries) throw full();
        used.entries += 1;
      }
      return mknod.call(this, parent, name, mode, dev);
    };
  }

  /** Copy new and changed host files in; drop files the host deleted that the code left alone. */
  syncIn() {
    if (!this.hostRoot) return;
    const seen = new Set();
    for (const [path, info] of walkHost(this.hostRoot, "")) {
      seen.add(path);
      const signature = `${info.mtime?.getTime()}:${info.size}`;
      if (this.host.get(path) === signature || info.size > this.maxFileBytes) continue;
      this.attempt(path, "copied in", () => {
        const target = `${WorkspaceMirror.ROOT}/${path}`;
        this.fs.mkdirTree(target.slice(0, target.lastIndexOf("/")));
        this.fs.writeFile(target, Deno.readFileSync(`${this.hostRoot}/${path}`));
        this.host.set(path, signature);
        this.local.set(path, this.signature(path));
      });
    }
    for (const path of [...this.host.keys()]) {
      if (seen.has(path)) continue;
      if (this.local.get(path) === this.signature(path)) {
        this.attempt(path, "removed", () => this.fs.unlink(`${WorkspaceMirror.ROOT}/${path}`));
      }
      this.host.delete(path);
      this.local.delete(path);
    }
  }

  /** Send files the code created or changed under artifacts/ and memory/, and the ones it deleted. */
  syncOut() {
    const seen = new Set();
    for (const sub of WorkspaceMirror.WRITABLE) {
      for (const [path, stat] of walkLocal(this.fs, `${WorkspaceMirror.ROOT}/${sub}`, sub)) {
        seen.add(path);
        const signature = `${stat.mtime.getTime()}:${stat.size}`;
        if (this.local.get(path) === signature) continue;
        this.local.set(path, signature);
        if (stat.size > this.maxFileBytes) {
          const mb = (this.maxFileBytes / 1048576).toFixed(0);
          this.send({ type: "out", stream: "stderr", text: `[fleet] /workspace/${path} was not saved: larger than ${mb} MB\n` });
          continue;
        }
        this.attempt(path, "saved", () => {
          const bytes = this.fs.readFile(`${WorkspaceMirror.ROOT}/${path}`);
          this.send({ type: "workspace_file", path, data: bytes.toBase64() });
        });
      }
    }
    for (const path of [...this.local.keys()]) {
      if (seen.has(path) || !WorkspaceMirror.WRITABLE.some((sub) => path.startsWith(`${sub}/`))) continue;
      this.local.delete(path);
      this.host.delete(path);
      this.send({ type: "workspace_delete", path });
    }
  }

  /** One file's sync; a failure is reported to the code's stderr instead of ending the worker. */
  attempt(path, what, action) {
    try {
      action();
    } catch (error) {
      const text = `[fleet] /workspace/${path} could not be ${what}: ${error?.message ?? error}\n`;
      this.send({ type: "out", stream: "stderr", text });
    }
  }

  signature(path) {
    try {
      const stat = this.fs.stat(`${WorkspaceMirror.ROOT}/${path}`);
      return `${stat.mtime.getTime()}:${stat.size}`;
    } catch {
      return null;
    }
  }
}

function* walkHost(root, prefix) {
  let entries;
  try {
    entries = [...Deno.readDirSync(prefix ? `${root}/${prefix}` : root)];
  } catch {
    return; // gone, or not readable: nothing to mirror
  }
  for (const entry of entries) {
    const path = prefix ? `${prefix}/${entry.name}` : entry.name;
    if (entry.isDirectory) yield* walkHost(root, path);
    else if (entry.isFile) {
      let info;
      try {
        info = Deno.lstatSync(`${root}/${path}`); // symlinks are skipped
      } catch {
        continue; // gone, or a name that is not UTF-8 (Deno cannot name it): not mirrored
      }
      if (info.isFile) yield [path, info];
    }
  }
}

function* walkLocal(fs, dir, prefix) {
  let names;
  try {
    names = fs.readdir(dir);
  } catch {
    return;
  }
  for (const name of names) {
    if (name === "." || name === "..") continue;
    const stat = fs.lstat(`${dir}/${name}`);
    if (fs.isDir(stat.mode)) yield* walkLocal(fs, `${dir}/${name}`, `${prefix}/${name}`);
    else if (fs.isFile(stat.mode)) yield [`${prefix}/${name}`, stat];
  }
}

// Runs inside Pyodide: loads runtime.py as a module and serves the protocol until shutdown (on EOF on
// stdin the main thread ends the process).
const BOOTSTRAP = String.raw`
import inspect, json, os, signal, sys, time, types

import _fleet_bridge as bridge

config = json.loads(bridge.config)
runtime = types.ModuleType("fleet_runtime")
sys.modules["fleet_runtime"] = runtime
exec(compile(bridge.runtime_source, "<fleet runtime>", "exec"), runtime.__dict__)
in_tool_call = False


def send(message):
    global in_tool_call
    kind = message.get("type")
    if kind == runtime.MessageType.DONE:
        bridge.end_execution()
    elif kind == runtime.MessageType.TOOL_CALL:
        in_tool_call = True
    bridge.write(json.dumps(message, default=runtime._json_default))


def receive():
    global in_tool_call
    data = bridge.receive(in_tool_call)
    in_tool_call = False
    message = json.loads(data.to_bytes())
    if message.get("type") == runtime.MessageType.EXECUTE:
        bridge.begin_execution()
    return message


def sleep(seconds):
    """time.sleep that an interrupt can stop (Pyodide's blocks the thread, deaf to signals)."""
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        bridge.wait(min(left, 0.05))


def fd_write(fd, data, _write=os.write):
    """os.write to fds 1 and 2 goes through the runtime's streams, so it is captured like print()."""
    if fd not in (1, 2):
        return _write(fd, data)
    (sys.stdout if fd == 1 else sys.stderr).write(bytes(data).decode("utf-8", "replace"))
    return len(data)


time.sleep = sleep
os.write = fd_write
os.environ["HOME"] = "/workspace"
os.chdir("/workspace")
options = {"max_output_bytes": config.get("max_output_bytes", 1_000_000), "threaded": False}
if "flush_signal" in inspect.signature(runtime.serve).parameters:  # else output flushes only as it is written
    options["flush_signal"] = signal.SIGUSR1
runtime.serve(send, receive, **options)
`;

// Last, so every class and constant above is initialised.
if (globalThis.name === WORKER_NAME) {
  self.onmessage = (event) => {
    self.onmessage = null;
    runWorker(event.data).then(
      () => self.postMessage({ exit: 0 }),
      (error) => {
        console.error(`fleet pyodide runner: ${error?.stack ?? error}`);
        self.postMessage({ exit: 3 });
      },
    );
  };
} else {
  await runMain();
}
