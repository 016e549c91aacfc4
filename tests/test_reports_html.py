"""The HTML report opened in headless Chromium (Debian's `chromium`, installed by .ci/run).

A tiny Chrome DevTools Protocol client talks to the browser over `--remote-debugging-pipe`
(file descriptors 3 and 4, NUL-separated JSON), collects every console error, uncaught
exception and error log entry, takes a screenshot, and reads the page: the SVG call graph
must have the Scheduler and EAGLE worker nodes, the page's script must have run, and the
couplings filter must hide rows. A control page with a deliberate error proves the
collector would see one.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from eaglegate.app.reports import report_of
from eaglegate.reports.html import render_html
from eaglegate.reports.model import Report

from conftest import NEWEST, analysis

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1000"]
ERROR_EVENTS = ("Runtime.exceptionThrown", "Runtime.consoleAPICalled", "Log.entryAdded")


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Chromium driven over the DevTools protocol on a pipe (no websocket library needed)."""

    def __init__(self, exe: str, profile: Path):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:  # in the child: commands on fd 3, replies and events on fd 4
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=fds, pass_fds=(3, 4),
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._id = 0
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buffer = b""
        while chunk := os.read(self._from_child, 1 << 16):
            buffer += chunk
            while b"\0" in buffer:
                message, buffer = buffer.split(b"\0", 1)
                self._queue.put(json.loads(message))
        self._queue.put(None)

    def _next(self, deadline: float) -> dict[str, Any]:
        item = self._queue.get(timeout=max(0.05, deadline - time.monotonic()))
        if item is None:
            raise RuntimeError("chromium closed the DevTools pipe")
        return item

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 60) -> dict[str, Any]:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            item = self._next(deadline)
            if item.get("id") == self._id:
                if "error" in item:
                    raise RuntimeError(f"{method}: {item['error']}")
                return item.get("result", {})
            self.events.append(item)

    def wait_for(self, method: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            try:
                self.events.append(self._next(deadline))
            except queue.Empty:
                raise TimeoutError(f"no {method} within {timeout}s") from None
        return next(e for e in self.events if e.get("method") == method)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)


def errors(events: list[dict[str, Any]]) -> list[str]:
    """Console errors, uncaught exceptions and error log entries, as text."""
    found = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            found.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            found.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                      for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            found.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
    return found


def open_page(exe: str, tmp_path: Path, html_file: Path, probe: str) -> tuple[Any, list[str], bytes]:
    """Load a file, run `probe` (a JS expression returning JSON-able data) after the page's
    script; return the probe's value, the errors seen and a PNG screenshot."""
    browser = Browser(exe, tmp_path / "profile")
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
            browser.send(domain, session=session)
        browser.send("Page.navigate", {"url": html_file.as_uri()}, session=session)
        browser.wait_for("Page.loadEventFired")
        time.sleep(0.3)  # let timers and late errors fire
        value = browser.send("Runtime.evaluate", {"expression": probe, "returnByValue": True,
                                                  "awaitPromise": True}, session=session)
        if "exceptionDetails" in value:
            raise AssertionError(f"probe failed: {value['exceptionDetails']}")
        shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False},
                            session=session)
        return value["result"].get("value"), errors(browser.events), base64.b64decode(shot["data"])
    finally:
        browser.close()


needs_chromium = pytest.mark.skipif(
    chromium() is None,
    reason="chromium not found on PATH (install Debian's `chromium`: .ci/run does it before the tests)",
)

PROBE = """(() => {
  const nodes = Array.from(document.querySelectorAll('#callgraph g.node'));
  const rows = () => Array.from(document.querySelectorAll('tr.finding'));
  const visible = () => rows().filter(r => r.style.display !== 'none').length;
  const result = {
    ready: document.body.dataset.ready || null,
    collected: document.getElementById('js-errors').textContent,
    nodes: nodes.map(g => ({qn: g.dataset.qn, kind: g.getAttribute('class'),
                         text: Array.from(g.querySelectorAll('text')).map(t => t.textContent).join('')})),
    svgWidth: document.getElementById('callgraph').getBoundingClientRect().width,
    rows: rows().length, filtered: null,
    details: document.querySelectorAll('details.src pre').length,
  };
  const cat = document.getElementById('f-category');
  if (cat && cat.options.length > 1) {
    cat.value = cat.options[1].value; cat.dispatchEvent(new Event('change'));
    result.filtered = {category: cat.value, visible: visible(),
                       expected: rows().filter(r => r.dataset.category === cat.value).length};
    cat.value = ''; cat.dispatchEvent(new Event('change'));
  }
  const runBatch = nodes.find(g => g.dataset.qn.endsWith('.run_batch'));
  if (runBatch) { runBatch.dispatchEvent(new MouseEvent('click', {bubbles: true})); }
  result.highlighted = document.querySelectorAll('tr.hl').length;
  return result;
})()"""


@functools.cache
def report(version: str) -> Report:
    return report_of(analysis(version))


