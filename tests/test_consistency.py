"""One fact, one number, on every consumer (issue #41 item 1): the consistency harness.

Each scenario is a run's store built poll by poll as the collector builds it (the demo
simulator's lines, scanned by the real agent scanner, written with store_fixtures.write_reply (the collector's path) on a fixed
clock), with the config a user would write. At one instant (`NOW`: the scenario's last poll; the
process's clock is frozen there while the consumers read, so every page, the CLI, /metrics and
the webhook body read the same instant) every consumer is read and each named fact pulled out of
what it shows, by small parsers of the displayed words: the pages (Streamlit AppTest), `runhealth
status --json`, the headline JSON/CSV downloads, the exporter's /metrics text, the webhook bodies,
`runhealth compare --json`. Then one value per fact across consumers, formatting aside.

To add a fact: name it in FACTS (with its tolerance: the coarsest display precision among its
consumers); to add a consumer: write `extract_<where>(seen) -> {fact: value}` and list it in
CONSUMERS. A consumer that does not show a fact leaves it out (never a 0 for "not shown").
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from store_fixtures import poll_reply, write_reply
from test_pages import _clear_streamlit_caches, assert_clean, open_app  # noqa: F401 (autouse fixture)

from runhealth import cli
from runhealth.alerting import exporter, notify
from runhealth.demo import Simulator
from runhealth.node import scan
from runhealth.screens import lengths, overview
from runhealth.settings.config import load_config
from runhealth.settings.runsettings import RunSettings
from runhealth.store import Store

CEILING = 4096  # the demo simulator's ceiling: ~18% cut
INTERVAL_S = 30.0


# -- the facts --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Fact:
    """A named fact and how close two consumers' values must be (their display precision)."""

    name: str
    tolerance: float = 0.0  # absolute; 0: equal
    relative: float = 0.0  # relative, for figures shown to a few significant digits


FACTS: dict[str, Fact] = {
    f.name: f
    for f in (
        Fact("completions"),
        Fact("cut_count"),
        Fact("cut_pct", tolerance=0.051),  # "18.0%" on a tile, 2 decimals in JSON
        Fact("progress_pct", tolerance=0.051),
        Fact("eta_state"),  # "shown" | "none: stalled" | "none: stale" | "none: too early" | "done" | "none"
        Fact("eta_s", tolerance=60.0, relative=0.035),  # "21 min" (a minute), "1.2 h" (0.05 h), JSON 0.01 h
        Fact("eta_node"),  # the node whose share ends the run last (fixed shares); "" for the run's rate
        Fact("tokens_per_s", tolerance=0.51, relative=0.0051),  # "950" (a token), "9.4K" (50 tokens), JSON a token
        Fact("prompts_answered"),
        Fact("prompts_missing"),
        Fact("prompts_twice"),
        Fact("late_nodes"),  # the stragglers, as a sorted tuple
        Fact("stalled_nodes"),  # the nodes alerted as stalled, as a sorted tuple
        Fact("done_nodes"),  # the nodes that wrote their share, as a sorted tuple
        Fact("run_stalled"),  # bool
        Fact("forecast_interval_pct", tolerance=0.051),  # (low, high), as "0.5–3.4%"
        Fact("forecast_loop_note"),  # what the interval assumes of loops, said beside it ("" or "assuming no loops")
        Fact("compare_b_n"),  # the n of run B's shares on the Compare page
        Fact("energy_j_per_usable_token", relative=0.01),
        Fact("failed_requests"),  # failed request lines (#39): no completions
        Fact("failed_pct", tolerance=0.051),  # of requests (completions + failed): "0.5%" on a page, 3 decimals in JSON
    )
}


