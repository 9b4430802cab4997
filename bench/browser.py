"""Each dashboard page in a real browser, against a hello-world Streamlit page of the same run.

`python bench/browser.py [--runs 4] [--config runhealth.toml --no-collect] [--other DIR]`

Serves the dashboard (the built-in demo with its collector, or `--config`) and a hello-world
Streamlit page (3 st.metric tiles, one plotly line, one st.dataframe) with the same Streamlit on
another port, and loads each page in headless Chromium (the system one, 1920x1080), a new
browser context per load, the loads interleaved (hello-world, page, [the other tree's page], the
two trees' order alternating run by run) so that all see the same machine load. `--other DIR`: also serve the dashboard of another checkout
(e.g. `git worktree add /tmp/base main`) from the same Python and Streamlit: before/after in one
run.

Cold: from navigation start to the last change of the main block (its text, the number of drawn
plotly charts and table canvases) made by the first run, once it has not changed for --quiet-ms,
no skeleton is left and the script is not running (stApp's data-test-script-state); a live
fragment's rerun on a loaded machine can start before then: its changes are not counted, except
that the first run's charts must all be drawn. What was sent: the websocket's bytes received until then.
Browser CPU: the CPU seconds of every Chromium process from the navigation until the page has
settled (the same load's work, all threads and processes: on a busy machine wall seconds swing
with the other sessions' load, CPU seconds much less).
Refresh (a page left open): each rerun a live fragment asks for (a client websocket frame) to
the last server frame of its reply, the slowest per round; and the data's age on screen: the
browser's clock at the change the rerun made minus the store's last collection; and the plotly
charts mounted anew per rerun (Streamlit 1.67 remounts a chart whose figure changed, even under a
key: a new element and a full Plotly.newPlot, not Plotly.react).
Not a pass/fail test: it prints medians and ratios, and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import math
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
VIEWPORT = {"width": 1920, "height": 1080}
PAGES = {
    "overview": "",
    "lengths": "Output_lengths",
    "gpus": "GPUs",
    "samples": "Samples",
    "nodes": "Nodes",
    "compare": "Compare",
}
HELLO = """
import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

st.set_page_config(page_title="hello", layout="wide")
st.title("Hello, world")
for col, (label, value) in zip(st.columns(3), [("Completions", "12,345"), ("Truncated", "2.1%"), ("Tokens / s", "48.2K")]):
    col.metric(label, value, "+1.0%")