@needs_chromium
@pytest.mark.parametrize("version", ["0.5.9", NEWEST])
def test_html_report_in_headless_chromium(version, tmp_path):
    exe = chromium()
    assert exe is not None
    r = report(version)
    page = tmp_path / f"report-{version}.html"
    page.write_text(render_html(r), encoding="utf-8")
    value, seen, png = open_page(exe, tmp_path, page, PROBE)
    shot = tmp_path / f"report-{version}.png"
    shot.write_bytes(png)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000, "a blank screenshot"
    assert seen == [], seen
    assert value["collected"] == "" and value["ready"] == "1"
    texts = [n["text"] for n in value["nodes"]]
    qns = {n["qn"] for n in value["nodes"]}
    assert f"{r.scheduler}.run_batch" in qns
    assert any(t.startswith("Scheduler") and ".run_batch" in t for t in texts)
    assert any(t.startswith("Scheduler") and ".event_loop_overlap" in t for t in texts)
    for w in r.workers:
        if w.present:
            assert w.entry in qns
            assert any(t.startswith(w.name) and "forward_batch_generation" in t for t in texts), texts
    assert ("sglang.srt.speculative.eagle_worker.EAGLEWorker.forward_batch_generation" in qns) == (version == "0.5.9")
    assert value["svgWidth"] > 600
    assert value["details"] > 20  # file:line source excerpts
    assert value["highlighted"] >= 2  # clicking run_batch finds its rows in the path tables
    if r.couplings.available and r.couplings.findings:
        assert value["rows"] == len(r.couplings.findings)
        f = value["filtered"]
        assert f is not None and f["visible"] == f["expected"]
        if len({x.category for x in r.couplings.findings}) > 1:
            assert f["visible"] < value["rows"]


@needs_chromium
def test_the_error_collector_sees_errors(tmp_path):
    """Control: a page with a console error and an uncaught exception is caught."""
    exe = chromium()
    assert exe is not None
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><script>console.error('on purpose');"
                    "setTimeout(function(){ undefinedFunction(); }, 0);</script></body></html>")
    _, seen, png = open_page(exe, tmp_path, page, "1")
    assert png.startswith(b"\x89PNG")
    assert any("on purpose" in e for e in seen), seen
    assert any("undefinedFunction" in e for e in seen), seen


@needs_chromium
def test_couplings_filter_in_headless_chromium(tmp_path):
    """The category and worker-path filters hide rows (on couplings in the schema's shape)."""
    from test_reports import with_couplings

    exe = chromium()
    assert exe is not None
    r = with_couplings(report("0.5.9"))
    page = tmp_path / "with-couplings.html"
    page.write_text(render_html(r), encoding="utf-8")
    probe = """(() => {
      const rows = () => Array.from(document.querySelectorAll('tr.finding'));
      const visible = () => rows().filter(r => r.style.display !== 'none').map(r => r.dataset.category);
      const cat = document.getElementById('f-category'), path = document.getElementById('f-path');
      const out = {all: visible()};
      cat.value = 'cuda_graph'; cat.dispatchEvent(new Event('change')); out.cuda = visible();
      cat.value = ''; path.value = 'v1'; path.dispatchEvent(new Event('change')); out.v1 = visible();
      out.count = document.getElementById('f-count').textContent;
      return out;
    })()"""
    value, seen, _ = open_page(exe, tmp_path, page, probe)
    assert seen == []
    assert sorted(value["all"]) == ["config_cap", "cuda_graph"]
    assert value["cuda"] == ["cuda_graph"]
    assert value["v1"] == ["config_cap"]  # a v2-only finding is hidden, one on both paths stays
    assert value["count"] == "1"


def mermaid_js(tmp_path: Path) -> Path | None:
    """mermaid.min.js from the npm registry's `mermaid` package (cached), or None."""
    import tarfile

    from eaglegate.analyzer.source import cache_dir

    cached = cache_dir() / "mermaid" / "mermaid.min.js"
    if cached.is_file():
        return cached
    npm = shutil.which("npm")
    if npm is None:
        return None
    proc = subprocess.run([npm, "pack", "mermaid@11", "--silent", "--pack-destination", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    packs = list(tmp_path.glob("mermaid-*.tgz"))
    if proc.returncode != 0 or not packs:
        return None
    with tarfile.open(packs[0]) as tar:
        member = tar.extractfile("package/dist/mermaid.min.js")
        if member is None:
            return None
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_bytes(member.read())
    return cached


@needs_chromium
def test_mermaid_blocks_render_with_mermaid_js(tmp_path):
    """Every Mermaid block of the Markdown reports (what GitHub draws) parses and renders."""
    import re

    from eaglegate.reports.graph import to_mermaid
    from eaglegate.reports.markdown import render_markdown

    exe = chromium()
    assert exe is not None
    js = mermaid_js(tmp_path)
    if js is None:
        pytest.skip("mermaid.js unavailable: npm missing or the npm registry unreachable")
    shutil.copy(js, tmp_path / "mermaid.min.js")
    blocks = []
    for version in ("0.5.9", NEWEST):
        blocks += re.findall(r"```mermaid\n(.*?)```", render_markdown(report(version)), flags=re.S)
        blocks.append(to_mermaid(report(version)))
    page = tmp_path / "mermaid.html"
    page.write_text('<!DOCTYPE html><html><body><script src="mermaid.min.js"></script></body></html>')
    probe = "const blocks = " + json.dumps(blocks) + ";\n" + """(async () => {
      mermaid.initialize({startOnLoad: false});
      const out = [];
      for (let i = 0; i < blocks.length; i++) {
        try { await mermaid.parse(blocks[i]); const r = await mermaid.render('g' + i, blocks[i]);
              out.push(r.svg.includes('run_batch') ? 'ok' : 'no run_batch node'); }
        catch (e) { out.push('error: ' + e.message); }
      }
      return out;
    })()"""
    value, seen, _ = open_page(exe, tmp_path, page, probe)
    assert value == ["ok"] * len(blocks), value
    assert seen == []
