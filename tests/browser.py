"""A headless Chromium driven over the Chrome DevTools Protocol, for the HTML report's tests.

The protocol runs over a pipe (``--remote-debugging-pipe``: JSON messages ended by NUL on file
descriptors 3 and 4), so no port, no websocket library and no browser download are needed: only
Debian's ``chromium``. ``python -m tests.browser PAGE OUT.png [WIDTH HEIGHT]`` takes a screenshot
(the docs' pictures of reports are made this way).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, NAMES) if path), None)


class Browser:
    """One browser process with one page; ``call`` sends a command to the page and returns its result."""

    def __init__(self, executable: str, width: int = 1280, height: int = 800):
        self.profile = tempfile.mkdtemp(prefix="tracer-chromium-")
        to_read, self._to_browser = os.pipe()
        self._from_browser, to_write = os.pipe()

        def onto_3_and_4():  # the child's fds 3 and 4, whatever numbers the pipe ends got
            high_r, high_w = fcntl.fcntl(to_read, fcntl.F_DUPFD, 100), fcntl.fcntl(to_write, fcntl.F_DUPFD, 100)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check", "--hide-scrollbars"]
        self.process = subprocess.Popen(
            [executable, *flags, "--remote-debugging-pipe", f"--user-data-dir={self.profile}", f"--window-size={width},{height}"],
            pass_fds=(3, 4),
            preexec_fn=onto_3_and_4,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_read)
        os.close(to_write)
        self._buffer, self._next = b"", 0
        self.events: list[dict] = []  # what the page reported: exceptions, console messages, CSP violations
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        self.call("Runtime.enable")
        self.call("Log.enable")

    def problems(self) -> list[str]:
        """Exceptions, console errors and browser log errors (a blocked fetch, a CSP violation) so far."""
        found = []
        for event in self.events:
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                found.append(str(params["exceptionDetails"]))
            elif event["method"] == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                found.append(str(params.get("args")))
            elif event["method"] == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                found.append(params["entry"]["text"])
        return found

    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:  # events arrive interleaved with answers: keep them
            reply = self._read()
            if "method" in reply:
                self.events.append(reply)
            elif reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def _read(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None) -> dict:
        return self._send(method, params, self.session)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str, ready: str = "document.documentElement?.dataset.ready === 'true'", timeout: float = 10) -> None:
        self.call("Page.navigate", {"url": url})
        self.wait_for(ready, timeout)

    def wait_for(self, expression: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not self.evaluate(f"!!({expression})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout}s for {expression}")
            time.sleep(0.02)

    def click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def screenshot(self, scale: float = 1) -> bytes:
        """The page as PNG; ``scale`` < 1 shrinks it (fewer pixels for a test to look at)."""
        size = self.evaluate("[innerWidth, innerHeight]")
        clip = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": scale}
        return base64.b64decode(self.call("Page.captureScreenshot", {"format": "png", "clip": clip})["data"])

    def close(self) -> None:
        try:
            self._send("Browser.close")
        except (RuntimeError, OSError):
            pass  # already gone
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 4):
        print("usage: python -m tests.browser PAGE.html[#ID] OUT.png [WIDTH HEIGHT]", file=sys.stderr)
        return 2
    page, _, fragment = argv[0].partition("#")
    size = (int(argv[2]), int(argv[3])) if len(argv) == 4 else (1280, 800)
    browser = Browser(find_chromium() or "chromium", *size)
    try:
        browser.open(Path(page).resolve().as_uri() + (f"#{fragment}" if fragment else ""))
        Path(argv[1]).write_bytes(browser.screenshot())
    finally:
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
