"""The demo run looks like the seed run, and goes through the real agent, parser and collector."""

import time
import urllib.request

import pytest

from components import tables
from runhealth.analysis import loops, servermetrics, stats
from runhealth.cli import scan_paths
from runhealth.collect.collector import Collector
from runhealth.demo import DEMO_CONTEXT, Simulator, demo_config
from runhealth.rules import hardware
from runhealth.screens import serverview
from runhealth.settings.config import parse_config
from runhealth.store import Store


def test_demo_shards_match_the_seed_story(tmp_path):
    sim = Simulator(tmp_path, seed=1)
    sim.shard_dir.mkdir(parents=True)
    sim.write_backlog(6000)
    failed: dict[str, int] = {}
    hist, malformed, unmatched = scan_paths([str(sim.shard_dir / "*.jsonl")], failed=failed)
    summary = stats.summarize(hist, unparseable=malformed)
    # ~0.5% failed requests (OpenAI Batch 500s), counted apart: exactly the simulator's, none a completion
    assert failed == {"server_error": len(sim.fields.failed)} and 10 <= len(sim.fields.failed) <= 60
    assert unmatched == [] and summary.completions + malformed + len(sim.fields.failed) == 6000
    assert summary.ceiling_tokens == 4096 and summary.ceiling_source == "detected"
    assert 0.15 <= summary.at_ceiling_fraction <= 0.21  # the seed run: 18%
    assert 2200 <= summary.tokens.mean <= 2700 and summary.tokens.p90 == 4096
    assert summary.length_below_ceiling > 0  # a few context-window stops, counted apart


def test_demo_loops_are_found_by_the_loop_detector(tmp_path):
    sim = Simulator(tmp_path, seed=2)
    looping = [sim.text(3072, True) for _ in range(20)]
    varied = [sim.text(3072, False) for _ in range(20)]
    assert loops.loop_share(looping)["loops"] == 20
    assert loops.loop_share(varied)["loops"] == 0


def test_demo_metrics_pages_parse_as_sglang_and_vllm(tmp_path):
    sim = Simulator(tmp_path, seed=3)
    assert sim.start()
    try:
        texts = {
            i: urllib.request.urlopen(f"http://127.0.0.1:{sim.metrics_port}/node{i}/metrics", timeout=5).read()
            for i in (1, 2)
        }
    finally:
        sim.stop()
    sglang, vllm = servermetrics.parse_server_metrics(texts[1]), servermetrics.parse_server_metrics(texts[2])
    assert sglang["server"] == "sglang" and sglang["values"]["sglang:gen_throughput"] > 0
    assert vllm["server"] == "vllm" and 'vllm:request_success_total{finished_reason="length"}' in vllm["values"]


def test_demo_servers_show_their_token_histograms_beside_the_shards(tmp_path):
    """The demo's SGLang node has bucket edges at the ceiling - 1 and the ceiling (as the README
    tells SGLang users): its view is exact and equals the simulator's own count; the vLLM node
    has vLLM's default edges: bounds, and the advice."""
    sim = Simulator(tmp_path, seed=5, ceiling=4096)
    for node in (1, 2):
        for _ in range(400):
            sim.completion_line(node)
    rows = [
        {"node": f"n{i}", "name": k, "value": v, "ts_unix": 0.0}
        for i in (1, 2)
        for k, v in servermetrics.parse_server_metrics(sim.metrics_text(i))["values"].items()
    ]
    cut = sum(sim.lengths[1][t] for t in sim.lengths[1] if t >= 4096)
    served = sum(sim.lengths[1].values())  # the server's finished requests: no failed or broken line
    assert 380 <= served <= 400
    hist = stats.LengthHist.from_rows([(4096, "length", 0, 1), (10, "stop", 0, 1)])
    view = serverview.server_view(rows, stats.summarize(hist, 4096))
    assert view is not None and view.gen_tokens is not None
    assert view.gen_tokens.name == "sglang:generation_tokens_histogram"  # the one with the ceiling's edge
    sglang = serverview.server_view([r for r in rows if r["node"] == "n1"], stats.summarize(hist, 4096))
    assert sglang is not None and sglang.gen_tokens is not None and sglang.gen_tokens.edges_for(4096)
    assert sglang.gen_tokens.at_least(4096) == (pytest.approx(cut / served), pytest.approx(cut / served))
    vllm = serverview.server_view([r for r in rows if r["node"] == "n2"], stats.summarize(hist, 4096))
    assert vllm is not None and vllm.gen_tokens is not None and not vllm.gen_tokens.edges_for(4096)
    assert any("no bucket edge at 4,095" in line for line in vllm.lines())
    assert any("finished by length" in line for line in view.lines())
    assert any("max_tokens of at most 5,000" in line for line in vllm.lines())


def _slow_first_reply(request, delay_s: float):
    """`request`, with its first reply handed back `delay_s` late (the agent's reading taken on time)."""
    calls = []

    def slow(obj, timeout_s=None):
        reply = request(obj, timeout_s)
        calls.append(1)
        if len(calls) == 1:
            time.sleep(delay_s)
        return reply

    return slow