def close(fact: Fact, a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple) and a and isinstance(a[0], float):
        return len(a) == len(b) and all(close(fact, x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return abs(a - b) <= max(fact.tolerance, fact.relative * max(abs(a), abs(b)))
    return a == b


def assert_one_value(seen: dict[str, dict[str, Any]]) -> None:
    """`seen`: consumer -> {fact: value}. Every fact shown by two consumers has one value."""
    disagreements = []
    for name, fact in FACTS.items():
        values = {c: facts[name] for c, facts in seen.items() if name in facts}
        items = list(values.items())
        for _c, v in items[1:]:
            if not close(fact, items[0][1], v):
                disagreements.append(f"{name}: " + ", ".join(f"{k}={x!r}" for k, x in items))
                break
    assert not disagreements, "\n".join(disagreements)


# -- parsers of displayed words --------------------------------------------------------------------
def parse_age(text: str) -> float:
    """fmt_age's words back to seconds: "45 s", "21 min", "1.2 h", "2.0 d"."""
    m = re.fullmatch(r"([\d.,]+) (s|min|h|d)", text.strip())
    assert m, f"not an age: {text!r}"
    return float(m[1].replace(",", "")) * {"s": 1, "min": 60, "h": 3600, "d": 86400}[m[2]]


def parse_pct(text: str) -> float:
    m = re.search(r"([\d.]+)%", text)
    assert m, f"no percentage in {text!r}"
    return float(m[1])


def parse_count(text: str) -> int:
    return int(text.replace(",", ""))


def parse_rate(text: str) -> float:
    """fmt_rate's words: "950", "9.4K"."""
    m = re.fullmatch(r"([\d.,]+)(K?)", text.strip())
    assert m, f"not a rate: {text!r}"
    return float(m[1].replace(",", "")) * (1000 if m[2] else 1)


TILE_RE = re.compile(
    r'<div class="rh-tile (\w+)"><div class="rh-label">(.*?)</div><div class="rh-value">(.*?)</div>'
    r'<div class="rh-sub">(.*?)</div></div>'
)


def tiles_of(at) -> dict[str, tuple[str, str]]:
    """Label -> (value, sub) of every tile on an AppTest page (HTML unescaped)."""
    import html

    out = {}
    for m in (x for el in at.markdown for x in TILE_RE.finditer(el.value)):
        out[html.unescape(m[2])] = (html.unescape(m[3]), html.unescape(m[4]))
    return out


def tile(tiles: dict[str, tuple[str, str]], prefix: str) -> tuple[str, str]:
    return next(v for k, v in tiles.items() if k.startswith(prefix))


def eta_state_of_tile(value: str, sub: str) -> str:
    if value == "done":
        return "done"
    if value != "—":
        return "shown"
    if "stalled" in sub:
        return "none: stalled"
    if "stale" in sub:
        return "none: stale"
    if "after" in sub and "of writing" in sub:
        return "none: too early"
    return "none"


def eta_state_of_record(r: dict[str, Any]) -> str:
    """The headline record's ETA state (status --json, the downloads)."""
    if r.get("eta_hours_at_15_min_avg") is not None:
        return "done" if r["eta_hours_at_15_min_avg"] == 0 else "shown"
    return {"stalled": "none: stalled", "stale": "none: stale"}.get(r["run_state"]) or r.get("eta_withheld") or "none"


def prom(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The exposition text as name -> [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        assert m, line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m[2] or ""))
        out.setdefault(m[1], []).append((labels, float(m[3])))
    return out


# -- scenarios ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Scenario:
    """A run's store and config at `now`, and the truth its lines hold."""

    name: str
    folder: Path
    config: Path
    now: float
    completions: int = 0
    answered: int = 0
    failed: int = 0  # failed request lines written (OpenAI Batch 500s: the simulator's and the case's)
    truth: dict[str, Any] = dataclasses.field(default_factory=dict)  # facts the case fixes, beside its lines'


def write_config(
    folder: Path,
    nodes: tuple[str, ...],
    target: int,
    expected: int | None,
    extra: str = "",
    ceiling: int = CEILING,
    run_name: str = "consistency-run",
) -> Path:
    lines = [
        "[run]",
        f'name = "{run_name}"',
        f"target_completions = {target}",
        f"interval_s = {INTERVAL_S}",
        *([f"max_output_tokens = {ceiling}"] if ceiling else []),  # None: the ceiling is detected
        f'store_path = "{folder / "store.sqlite3"}"',
        *([f"expected_prompts = {expected}"] if expected else []),
        extra,
    ]
    for n in nodes:
        lines += ["", "[[nodes]]", f'name = "{n}"', 'host = "local"', f'shards = ["{folder / "shards" / n}.jsonl"]']
        lines += [f'python = "{sys.executable}"', 'gpu = "off"']
    path = folder / "runhealth.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def build(
    folder: Path,
    name: str,
    plan: dict[str, Callable[[int], int]],
    polls: int,
    *,
    target: int,
    expected: int | None = None,
    extra: str = "",
    seed: int = 5,
    ceiling: int = CEILING,
    no_usage_every: int = 0,
    failed_every: int = 0,
    configured: bool = True,
    run_name: str = "consistency-run",
) -> Scenario:
    """`polls` polls 30 s apart ending now; at poll k node n writes plan[n](k) fresh simulator lines
    (prompt IDs with the simulator's retries and skips, ~0.5% failed requests), scanned by the real
    scanner; every `no_usage_every`-th line without its usage (a length the scanner estimates);
    every `failed_every`-th a failed request (an OpenAI Batch 500, the simulator's failed line)."""
    now = float(int(time.time()))
    sim = Simulator(folder, seed=seed, ceiling=ceiling)
    sim.shard_dir.mkdir(parents=True)
    shards = {n: sim.shard_dir / f"{n}.jsonl" for n in plan}
    for p in shards.values():
        p.write_text("")
    store = Store(folder / "store.sqlite3")
    at = {n: (None, 0) for n in shards}
    ids: list[str] = []
    failed = 0
    for k in range(polls):
        ts = now - (polls - 1 - k) * INTERVAL_S
        for node, path in shards.items():
            fresh = [sim.completion_line(1) for _ in range(plan[node](k) if k else 0)]
            if no_usage_every:
                fresh = [_without_usage(x) if i % no_usage_every == 0 else x for i, x in enumerate(fresh, 1)]
            if failed_every:  # counted over the run's lines, not each poll's
                fresh = [sim.failed_line() if i % failed_every == 0 else x for i, x in enumerate(fresh, len(ids) + 1)]
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(fresh)
            for line in fresh:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the simulator's half-written line: malformed
                if (record.get("response") or {}).get("status_code", 200) != 200:
                    failed += 1  # a failed request: no completion, no answered prompt
                elif "custom_id" in record:
                    ids.append(record["custom_id"])
            entry = scan.scan_file(str(path), *at[node], 1 << 30)
            at[node] = (entry["inode"], entry["offset"])
            write_reply(store, node, poll_reply(ts + 0.4, [], {str(path): entry}), ts, rtt_ms=5.0)
    config = write_config(folder, tuple(plan), target, expected, extra, ceiling if configured else None, run_name)
    store.set_meta("run", RunSettings.from_config(load_config(config)).to_meta())  # as its collector records it
    store.close()
    assert failed == len(sim.fields.failed)  # the simulator's truth, as written
    return Scenario(name, folder, config, now, len(ids), len(set(ids)), failed)


def _without_usage(line: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return line  # the simulator's half-written line stays as it is
    record.pop("usage", None)
    return json.dumps(record) + "\n"


POLLS = 41  # 20 min: the 15-min average holds the run's writing


def straggler(folder: Path) -> Scenario:
    """Two nodes with fixed shares (the default): loc writes 8 lines a poll, sshn 3. The run-rate
    ETA is ~25 min; sshn writes its share an hour from now."""
    s = build(folder, "straggler", {"loc": lambda k: 8, "sshn": lambda k: 3}, POLLS, target=1_000, expected=1_000)
    s.truth = {"eta_node": "sshn", "late_nodes": ("sshn",), "progress_pct": round(100 * s.answered / 1_000, 2)}
    return s


def stalled(folder: Path) -> Scenario:
    """Both nodes wrote for 20 min, then nothing for the last 10 (the polls go on)."""
    s = build(
        folder,
        "stalled",
        {"loc": lambda k: 6 if k <= 40 else 0, "sshn": lambda k: 6 if k <= 40 else 0},
        61,
        target=2_000,
    )
    s.truth = {"run_stalled": True, "eta_state": "none: stalled", "stalled_nodes": ()}
    return s


def share_done(folder: Path) -> Scenario:
    """loc wrote its share (660 of 1,320) and stopped 3 min ago; sshn still writes."""
    s = build(folder, "share_done", {"loc": lambda k: 16 if k <= 44 else 0, "sshn": lambda k: 4}, 51, target=1_320)
    s.truth = {"done_nodes": ("loc",), "stalled_nodes": (), "run_stalled": False}
    return s


def target_reached(folder: Path) -> Scenario:
    """Both nodes wrote past the target in 15 min and stopped 15 min ago: the run is done, not
    stalled (#41: Output lengths' and Compare's ETA kept a second copy of the run state, which
    called it stalled and withheld the "done" the Overview shows)."""
    s = build(
        folder,
        "target_reached",
        {"loc": lambda k: 6 if k <= 30 else 0, "sshn": lambda k: 6 if k <= 30 else 0},
        61,
        target=300,
    )
    s.truth = {"eta_state": "done", "run_stalled": False}
    return s


def unconfigured_ceiling(folder: Path) -> Scenario:
    """No max_output_tokens in the config (the ceiling is detected) and context-window stops: the
    simulator's `length` stops below the ceiling, whose prompt filled MAX_MODEL_LEN (0.3% of its
    lines). Issue 41: the per-group table counted them as cut (147 = 127 at the ceiling + 20),
    the headline did not."""
    s = build(
        folder, "unconfigured", {"loc": lambda k: 60, "sshn": lambda k: 40}, POLLS, target=20_000, configured=False
    )
    store = Store(folder / "store.sqlite3")
    try:
        below = sum(r["count"] for r in store.length_counts(by="run", finish_reason="length") if r["tokens"] < CEILING)
    finally:
        store.close()
    assert below >= 3, "the case needs context-window stops to prove anything"
    return s


def failed_requests(folder: Path) -> Scenario:
    """One line in 25 a failed request (OpenAI Batch status 500) beside the simulator's ~0.5%:
    ~4.5% of requests, past the 1% warning, so the webhook carries the count too (#39)."""
    s = build(folder, "failed", {"loc": lambda k: 12, "sshn": lambda k: 8}, POLLS, target=5_000, failed_every=25)
    assert s.failed >= 30, "the case needs failed requests to prove anything"
    s.truth = {"failed_requests": s.failed, "failed_pct": round(100 * s.failed / (s.completions + s.failed), 3)}
    return s


SCENARIOS = {
    "failed_requests": failed_requests,
    "straggler": straggler,
    "stalled": stalled,
    "share_done": share_done,
    "unconfigured_ceiling": unconfigured_ceiling,
    "target_reached": target_reached,
}


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def scenario(request, tmp_path_factory) -> Scenario:
    return SCENARIOS[request.param](tmp_path_factory.mktemp(request.param))


@pytest.fixture
def frozen(scenario, monkeypatch):
    """The process's wall clock held at the scenario's instant while the consumers read."""
    monkeypatch.setattr(time, "time", lambda: scenario.now)
    return scenario


# -- consumers ----------------------------------------------------------------------------------------
def from_record(r: dict[str, Any]) -> dict[str, Any]:
    """The facts of the Overview's headline record (status --json, the JSON/CSV downloads)."""
    out: dict[str, Any] = {
        "completions": r["completions"],
        "cut_count": r["truncated_count"],
        "eta_state": eta_state_of_record(r),
        "run_stalled": r["run_state"] == "stalled",
        "late_nodes": tuple(sorted(r["late_nodes"])),
        "stalled_nodes": tuple(
            sorted(a.get("node") or a["summary"].split(":")[0] for a in r["alerts"] if a["name"] == "node_stalled")
        ),
    }
    if r["truncated_pct"] is not None:
        out["cut_pct"] = r["truncated_pct"]
    if r["progress_pct"] is not None:
        out["progress_pct"] = r["progress_pct"]
    if r["eta_hours_at_15_min_avg"] is not None:
        out["eta_s"] = r["eta_hours_at_15_min_avg"] * 3600
        out["eta_node"] = r.get("eta_last_node") or ""
    if r["tokens_per_s_last_1_min"] is not None:
        out["tokens_per_s"] = r["tokens_per_s_last_1_min"]
    if r["prompts_answered"] is not None:
        out["prompts_answered"] = r["prompts_answered"]
        out["prompts_twice"] = r["prompts_answered_twice"]
    if r["prompts_missing"] is not None:
        out["prompts_missing"] = r["prompts_missing"]
    if "done_nodes" in r:
        out["done_nodes"] = tuple(sorted(r["done_nodes"]))
    if r.get("failed_pct") is not None:  # None before any request came back
        out["failed_requests"] = int(r["failed_requests"])
        out["failed_pct"] = float(r["failed_pct"])
    return out


def extract_status_json(s: Scenario, capsys) -> dict[str, Any]:
    cli.main(["status", "--config", str(s.config), "--json"])
    return from_record(json.loads(capsys.readouterr().out))


def extract_downloads(s: Scenario, capsys) -> dict[str, Any]:
    """The headline JSON and CSV downloads: their bytes, as the sidebar's buttons hand them out."""
    from components import page

    store = Store(load_config(s.config).resolved_store_path())
    try:
        record = overview.overview(store, load_config(s.config), s.now).headline()
    finally:
        store.close()
    as_json, as_csv = page.headline_files(record)
    from_json = from_record(json.loads(as_json))
    row = pd.read_csv(io.BytesIO(as_csv)).iloc[0].to_dict()
    row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
    row["alerts"] = json.loads(as_json)["alerts"]  # the CSV leaves the list out
    row["late_nodes"] = json.loads(row["late_nodes"]) if isinstance(row["late_nodes"], str) else []
    if isinstance(row.get("done_nodes"), str):
        row["done_nodes"] = json.loads(row["done_nodes"])
    from_csv = from_record(row)
    assert from_csv == from_json, (from_csv, from_json)
    return from_json


def extract_metrics(s: Scenario, capsys) -> dict[str, Any]:
    store = Store(load_config(s.config).resolved_store_path())
    try:
        text = exporter.scrape_text(store, clock=lambda: s.now).decode()
    finally:
        store.close()
    m = prom(text)
    out: dict[str, Any] = {"completions": int(sum(v for _l, v in m["runhealth_completions_total"]))}
    if "runhealth_group_truncated" in m:  # the per-group gauges sum to the headline's cuts (#41)
        out["cut_count_groups"] = int(sum(v for _l, v in m["runhealth_group_truncated"]))
    if "runhealth_completions_at_ceiling_total" in m:
        out["cut_count"] = int(sum(v for _l, v in m["runhealth_completions_at_ceiling_total"]))
        out["cut_pct"] = round(100 * m["runhealth_truncated_ratio"][0][1], 2)
    if "runhealth_progress_ratio" in m:
        out["progress_pct"] = round(100 * m["runhealth_progress_ratio"][0][1], 2)
    alerts = m.get("runhealth_alert", [])
    out["stalled_nodes"] = tuple(sorted(lab["node"] for lab, _v in alerts if lab["alert"] == "node_stalled"))
    out["run_stalled"] = any(lab["alert"] == "run_stalled" for lab, _v in alerts)
    if "runhealth_node_done" in m:
        out["done_nodes"] = tuple(sorted(lab["node"] for lab, v in m["runhealth_node_done"] if v == 1))
    if "runhealth_eta_seconds" in m:
        out["eta_s"] = m["runhealth_eta_seconds"][0][1]
    if "runhealth_failed_requests_ratio" in m:
        out["failed_requests"] = int(sum(v for _l, v in m.get("runhealth_failed_requests_total", [])))
        out["failed_pct"] = round(100 * m["runhealth_failed_requests_ratio"][0][1], 3)
    for fact, name in (
        ("prompts_answered", "runhealth_prompts_answered"),
        ("prompts_missing", "runhealth_prompts_missing"),
        ("prompts_twice", "runhealth_prompts_answered_more_than_once"),
    ):
        if name in m:
            out[fact] = int(m[name][0][1])
    return out


def extract_webhook(s: Scenario, capsys) -> dict[str, Any]:
    """The bodies a webhook receiver gets at this instant (the generic JSON)."""
    store = Store(load_config(s.config).resolved_store_path())
    try:
        n = notify.Notifier(store, [], clock=lambda: s.now)
        bodies = [e.generic() for e in n.check()]
    finally:
        store.close()
    out: dict[str, Any] = {
        "stalled_nodes": tuple(sorted(b["node"] for b in bodies if b["alert"] == "node_stalled")),
        "run_stalled": any(b["alert"] == "run_stalled" for b in bodies),
    }
    for b in bodies:  # the failed-requests alert's body, where it fires: "N requests failed", value the share
        if b["alert"] == "failed_requests_high":
            m = re.search(r"([\d,]+) requests failed", b["summary"])
            assert m, b["summary"]
            out["failed_requests"], out["failed_pct"] = parse_count(m[1]), 100 * b["value"]
    return out


def _run_app(s: Scenario, page: str, monkeypatch, kiosk: bool = False):
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(s.config))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = open_app(page)
    if kiosk:
        at.query_params["kiosk"] = "1"
    at.run()
    assert_clean(at)
    return at


def _alert_facts(at) -> dict[str, Any]:
    words = [e.value for e in [*at.error, *at.warning]]
    return {
        "stalled_nodes": tuple(
            sorted(m[1] for w in words if (m := re.match(r"(\S+): no new completions for", w.lstrip("⚠ 🔴"))))
        ),
        "run_stalled": any("Run stalled" in w for w in words),
    }


def extract_overview_page(s: Scenario, capsys, monkeypatch) -> dict[str, Any]:
    at = _run_app(s, "overview", monkeypatch)
    tiles = tiles_of(at)
    out: dict[str, Any] = {"completions": parse_count(tile(tiles, "Completions")[0])}
    done_sub = tile(tiles, "Completions")[1]
    if "%" in done_sub:
        out["progress_pct"] = parse_pct(done_sub)
    value, sub = tile(tiles, "ETA")
    out["eta_state"] = eta_state_of_tile(value, sub)
    if out["eta_state"] == "shown":
        out["eta_s"] = parse_age(value)
        m = re.search(r"(\S+)'s share ends the run", sub)
        out["eta_node"] = m[1] if m else ""
    cut_value, cut_sub = tile(tiles, "Truncated")
    if cut_value.endswith("%"):
        out["cut_pct"] = parse_pct(cut_value)
        m = re.search(r"([\d,]+) of ([\d,]+)$", cut_sub)
        assert m, cut_sub
        out["cut_count"] = parse_count(m[1])
    rate = tile(tiles, "Tokens / s")[0]
    if rate != "—":
        out["tokens_per_s"] = parse_rate(rate)
    bars = at.get("progress")
    if bars:
        text = bars[0].proto.text
        m = re.match(r"([\d,]+) of ([\d,]+) (prompts answered|completions)", text)
        assert m, text
        # a run past its target: the bar is full ("360 of 300 completions" is 100%, as every progress)
        out["progress_pct_bar"] = min(100.0, round(100 * parse_count(m[1]) / parse_count(m[2]), 2))
    out.update(failed_of_line(at))
    stragglers = next((el.value for el in at.markdown if el.value.startswith("**Stragglers:**")), "")
    # a finish on another day reads "node at Mon 00:30" (screens/etas.clock): late in the evening, the usual
    out["late_nodes"] = tuple(
        sorted(re.findall(r"(\S+) (?:finishes )?at (?:[A-Z][a-z]{2} )?\d\d:\d\d", stragglers.split(";", 1)[-1]))
    )
    out.update(_alert_facts(at))
    out.update(_node_states(at))
    return out


def parse_failed(text: str) -> dict[str, Any]:
    """FailedRequests.value's words: "12 (0.5% of requests)", or "0"."""
    m = re.match(r"([\d,]+)(?: \(([\d.]+)% of requests\))?", text)
    assert m, text
    return {"failed_requests": parse_count(m[1])} | ({"failed_pct": float(m[2])} if m[2] else {})


def failed_of_line(at) -> dict[str, Any]:
    """The Overview's failed line, "Failed requests 12 (0.5% of requests) · ...", when shown."""
    line = next((el.value for el in at.markdown if "Failed requests" in el.value), None)
    if line is None:
        return {}
    return parse_failed(line.replace("\\", "").split("Failed requests ", 1)[1])


def _node_states(at) -> dict[str, Any]:
    """The node table's states (its "status" column): the nodes it shows DONE (wrote their share)."""
    # a data grid, or a static table where the page shows a handful of nodes (the Overview, #42)
    frames = [t.value for t in at.table] + [df.value for df in at.dataframe]
    table = next((f for f in frames if {"node", "status"} <= set(f.columns)), None)
    assert table is not None, "no node table"
    return {
        "done_nodes": tuple(sorted(n for n, st in zip(table["node"], table["status"], strict=True) if st == "DONE"))
    }


def extract_nodes_page(s: Scenario, capsys, monkeypatch) -> dict[str, Any]:
    """The Nodes page: its node table's states (#41: a node that wrote its share read UP there
    beside the Overview's "the other nodes have written their shares") and the per-node failed
    table (#39), summed over the nodes (shown when any failed)."""
    at = _run_app(s, "nodes", monkeypatch)
    out = _node_states(at)
    table = next((df.value for df in at.dataframe if "Failed requests" in df.value.columns), None)
    if table is not None:
        out["failed_requests"] = sum(parse_failed(str(x))["failed_requests"] for x in table["Failed requests"])
    return out


def extract_kiosk(s: Scenario, capsys, monkeypatch) -> dict[str, Any]:
    at = _run_app(s, "overview", monkeypatch, kiosk=True)
    value, sub = tile(tiles_of(at), "ETA")
    out: dict[str, Any] = {"eta_state": eta_state_of_tile(value, sub)}
    if out["eta_state"] == "shown":
        out["eta_s"] = parse_age(value)
    return out


def extract_lengths_page(s: Scenario, capsys, monkeypatch) -> dict[str, Any]:
    at = _run_app(s, "lengths", monkeypatch)
    tiles = tiles_of(at)
    out: dict[str, Any] = {}
    cut_value, cut_sub = tile(tiles, "Truncated")
    out["cut_pct"] = parse_pct(cut_value)
    m = re.search(r"([\d,]+) of ([\d,]+)$", cut_sub)
    assert m, cut_sub
    out["cut_count"] = parse_count(m[1])
    # Each table a data grid, or a static table (a few rows, #42: the grid's labels as its columns).
    frames = [df.value for df in at.dataframe] + [t.value.rename(columns={"cut": "at_ceiling"}) for t in at.table]
    groups = next((f.rename(columns={"node": "group"}) for f in frames if {"node", "drift"} <= set(f.columns)), None)
    if groups is None:
        groups = next((f for f in frames if {"group", "at_ceiling", "drift"} <= set(f.columns)), None)
    if groups is not None:
        out["cut_count_groups"] = sum(parse_count(str(x)) for x in groups["at_ceiling"])
        out["completions"] = sum(parse_count(str(x)) for x in groups["completions"])
    panel = next(
        (df.value for df in [*at.dataframe, *at.table] if {"share cut", "95% interval"} <= set(df.value.columns)), None
    )
    if panel is not None:  # "Which prompts get cut": its cut column is the headline's rule (#41)
        out["cut_count_group_panel"] = sum(parse_count(str(x)) for x in panel["cut"])
    eta = tiles.get("ETA change")
    if eta is not None:
        out["eta_change_shown"] = eta[0] != "—"
    return out


def extract_lengths_model(s: Scenario, capsys) -> dict[str, Any]:
    cfg = load_config(s.config)
    store = Store(cfg.resolved_store_path())
    try:
        m = lengths.lengths(store, cfg, s.now)
    finally:
        store.close()
    out: dict[str, Any] = {"completions": m.summary.completions, "cut_count": m.summary.at_ceiling}
    shown, why = m.eta_s, m.to_json().get("eta_withheld", "")
    out["eta_state"] = "shown" if shown else "done" if shown == 0 else {"run stalled": "none: stalled"}.get(why, "none")
    if shown:
        out["eta_s"] = shown
        out["eta_node"] = getattr(m.run_eta, "last_node", "")
    return out


CONSUMERS: dict[str, Callable[..., dict[str, Any]]] = {
    "status --json": extract_status_json,
    "downloads": extract_downloads,
    "/metrics": extract_metrics,
    "webhook": extract_webhook,
    "lengths model": extract_lengths_model,
}
PAGES: dict[str, Callable[..., dict[str, Any]]] = {
    "overview page": extract_overview_page,
    "kiosk": extract_kiosk,
    "lengths page": extract_lengths_page,
    "nodes page": extract_nodes_page,
}


# Where a fact must be shown when the case fixes it (a consumer that drops it cannot disagree).
SHOWN_BY = {
    "eta_node": ("status --json", "downloads", "overview page", "lengths model"),
    "late_nodes": ("status --json", "downloads", "overview page"),
    "progress_pct": ("status --json", "downloads", "/metrics", "overview page", "overview progress_pct_bar"),
    "done_nodes": ("status --json", "downloads", "/metrics", "overview page", "nodes page"),
    "run_stalled": ("status --json", "/metrics", "webhook", "overview page"),
    "eta_state": ("status --json", "downloads", "overview page", "kiosk", "lengths model"),
    "failed_requests": ("status --json", "downloads", "/metrics", "webhook", "overview page", "nodes page"),
    "failed_pct": ("status --json", "downloads", "/metrics", "webhook", "overview page"),
}


def read_all(s: Scenario, capsys, monkeypatch) -> dict[str, dict[str, Any]]:
    truth = {"completions": s.completions, "prompts_answered": s.answered, "failed_requests": s.failed}
    if s.failed:
        truth["failed_pct"] = round(100 * s.failed / (s.completions + s.failed), 3)
    seen = {"truth": truth | s.truth}
    seen |= {name: f(s, capsys) for name, f in CONSUMERS.items()}
    seen |= {name: f(s, capsys, monkeypatch) for name, f in PAGES.items()}
    page = seen["overview page"]  # the bar's two numbers are the progress fact twice
    for key in ("progress_pct_bar",):
        if key in page:
            seen[f"overview {key}"] = {"progress_pct": page.pop(key)}
    groups = seen["lengths page"]
    if "cut_count_groups" in groups:
        seen["lengths per-group table"] = {"cut_count": groups.pop("cut_count_groups")}
    if "cut_count_group_panel" in groups:
        seen["lengths which-prompts panel"] = {"cut_count": groups.pop("cut_count_group_panel")}
    if "cut_count_groups" in seen["/metrics"]:
        seen["/metrics per-group gauges"] = {"cut_count": seen["/metrics"].pop("cut_count_groups")}
    return seen


def test_one_value_per_fact_on_every_consumer(frozen, capsys, monkeypatch):
    seen = read_all(frozen, capsys, monkeypatch)
    missing = [(f, c) for f in frozen.truth for c in SHOWN_BY.get(f, ()) if f not in seen.get(c, {})]
    assert not missing, f"facts the case fixes, not shown: {missing}"
    assert_one_value(seen)


def test_group_cuts_sum_to_the_headline_cut_count(tmp_path_factory, capsys, monkeypatch):
    """Issue 41 ("cut means two things"): with a detected ceiling and context-window stops, the
    "Which prompts get cut" panel and /metrics' per-group gauges counted every `length` stop of a
    group as cut; summed over the groups they must be the headline's cut count, and the stops
    below the ceiling are there, shown apart."""
    s = unconfigured_ceiling(tmp_path_factory.mktemp("group_cuts"))
    monkeypatch.setattr(time, "time", lambda: s.now)
    seen = read_all(s, capsys, monkeypatch)
    headline = seen["lengths model"]["cut_count"]
    assert headline > 0
    assert seen["lengths which-prompts panel"]["cut_count"] == headline
    assert seen["/metrics per-group gauges"]["cut_count"] == headline
    cfg = load_config(s.config)
    store = Store(cfg.resolved_store_path())
    try:
        m = lengths.lengths(store, cfg, s.now)
    finally:
        store.close()
    assert m.fields is not None and m.fields.groups.counts == "cut"
    below = sum(r.below_ceiling or 0 for r in m.fields.groups.rows)
    assert below == m.summary.length_below_ceiling > 0  # the context window's stops, apart
    assert_one_value(seen)


# -- two runs: Compare ----------------------------------------------------------------------------------
CEILING_B = 8192


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Scenario:
    """Run A (finished, max_tokens 4,096) and its relaunch B at 8,192, one config with two [[runs]]
    tables; B has lines without usage (their lengths estimated, left out of the shares' n), and A
    no loop sample (an empty one, as a store without sampling has): the what-if's loop term unmeasured."""
    folder = tmp_path_factory.mktemp("two_runs")
    a = build(folder / "a", "a", {"loc": lambda k: 150}, 21, target=3_000, run_name="run-a", seed=7)
    b = build(
        folder / "b",
        "b",
        {"loc": lambda k: 100},
        21,
        target=4_000,
        ceiling=CEILING_B,
        no_usage_every=40,
        run_name="run-b",
        seed=8,
    )
    both = []
    for s, finished in ((a, True), (b, False)):
        text = s.config.read_text(encoding="utf-8").replace("[run]", "[[runs]]").replace("[[nodes]]", "[[runs.nodes]]")
        both.append(text.replace("[[runs]]\n", "[[runs]]\nfinished = true\n") if finished else text)
    config = folder / "runhealth.toml"
    config.write_text("\n".join(both), encoding="utf-8")
    assert b.failed > 0, "B's failed requests (the simulator's ~0.5%) are part of the case"
    return Scenario("two_runs", folder, config, b.now, truth={"shards": (a.folder, b.folder), "b_failed": b.failed})


def extract_compare_cli(s: Scenario, capsys) -> dict[str, Any]:
    """`runhealth compare --json` over A's and B's shards, each run's ceiling as its config says."""
    a, b = (str(f / "shards" / "*.jsonl") for f in s.truth["shards"])
    cli.main(["compare", "--json", "--ceiling-a", str(CEILING), "--ceiling-b", str(CEILING_B), a, "--", b])
    r = json.loads(capsys.readouterr().out)
    f = r["forecast"]
    return {
        "forecast_interval_pct": tuple(round(100 * x, 1) for x in f["interval"]),
        "forecast_loop_note": f["interval_note"].strip(),
        "compare_b_n": r["b"]["length_count"],
        "failed_requests": r["b"]["failed_requests"],  # run B's (#39)
        "failed_pct": r["b"]["failed_pct"],
    }


def extract_compare_page(s: Scenario, capsys, monkeypatch) -> dict[str, dict[str, Any]]:
    """The Compare page's captions: the table's n for B, the forecast's interval (twice) and B's n."""
    at = _run_app(s, "compare", monkeypatch)
    assert at.selectbox(key="compare_run_a").value == "run-a", "the page opens on A = the finished run"
    words = [str(getattr(e, "value", "")) for kind in ("caption", "success", "warning") for e in getattr(at, kind)]
    out: dict[str, dict[str, Any]] = {}
    table = next(t.value for t in at.table if "metric" in t.value.columns)
    row = table.set_index("metric").loc["failed requests"]
    out["compare table, failed row"] = parse_failed(str(row["B: run-b"]))  # run B's (#39)
    for w in words:
        if m := re.search(r"B: n = ([\d,]+)", w):
            out["compare table caption"] = {"compare_b_n": parse_count(m[1])}
        if m := re.match(r"95% interval ([\d.]+)–([\d.]+)%( assuming no loops| incl\. loops 0–100%)?;", w):
            out["compare forecast caption"] = {
                "forecast_interval_pct": (float(m[1]), float(m[2])),
                "forecast_loop_note": (m[3] or "").strip(),
            }
        if m := re.search(r"\(n = ([\d,]+)", w):
            out["compare measured caption"] = {"compare_b_n": parse_count(m[1])}
        if m := re.search(r"predicted interval \(([\d.]+)–([\d.]+)%( assuming no loops| incl\. loops 0–100%)?\)", w):
            out["compare verdict"] = {
                "forecast_interval_pct": (float(m[1]), float(m[2])),
                "forecast_loop_note": (m[3] or "").strip(),
            }
    return out


def extract_lengths_whatif(s: Scenario, capsys, monkeypatch) -> dict[str, Any]:
    """Run A's Output lengths page, its what-if asked at B's ceiling: the tile's interval."""
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(s.config))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = open_app("lengths")
    at.query_params["run"] = "run-a"
    at.run()
    at.number_input(key="lengths_whatif_limit").set_value(CEILING_B).run()
    assert_clean(at)
    value, sub = tile(tiles_of(at), f"Still truncated at {CEILING_B:,}")
    m = re.search(r"95% ([\d.]+)%–([\d.]+)%( assuming no loops| incl\. loops 0–100%)?", sub)
    assert m, sub
    return {"forecast_interval_pct": (float(m[1]), float(m[2])), "forecast_loop_note": (m[3] or "").strip()}