x = np.arange(300)
st.plotly_chart(go.Figure(go.Scatter(x=x, y=np.sin(x / 20.0), mode="lines")))
st.dataframe(pd.DataFrame({"node": [f"node-{i:02d}" for i in range(16)], "state": ["up"] * 16, "tok_s": np.arange(16) * 1.5}))
"""
# Runs in every page before Streamlit's own scripts: records the websocket's frames and, every
# 50 ms, when the main block last changed (performance.now(): ms since navigation start).
PROBE = """
(() => {
  const rh = {frames: [], sent: [], changes: [], last: 0, sig: '', running: false, mounts: []};
  const charts = new WeakSet();  // every plotly chart's element seen: a new one is a new mount + newPlot
  window.__rh = rh;
  // Streamlit reads its frames through onmessage or addEventListener: both are wrapped.
  const count = (e) => {
    const d = e.data;
    rh.frames.push([performance.now(), d.byteLength !== undefined ? d.byteLength : (d.size || d.length || 0)]);
  };
  const proto = WebSocket.prototype;
  const add = proto.addEventListener;
  proto.addEventListener = function (type, fn, ...rest) {
    if (type === 'message') add.call(this, 'message', count);
    return add.call(this, type, fn, ...rest);
  };
  const on = Object.getOwnPropertyDescriptor(proto, 'onmessage');
  Object.defineProperty(proto, 'onmessage', {
    get() { return on.get.call(this); },
    set(fn) { add.call(this, 'message', count); on.set.call(this, fn); },
  });
  const send = proto.send;
  proto.send = function (data) {
    rh.sent.push([performance.now(), data.byteLength || data.length || 0]);
    return send.call(this, data);
  };
  setInterval(() => {
    const main = document.querySelector('[data-testid="stMain"]');
    if (!main) return;
    const app = document.querySelector('[data-testid="stApp"]');
    rh.running = !app || app.getAttribute('data-test-script-state') !== 'notRunning' ||
      app.getAttribute('data-test-connection-state') !== 'CONNECTED' || !main.innerText.trim();
    rh.skeletons = document.querySelectorAll('[data-testid="stSkeleton"]').length;
    main.querySelectorAll('.js-plotly-plot').forEach((d) => { if (!charts.has(d)) { charts.add(d); rh.mounts.push(performance.now()); } });
    const sig = main.innerText + '|' + main.querySelectorAll('.js-plotly-plot .main-svg').length + '|' +
      main.querySelectorAll('[data-testid="stDataFrame"] canvas').length;
    if (sig !== rh.sig) {
      rh.sig = sig; rh.last = performance.now(); rh.wall = performance.timeOrigin + rh.last;
      rh.changes.push([rh.last, main.querySelectorAll('.js-plotly-plot .main-svg').length]);
    }
  }, 50);
})();
"""
SETTLED = "(q) => window.__rh && window.__rh.last > 0 && !window.__rh.running && window.__rh.skeletons === 0 && performance.now() - window.__rh.last >= q"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(argv: list[str], cwd: Path, env: dict[str, str], port: int, log: Path) -> Iterator[str]:
    """A Streamlit server (the dashboard or the hello-world page) until its /_stcore/health answers."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{argv} did not start; log:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def dashboard(tree: Path, work: Path, args: argparse.Namespace) -> contextlib.AbstractContextManager[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RUNHEALTH_CONFIG", "RUNHEALTH_COLLECTOR")}
    env.update(XDG_CACHE_HOME=str(work / "cache"), PYTHONUNBUFFERED="1", PYTHONPATH=str(tree))
    argv = [sys.executable, "-m", "runhealth", "dashboard", "--port", str(port)]
    argv += (["--config", str(Path(args.config).resolve())] if args.config else []) + (
        ["--no-collect"] if args.no_collect else []
    )
    work.mkdir(parents=True, exist_ok=True)
    return server(argv, work, env, port, work / "streamlit.log")


def hello(work: Path) -> contextlib.AbstractContextManager[str]:
    port = free_port()
    script = work / "hello.py"
    script.write_text(HELLO)
    argv = [sys.executable, "-m", "streamlit", "run", str(script), "--server.port", str(port)]
    argv += ["--server.headless", "true", "--browser.gatherUsageStats", "false", "--theme.base", "dark"]
    return server(argv, work, dict(os.environ), port, work / "hello.log")