@pytest.mark.parametrize("first_reply_delay_s", [0.0, 1.0])
def test_demo_gpus_report_energy_per_usable_token(tmp_path, first_reply_delay_s):
    """Two polls of the demo through the real agent: the demo GPUs' energy counters give joules
    over the second poll, beside the usable tokens written in it. A slow first reply (an agent
    starting on a loaded machine) must not skew the watts: the simulated GPUs are read at the
    poll's send time, and that is the time the store keeps for them."""
    config = demo_config(tmp_path)
    sim = Simulator(tmp_path, seed=6)
    assert sim.start()
    store = Store(config.resolved_store_path())
    try:
        with Collector(config, store, context=DEMO_CONTEXT) as collector:
            for poller in collector.pollers.values():
                poller.transport.request = _slow_first_reply(poller.transport.request, first_reply_delay_s)
            collector.poll_once()
            time.sleep(1.5)
            collector.poll_once()
    finally:
        sim.stop()
    rows = store.node_energy()
    assert {r["node"] for r in rows} == {"demo-node-1", "demo-node-2"}
    assert all(r["counter_gpus"] == r["gpus"] and r["integrated_j"] == 0 for r in rows)
    measured = [r for r in rows if r["joules"] > 0]
    assert measured and all(800 * r["gpu_s"] <= r["joules"] <= 990 * r["gpu_s"] for r in measured)


def test_demo_config_is_valid_and_collects_through_the_real_agent(tmp_path):
    config = demo_config(tmp_path)
    assert DEMO_CONTEXT.demo and all(n.is_local and n.gpu == "demo" for n in config.nodes)
    # The same validation a user's file gets.
    raw = {
        "run": {"name": config.name},
        "nodes": [
            {k: v for k, v in n.public_dict().items() if not k.endswith("_set") and v is not None} for n in config.nodes
        ],
    }
    assert [n.name for n in parse_config(raw).nodes] == ["demo-node-1", "demo-node-2"]
    sim = Simulator(tmp_path, seed=4)
    assert sim.start()
    store = Store(config.resolved_store_path())
    try:
        with Collector(config, store, context=DEMO_CONTEXT) as collector:
            results = collector.poll_once()
    finally:
        sim.stop()
    assert all(isinstance(r, dict) for r in results.values()), results
    nodes = {n["name"]: n for n in store.nodes()}
    assert nodes["demo-node-1"]["gpus_found"] == 4 and nodes["demo-node-2"]["gpus_found"] == 3
    assert all(n["gpu_simulated"] for n in nodes.values())
    failed = sum(r["count"] for r in store.failed_rows())
    assert sum(n["completions"] + n["malformed"] for n in nodes.values()) + failed >= 4000
    # The failed requests the collector stored are exactly the Batch 500s in the bytes it counted.
    written = 0
    for shard in store.shards():
        with open(shard["path"], "rb") as f:
            written += sum(b'"status_code": 500' in line for line in f.read(shard["offset"]).splitlines())
    assert failed == written and written >= 5


def test_each_demo_node_has_its_own_gpus_and_a_simulated_host(tmp_path):
    """#41: the demo copied node-1's GPU numbers onto node-2 (the simulated readings depended on
    the GPU index and the clock only) and showed the dashboard machine's real CPU load and RAM
    warnings inside the simulated run. Each node's GPUs now read their own curves, and the demo's
    host readings are simulated and said so (no alert from the machine it runs on)."""
    config = demo_config(tmp_path)
    sim = Simulator(tmp_path, seed=4)
    assert sim.start()
    store = Store(config.resolved_store_path())
    try:
        with Collector(config, store, context=DEMO_CONTEXT) as collector:
            collector.poll_once()
        gpus = {(g["node"], int(g["gpu"])): g for g in store.gpu_latest()}
        hosts = store.host_latest()
        nodes = {n["name"]: n for n in store.nodes()}
    finally:
        sim.stop()
        store.close()
    for i in range(3):  # the GPUs both nodes have
        one, two = gpus[("demo-node-1", i)], gpus[("demo-node-2", i)]
        assert (one["power_w"], one["mem_used_mib"]) != (two["power_w"], two["mem_used_mib"]), i
    # every GPU its own readings (two powers alone may meet at 0.1 W, ~1 run in 100: CI saw it)
    assert len({(g["power_w"], g["mem_used_mib"], g["temp_c"]) for g in gpus.values()}) == len(gpus)
    assert set(hosts) == {"demo-node-1", "demo-node-2"} and all(h.get("simulated") for h in hosts.values())
    assert not hardware.host_findings(hosts, {n: r.get("loadavg") for n, r in nodes.items()})
    assert nodes["demo-node-1"]["loadavg"] != nodes["demo-node-2"]["loadavg"]
    assert (
        tables.node_details(nodes["demo-node-1"], time.time(), hosts["demo-node-1"])
        .isin(["simulated (demo): not this machine's load or RAM"])
        .any()
        .any()
    )