def test_compare_one_forecast_interval_and_one_n_on_every_consumer(two_runs, capsys, monkeypatch):
    """Issue 41: Compare's forecast read "0.5%–16.3% incl. loops 0–100%" on the page (A's empty
    loop sample widened it to A's own cut share) and 0.5–3.4% in `runhealth compare`; run B's n
    was 30,247 in one caption and 30,057 in another. One interval, one loop note, one n for B on
    the Compare page, run A's Output lengths page at B's limit and `runhealth compare --json`."""
    monkeypatch.setattr(time, "time", lambda: two_runs.now)
    seen = {"compare --json": extract_compare_cli(two_runs, capsys)}
    seen |= extract_compare_page(two_runs, capsys, monkeypatch)
    seen["lengths page (A at B's limit)"] = extract_lengths_whatif(two_runs, capsys, monkeypatch)
    seen["truth (B's lines)"] = {"failed_requests": two_runs.truth["b_failed"]}
    assert set(seen) == {
        "truth (B's lines)",
        "compare --json",
        "compare table, failed row",
        "compare table caption",
        "compare forecast caption",
        "compare measured caption",
        "compare verdict",
        "lengths page (A at B's limit)",
    }, seen
    n_b = seen["compare --json"]["compare_b_n"]
    assert 0 < n_b < 2_000, "B's estimated lengths are left out of its n (the case proves something)"
    assert_one_value(seen)
    assert seen["compare --json"]["forecast_loop_note"] == "assuming no loops"