def browser_cpu_s() -> float:
    """CPU seconds of every Chromium process under this one (user + system, and of its reaped
    children: a closed context's renderer moves into its parent's count, not out of the sum)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                raw = Path(f"/proc/{d}/stat").read_text()
                name, rest = raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2 :].split()
                parent[int(d)], stats[int(d)] = int(rest[1]), [name, *rest]
    mine = {os.getpid()}
    for _ in range(8):  # python -> playwright's driver -> chromium -> zygote -> renderer ...
        mine |= {p for p, pp in parent.items() if pp in mine}
    return sum(sum(int(x) for x in stats[p][12:16]) / tick for p in mine if stats[p][0].startswith("chrom"))


def cold(browser: Any, url: str, quiet_ms: int, timeout_s: float = 120) -> tuple[float, int, float, float, int]:
    """One load in a new context: (seconds to the main block's last change, websocket bytes by
    then, seconds from the browser's first websocket message to the last reply before then: the
    script's run and the transfer, the rest being the page's own loading and drawing; the CPU
    seconds Chromium spent from the navigation to the page's settling: the figure a loaded
    machine changes least; the reruns the browser asked for before the page settled: a live
    fragment's ticks landing in the cold load, each re-sending its part)."""
    ctx = browser.new_context(viewport=VIEWPORT)
    try:
        ctx.add_init_script(PROBE)
        page = ctx.new_page()
        cpu = browser_cpu_s()
        page.goto(url, wait_until="commit")
        page.wait_for_function(SETTLED, arg=quiet_ms, timeout=timeout_s * 1000, polling=100)
        cpu = browser_cpu_s() - cpu
        rh = page.evaluate("window.__rh")
        return (*drawn(rh), cpu, max(0, len(rh["sent"]) - 1))
    finally:
        ctx.close()


def drawn(rh: dict[str, Any]) -> tuple[float, int, float]:
    """When the first run's screen was complete: its last change before a live fragment asked
    for its first rerun (the browser's second websocket message; a loaded machine can take
    longer than an interval), or later, when the last of its charts was drawn."""
    cutoff = rh["sent"][1][0] if len(rh["sent"]) > 1 else math.inf
    charts = rh["changes"][-1][1]
    last = max(
        max(t for t, _ in rh["changes"] if t < cutoff),
        min(t for t, n in rh["changes"] if n >= charts),
    )
    replies = [t for t, _ in rh["frames"] if t <= min(last, cutoff)]
    served = (max(replies) - rh["sent"][0][0]) / 1000 if replies and rh["sent"] else math.nan
    return last / 1000, sum(n for t, n in rh["frames"] if t <= min(last, cutoff)), served


def stamps(work: Path) -> tuple[float | None, float | None]:
    """The newest node collection and the newest page publication (the collector's page_data
    rows, its kept state left out) in the dashboard's stores (the demo's, or --config's)."""
    best: list[float | None] = [None, None]
    queries = (
        "SELECT MAX(last_ok_unix) FROM nodes",
        "SELECT MAX(ts_unix) FROM page_data WHERE name != 'state:incremental'",
    )
    for path in glob.glob(str(work / "cache" / "**" / "*.sqlite3"), recursive=True):
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            for i, query in enumerate(queries):
                with contextlib.suppress(sqlite3.Error):
                    row = db.execute(query).fetchone()
                    if row and row[0] is not None:
                        best[i] = max(best[i] or 0.0, float(row[0]))
    return best[0], best[1]


def last_collection(work: Path) -> float | None:
    """The newest node collection in the dashboard's stores (the demo's, or --config's store)."""
    return stamps(work)[0]


def lags(news: list[float], changes: list[float]) -> list[float]:
    """For each new stamp (a poll's or a publication's time), the seconds to the screen's next change."""
    return [min(c for c in changes if c >= t) - t for t in news if any(c >= t for c in changes)]


Fresh = tuple[float | None, float | None, float | None, list[float], list[float]]


def refresh(browser: Any, url: str, work: Path, watch_s: float, quiet_ms: int, settle_s: float = 0.0) -> Fresh:
    """A page left open for watch_s, settle_s after its first load settled (a page is pushed on a
    publication once its own timer has ticked, one interval after it arrived): (the slowest fragment rerun, request to last reply frame, s;
    the data's age when the screen changed, s; plotly charts mounted anew per rerun: Streamlit
    remounts a chart whose figure changed, a full newPlot; per new poll, then per new publication
    seen while it was open, the seconds until the screen next changed), None where no rerun
    happened. Runs of the watcher fragment (components/livewatch.py) that draw nothing are not
    counted as reruns."""
    ctx = browser.new_context(viewport=VIEWPORT)
    try:
        ctx.add_init_script(PROBE)
        page = ctx.new_page()
        page.goto(url, wait_until="commit")
        page.wait_for_function(SETTLED, arg=quiet_ms, timeout=120_000, polling=100)
        page.wait_for_timeout(int(settle_s * 1000))
        start = page.evaluate("performance.now()")
        ages = []
        first = stamps(work)
        polls: set[float] = set()
        pubs: set[float] = set()
        end = time.monotonic() + watch_s
        seen_wall = page.evaluate("window.__rh.wall")
        while time.monotonic() < end:
            page.wait_for_timeout(50)
            poll, pub = stamps(work)
            polls |= {poll} if poll is not None and poll != first[0] else set()
            pubs |= {pub} if pub is not None and pub != first[1] else set()
            wall = page.evaluate("window.__rh.wall")
            if wall != seen_wall:  # the screen changed: how old were its numbers then?
                seen_wall = wall
                if poll is not None:
                    ages.append(wall / 1000 - poll)
        time.sleep(2.0)  # a change caused by the last stamps seen
        rh = page.evaluate("window.__rh")
        origin = page.evaluate("performance.timeOrigin")
        changes = [(origin + t) / 1000 for t, _ in rh["changes"] if t > start]
        sends = [t for t, _ in rh["sent"] if t > start]
        spans = []
        for i, t in enumerate(sends):
            stop = sends[i + 1] if i + 1 < len(sends) else float("inf")
            replies = [r for r, n in rh["frames"] if t < r < stop]
            if replies and sum(n for r, n in rh["frames"] if t < r < stop) > 2048:  # drew something
                spans.append(max(replies) - t)
        mounts = sum(1 for t in rh["mounts"] if t > start)
        return (
            (max(spans) / 1000 if spans else None),
            (statistics.median(ages) if ages else None),
            (mounts / len(spans) if spans else None),
            lags(sorted(polls), changes),
            lags(sorted(pubs), changes),
        )
    finally:
        ctx.close()


def sent_elements(browser: Any, url: str, quiet_ms: int, specs: dict[str, Any] | None = None) -> list[tuple[int, str]]:
    """One load's websocket messages from the server, decoded: (bytes, what) per message, the
    element type of each delta (a plotly chart's title, a markdown's first words)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    got: list[bytes] = []
    ctx = browser.new_context(viewport=VIEWPORT)
    try:
        ctx.add_init_script(PROBE)
        page = ctx.new_page()
        page.on("websocket", lambda ws: ws.on("framereceived", lambda data: got.append(bytes(data))))
        page.goto(url, wait_until="commit")
        page.wait_for_function(SETTLED, arg=quiet_ms, timeout=120_000, polling=100)
    finally:
        ctx.close()
    out = []
    for raw in got:
        msg = ForwardMsg.FromString(raw)
        kind = msg.WhichOneof("type") or "?"
        if kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
            el = msg.delta.new_element
            kind = el.WhichOneof("type") or "?"
            if kind == "plotly_chart":
                import json

                spec = json.loads(el.plotly_chart.spec or "{}")
                layout = spec.get("layout", {})
                title = layout.get("title", {})
                name = str((title.get("text") if isinstance(title, dict) else title) or el.plotly_chart.id[-24:])
                if specs is not None:
                    specs.setdefault(name, spec)
                points = sum(len(t.get("x") or t.get("z") or []) for t in spec.get("data", []))
                kind += (
                    f" {name:.50} [{len(spec.get('data', []))} traces, {points} x values,"
                    f" {len(layout.get('shapes', []))} shapes, {len(layout.get('annotations', []))} annotations]"
                )
            elif kind == "markdown":
                kind += f" {el.markdown.body[:40]!r}"
        out.append((len(raw), kind))
    return out


def print_sizes(browser: Any, urls: dict[str, str], hello_url: str, names: list[str], args: argparse.Namespace) -> None:
    shown = [(f"{name} ({k})", f"{url}/{PAGES[name]}{args.query}") for k, url in urls.items() for name in names]
    for label, url in shown + [("hello-world", hello_url)]:
        sent = sent_elements(browser, url, args.quiet_ms)
        print(f"{label}: {len(sent)} messages, {sum(n for n, _ in sent) / 1024:.0f} KiB; largest:")
        for n, what in sorted(sent, reverse=True)[:8]:
            print(f"  {n / 1024:8.1f} KiB  {what}")


# Draws each chart as plotly.js does in the page, alternating its template's axis automargin
# as sent and forced on (plotly's own templates): ms a draw, median of `reps` per chart.
DRAW = """async ([specs, reps]) => {
  const auto = (layout) => {
    const l = JSON.parse(JSON.stringify(layout || {}));
    l.template = l.template || {}; l.template.layout = l.template.layout || {};
    for (const k of ['xaxis', 'yaxis']) l.template.layout[k] = {...(l.template.layout[k] || {}), automargin: true};
    return l;
  };
  const med = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
  const out = [];
  for (const s of specs) {
    const t = {sent: [], auto: []};
    for (let rep = 0; rep < reps; rep++) for (const v of (rep % 2 ? ['sent', 'auto'] : ['auto', 'sent'])) {
      const d = document.createElement('div'); d.style.width = '900px'; document.body.appendChild(d);
      const t0 = performance.now();
      await Plotly.newPlot(d, s.data, v === 'sent' ? s.layout : auto(s.layout), {responsive: false});
      t[v].push(performance.now() - t0); Plotly.purge(d); d.remove();
    }
    out.push([med(t.sent), med(t.auto)]);
  }
  return out;
}"""


def print_draws(browser: Any, urls: dict[str, str], names: list[str], args: argparse.Namespace) -> None:
    """Each distinct chart of the pages, drawn by plotly.js (the plotly package's copy) in a blank
    page: as the dashboard sent it, and with axis automargin on."""
    import plotly

    specs: dict[str, Any] = {}
    for url in urls.values():
        for name in names:
            sent_elements(browser, f"{url}/{PAGES[name]}{args.query}", args.quiet_ms, specs)
    page = browser.new_page(viewport=VIEWPORT)
    page.add_script_tag(path=str(Path(plotly.__file__).parent / "package_data" / "plotly.min.js"))
    got = page.evaluate(DRAW, [list(specs.values()), 9])
    print(f"| chart | as sent, ms | axis automargin on, ms |   (load {load()})")
    print("|---|---:|---:|")
    for title, (sent, auto) in zip(specs, got, strict=True):
        print(f"| {title[:50]} | {sent:.0f} | {auto:.0f} |")
    print(f"| all {len(specs)} | {sum(s for s, _ in got):.0f} | {sum(a for _, a in got):.0f} |")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}, {max(xs):.2f} (n={len(xs)})" if xs else "-"


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4, help="cold loads of each page (median)")
    parser.add_argument("--pages", default=",".join(PAGES), help="comma-separated: " + ",".join(PAGES))
    parser.add_argument("--config", help="a runhealth.toml to serve instead of the demo")
    parser.add_argument("--no-collect", action="store_true", help="serve --config's stores as they are")
    parser.add_argument("--other", type=Path, help="also serve the dashboard of this checkout (a baseline tree)")
    parser.add_argument("--refresh-runs", type=int, default=2, help="rounds of a page left open (0: none)")
    parser.add_argument("--watch-s", type=float, default=12.0, help="how long a page is left open per round")
    parser.add_argument(
        "--settle-s", type=float, default=0.0, help="left open this long before it is watched (its first timer tick)"
    )
    parser.add_argument("--quiet-ms", type=int, default=500, help="a page is drawn once it stays still this long")
    parser.add_argument("--query", default="", help="appended to each page's URL, e.g. '?kiosk=1'")
    parser.add_argument("--sizes", action="store_true", help="only print what each page sends, by message")
    parser.add_argument("--draws", action="store_true", help="only time plotly.js drawing each page's charts")
    args = parser.parse_args()
    names = [n for n in args.pages.split(",") if n]
    from playwright.sync_api import sync_playwright

    trees = {"this": ROOT} | ({"other": args.other.resolve()} if args.other else {})
    with tempfile.TemporaryDirectory(prefix="rh-browser-") as tmp, contextlib.ExitStack() as stack:
        hello_url = stack.enter_context(hello(Path(tmp)))
        urls = {k: stack.enter_context(dashboard(tree, Path(tmp) / k, args)) for k, tree in trees.items()}
        p = stack.enter_context(sync_playwright())
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        stack.callback(browser.close)
        print(f"load before: {load()}  (Streamlit served by {sys.executable})", flush=True)
        for url in urls.values():  # the demo's data in, each page's caches and chunks loaded once
            for name in names:
                cold(browser, f"{url}/{PAGES[name]}{args.query}", args.quiet_ms)
                print(f"  warmed {name} at {url}", file=sys.stderr, flush=True)
        cold(browser, hello_url, args.quiet_ms)
        if args.draws:
            print_draws(browser, urls, names, args)
            return
        if args.sizes:
            print_sizes(browser, urls, hello_url, names, args)
            return
        times: dict[tuple[str, str], list[float]] = {}
        sizes: dict[tuple[str, str], list[int]] = {}
        served: dict[tuple[str, str], list[float]] = {}
        cpus: dict[tuple[str, str], list[float]] = {}
        reruns: dict[tuple[str, str], list[int]] = {}
        for run in range(args.runs):
            for name in names:
                # the trees' order alternates run by run: the load right after hello-world's was
                # served slower whichever tree it was (0.5-1.5 s, position, not code)
                trees_now = list(urls.items())[:: -1 if run % 2 else 1]
                for k, url in [("hello", hello_url)] + [(k, f"{u}/{PAGES[name]}{args.query}") for k, u in trees_now]:
                    s, b, srv, c, rr = cold(browser, url, args.quiet_ms)
                    served.setdefault((k, name), []).append(srv)
                    reruns.setdefault((k, name), []).append(rr)
                    cpus.setdefault((k, name), []).append(c)
                    print(
                        f"  {name} {k}: {s:.2f} s (served {srv:.2f}, browser CPU {c:.2f} s, {rr} reruns asked),"
                        f" {b / 1024:.0f} KiB (load {load()})",
                        file=sys.stderr,
                        flush=True,
                    )
                    times.setdefault((k, name), []).append(s)
                    sizes.setdefault((k, name), []).append(b)
        fresh: dict[tuple[str, str], list[Fresh]] = {}
        for _ in range(args.refresh_runs):
            for name in names:
                for k, u in urls.items():
                    got = refresh(
                        browser,
                        f"{u}/{PAGES[name]}{args.query}",
                        Path(tmp) / k,
                        args.watch_s,
                        args.quiet_ms,
                        args.settle_s,
                    )
                    fresh.setdefault((k, name), []).append(got)
                    print(f"  {name} {k} left open: {got}", file=sys.stderr, flush=True)
        report(names, list(urls), times, sizes, served, cpus, reruns, fresh, args)


def report(
    names: list[str],
    trees: list[str],
    times: dict[tuple[str, str], list[float]],
    sizes: dict[tuple[str, str], list[int]],
    served: dict[tuple[str, str], list[float]],
    cpus: dict[tuple[str, str], list[float]],
    reruns: dict[tuple[str, str], list[int]],
    fresh: dict[tuple[str, str], list[Fresh]],
    args: argparse.Namespace,
) -> None:
    print(f"load after: {load()}; cold = median of {args.runs}, a new browser context each, 1920x1080")
    print(
        "| page | tree | cold s | hello-world s | × hello-world | browser CPU s | × hello-world | ws KiB | served s |"
        " reruns asked before settled (mean) |"
        " slowest fragment rerun s | data age on screen s | charts remounted per rerun |"
        " poll -> screen s (median, max) | publication -> screen s (median, max) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        base = statistics.median(times[("hello", name)])
        base_cpu = statistics.median(cpus[("hello", name)])
        for k in trees:
            t = statistics.median(times[(k, name)])
            c = statistics.median(cpus[(k, name)])
            kib = statistics.median(sizes[(k, name)]) / 1024
            srv = statistics.median(served[(k, name)])
            runs = fresh.get((k, name), [])
            rerun = [r[0] for r in runs if r[0] is not None]
            age = [r[1] for r in runs if r[1] is not None]
            mounts = [r[2] for r in runs if r[2] is not None]
            from_poll = [x for r in runs for x in r[3]]
            from_pub = [x for r in runs for x in r[4]]
            print(
                f"| {name} | {k} | {t:.2f} | {base:.2f} | {t / base:.2f} | {c:.2f} | {c / base_cpu:.2f} | {kib:.0f} | {srv:.2f} | "
                f"{statistics.mean(reruns[(k, name)]):.1f} | "
                f"{fmt(statistics.median(rerun) if rerun else None)} | {fmt(statistics.median(age) if age else None)} | "
                f"{fmt(statistics.median(mounts) if mounts else None, '.1f')} | {spread(from_poll)} | {spread(from_pub)} |"
            )
    hello_kib = statistics.median(v for (k, _), vs in sizes.items() if k == "hello" for v in vs) / 1024
    print(f"hello-world page: {hello_kib:.0f} KiB over the websocket")


if __name__ == "__main__":
    main()
