"""Start the kvviz app (`python app.py`) as a subprocess on a free localhost port, for the API and browser tests.

The app runs exactly as on a Space (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT from the environment), with
KVVIZ_MODEL=tiny-llama by default so every model call takes milliseconds. The server's log goes to a temporary
file whose tail is shown when the app fails to come up.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 180
CHROMIUM = "/usr/bin/chromium"  # Debian's (apt); Playwright's own browser downloads are never used
_CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                   "--disable-component-update", "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Server:
    url: str  # "http://127.0.0.1:PORT/"
    log_path: str
    pid: int  # the app's process (for its memory: benchmarks/soak.py)

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)


@contextlib.contextmanager
def serve_app(model: str = "tiny-llama", **env_extra: str):
    """Run the app until the `with` block ends; yields a `Server` (its base URL and its log)."""
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "KVVIZ_MODEL": model, "GRADIO_ANALYTICS_ENABLED": "False", **env_extra}
    log = tempfile.NamedTemporaryFile("w+", prefix="kvviz-app-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"app.py exited with status {proc.returncode}:\n{_tail(log.name)}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"app.py did not answer on {url} in {STARTUP_TIMEOUT_S} s:\n{_tail(log.name)}")
            time.sleep(0.3)
        yield Server(url, log.name, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        os.unlink(log.name)


def _tail(path: str, lines: int = 40) -> str:
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def browser_page(url: str, ready: str):
    """A Chromium page (Playwright, CHROMIUM launched by path) on the app at `url`, yielded once the element `ready`
    (a CSS selector) shows; the browser closes when the `with` block ends."""
    from playwright.sync_api import sync_playwright  # only the browser tests need playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=_CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900}, locale="en-US")
            page.goto(url, wait_until="networkidle")
            page.wait_for_selector(ready, timeout=30_000)
            yield page
        finally:
            browser.close()


def screenshot_dir(tmp_path_factory, name: str) -> Path:
    """Where the browser tests save screenshots: $KVVIZ_SCREENSHOTS when set (`make screenshots`: assets/), else a
    temporary directory `name`, so CI never rewrites tracked files."""
    target = os.environ.get("KVVIZ_SCREENSHOTS")
    path = Path(target) if target else tmp_path_factory.mktemp(name)
    path.mkdir(parents=True, exist_ok=True)
    return path
