"""The demo run looks like the seed run, and goes through the real agent, parser and collector."""

import urllib.request

from runhealth.analysis import loops, servermetrics, stats
from runhealth.cli import scan_paths
from runhealth.collect.collector import Collector
from runhealth.demo import DEMO_CONTEXT, Simulator, demo_config
from runhealth.settings.config import parse_config
from runhealth.store import Store


def test_demo_shards_match_the_seed_story(tmp_path):
    sim = Simulator(tmp_path, seed=1)
    sim.shard_dir.mkdir(parents=True)
    sim.write_backlog(6000)
    hist, malformed, unmatched = scan_paths([str(sim.shard_dir / "*.jsonl")])
    summary = stats.summarize(hist, unparseable=malformed)
    assert unmatched == [] and summary.completions + malformed == 6000
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
    assert sum(n["lines"] + n["malformed"] for n in nodes.values()) >= 4000
