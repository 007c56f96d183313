"""Open a page in headless Chromium and report what a browser sees: console errors, every
image's natural size, a full-page screenshot. Speaks the DevTools protocol over
``--remote-debugging-pipe`` (NUL-separated JSON on fds 3 and 4), so it needs no websocket or
browser-driver package; the browser gets no network (``--proxy-server`` to a closed port).

    python -m tests.chromium_cdp report.html report.png     # prints the check as JSON
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL = "apt-get update && apt-get install -y chromium"


def chromium() -> str | None:
    """The Chromium binary on PATH (None: not installed)."""
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageCheck:
    console_errors: list[str] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)  # src head, natural w/h, shown w
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    screenshot: Path | None = None
    title: str = ""


class _Pipe:
    """One DevTools session over the browser's pipe."""

    def __init__(self, proc: subprocess.Popen[bytes], to_browser: int, from_browser: int):
        self.proc, self.out, self.inp = proc, to_browser, from_browser
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self.inp], [], [], left)
            if ready:
                chunk = os.read(self.inp, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
                self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\0")
        msg: dict[str, Any] = json.loads(line)
        return msg

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
        timeout: float = 60.0,
    ) -> dict[str, Any]:  # fmt: skip
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        os.write(self.out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict[str, Any]:
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read(deadline)
            if msg.get("method") == method:
                return msg
            self.events.append(msg)


_IMAGES_JS = """JSON.stringify(Array.from(document.images).map(i => ({
  src: i.getAttribute('src').slice(0, 40), naturalWidth: i.naturalWidth,
  naturalHeight: i.naturalHeight, width: i.getBoundingClientRect().width,
  complete: i.complete})))"""


def check_page(
    page: Path, screenshot: Path, *, width: int = 1280, timeout: float = 90.0
) -> PageCheck:
    """Load ``page`` in headless Chromium; its console errors, images and a screenshot."""
    binary = chromium()
    if binary is None:
        raise FileNotFoundError(f"no chromium binary on PATH ({INSTALL})")
    to_r, to_w = os.pipe()  # we write commands to to_w, chromium reads fd 3
    from_r, from_w = os.pipe()  # chromium writes fd 4, we read from_r

    def child_fds() -> None:
        os.dup2(to_r, 3)
        os.dup2(from_w, 4)

    profile = tempfile.mkdtemp(prefix="kplan-chromium-")
    try:
        argv = [
            binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--proxy-server=127.0.0.1:9", "--hide-scrollbars",
            f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank",
        ]  # fmt: skip
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=child_fds,  # noqa: PLW1509 (the child only dup2s two fds)
            pass_fds=(3, 4),  # kept open after preexec_fn (close_fds runs after it)
            start_new_session=True,
        )
        os.close(to_r)
        os.close(from_w)
        try:
            return _drive(_Pipe(proc, to_w, from_r), page, screenshot, width, timeout)
        finally:
            os.close(to_w)
            os.close(from_r)
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
            _kill_session(proc.pid)
    finally:
        _remove(Path(profile))


def _kill_session(sid: int) -> None:
    """Chromium's helpers (renderer, crash handler) share its session (``start_new_session``)
    and may outlive it: kill them, so that nothing writes into the profile folder as it goes
    (under load, one did while the folder was being removed: "Directory not empty")."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)


def _remove(folder: Path) -> None:
    """Remove the profile folder, again for a few seconds while a killed helper's last write
    lands; then whatever is left goes without a word (a test must not fail on /tmp's upkeep)."""
    for _ in range(40):
        try:
            shutil.rmtree(folder)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    shutil.rmtree(folder, ignore_errors=True)


def _drive(cdp: _Pipe, page: Path, screenshot: Path, width: int, timeout: float) -> PageCheck:
    target = cdp.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)
    attached = cdp.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
    s = attached["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        cdp.call(f"{domain}.enable", session=s)
    cdp.call(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        session=s,
    )
    cdp.call("Page.navigate", {"url": page.resolve().as_uri()}, session=s)
    cdp.wait_event("Page.loadEventFired", timeout)
    images = json.loads(
        cdp.call("Runtime.evaluate", {"expression": _IMAGES_JS, "returnByValue": True},
                 session=s)["result"]["value"]
    )  # fmt: skip
    title = cdp.call(
        "Runtime.evaluate", {"expression": "document.title", "returnByValue": True}, session=s
    )["result"]["value"]
    shot = cdp.call(
        "Page.captureScreenshot",
        {"format": "png", "captureBeyondViewport": True},
        session=s,
        timeout=timeout,
    )
    screenshot.write_bytes(base64.b64decode(shot["data"]))
    check = PageCheck(images=images, screenshot=screenshot, title=str(title))
    for ev in cdp.events:
        method, params = ev.get("method"), ev.get("params") or {}
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = params.get("args") or []
            check.console_errors.append(" ".join(str(a.get("value", a)) for a in args))
        elif method == "Runtime.exceptionThrown":
            check.console_errors.append(str(params.get("exceptionDetails", {}).get("text")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            check.console_errors.append(str(params["entry"].get("text")))
        elif method == "Network.requestWillBeSent":
            check.requests.append(str(params.get("request", {}).get("url", ""))[:80])
    return check


if __name__ == "__main__":
    result = check_page(Path(sys.argv[1]), Path(sys.argv[2]))
    doc = {**result.__dict__, "screenshot": str(result.screenshot)}
    print(json.dumps(doc, indent=1))
