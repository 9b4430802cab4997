"""Energy never inflates (#40 item 5): eight polls of a GPU at 650 W writing 1,000 usable tokens a
second, so the truth is 650 kJ and 0.28 GPU-h per 1M usable tokens, whatever its energy readings
do. On main a counter that stepped back 6.5 kJ (a faulty read, not a driver reload) was taken for
a reload and its whole reading counted (15.2 MJ per 1M, 23x); a GPU missing from three polls had
the energy across the gap counted without the tokens of it (1.14 MJ, 0.49 GPU-h); and a reading
of 2^63 mJ or more (NVML's all-ones "invalid") raised OverflowError in the store write, losing the
whole poll, shard counts included. Each fault here goes through the real ingest -> store ->
tokencost path, and once through the NVML stand-in and the real agent's poll.
"""

from __future__ import annotations

import sys
from pathlib import Path

import fake_pynvml
import pytest
import store_fixtures
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from shardgen import write_shard

from runhealth.alerting import exporter
from runhealth.analysis import tokencost
from runhealth.collect.collector import poll_request
from runhealth.node import agent
from runhealth.node import gpu as agent_gpu
from runhealth.screens import overview
from runhealth.screens import waste as waste_words
from runhealth.settings.config import load_config, parse_config
from runhealth.store import Store

DT = 10.0  # seconds between polls
POWER_W = 650.0
TOKENS, PER_POLL = 100, 100  # completions of 100 tokens, 100 a poll: 1,000 usable tokens/s
TRUTH_J_PER_M = POWER_W * DT / (TOKENS * PER_POLL) * 1e6  # 650 kJ
TRUTH_GPU_H_PER_M = DT / 3600 / (TOKENS * PER_POLL) * 1e6  # 0.28 GPU-h
T0 = 1_800_000_000.0
POLLS = 8
COUNTER0 = 8_123_456_789  # mJ since the driver loaded


def true_counter(k: int) -> int:
    return COUNTER0 + round(POWER_W * DT * 1000) * k


def faulty(fault: str, k: int) -> int | None | str:
    """The energy reading of poll `k` under `fault` ("absent": the GPU is not in the reply,
    "error": it is there as an error entry)."""
    if fault == "counter_back" and k == 4:
        return true_counter(3) - 6_500_000  # 6.5 kJ below the previous reading
    if fault == "forward_spike" and k == 4:
        return true_counter(4) + 100_000_000_000  # 100 MJ in 10 s: a faulty read
    if fault in ("absent", "error") and k in (3, 4, 5):
        return fault
    if fault == "no_reading" and k == 4:
        return "no_reading"  # neither energy nor power (N/A for one poll)
    if fault == "overflow" and k in (4, 5):
        return 2**63 if k == 4 else 2**64 - 1  # past SQLite's INTEGER; NVML's all-ones invalid value
    return true_counter(k)


def shard_entry(k: int) -> dict[str, dict]:
    size = TOKENS * PER_POLL * 4
    return {
        "/data/out/a.jsonl": {
            "inode": 7,
            "size": size * (k + 1),
            "offset_from": size * k,
            "offset": size * (k + 1),
            "reset": False,
            "malformed": 0,
            "tokens": TOKENS * PER_POLL,
            "counts": [[TOKENS, "stop", 0, PER_POLL]],
            "error": None,
        }
    }


def build(path: Path, fault: str) -> Store:
    store = Store(path)
    for k in range(POLLS):
        reading = faulty(fault, k)
        device = store_fixtures.gpu_device(0, 95.0, power_w=POWER_W)
        device["energy_mj"] = reading
        if reading == "no_reading":
            device["energy_mj"] = device["power_w"] = None
        devices = [] if reading == "absent" else [device]
        if reading == "error":
            devices = [{"index": 0, "error": "GPU is lost"}]
        ts = T0 + k * DT
        store_fixtures.write_reply(
            store, "node-1", store_fixtures.poll_reply(ts + 0.2, devices, shard_entry(k)), ts, rtt_ms=5.0
        )
    return store


DROPPED = {"none": 0, "counter_back": 2, "forward_spike": 2, "absent": 2, "error": 4, "overflow": 0, "no_reading": 2}


@pytest.mark.parametrize("fault", list(DROPPED))
def test_energy_per_usable_token_stays_the_truth_whatever_the_readings_do(fault, tmp_path):
    store = build(tmp_path / "s.sqlite3", fault)
    try:
        completions = sum(r["count"] for r in store.length_counts(by="run"))
        assert completions == POLLS * PER_POLL  # every poll's shard counts kept, a bad GPU value or not
        cost = tokencost.energy_cost(store.node_energy())
        assert cost is not None and cost.joules_per_m is not None and cost.gpu_hours_per_m is not None
        assert cost.joules_per_m == pytest.approx(TRUTH_J_PER_M, rel=0.01), waste_words.energy_line(cost)
        assert cost.gpu_hours_per_m == pytest.approx(TRUTH_GPU_H_PER_M, rel=0.01)
        assert cost.dropped_steps == DROPPED[fault]
        line = waste_words.energy_line(cost)
        if DROPPED[fault]:
            assert f"{DROPPED[fault]} steps dropped" in line, line
        else:
            assert "dropped" not in line, line
        fams = {
            f.name: f for f in text_string_to_metric_families(generate_latest(exporter.registry_for(store)).decode())
        }
        (per,) = fams["runhealth_energy_per_usable_token_joules"].samples
        assert per.value * 1e6 == pytest.approx(TRUTH_J_PER_M, rel=0.01)
        (dropped,) = fams["runhealth_gpu_energy_dropped_steps"].samples
        assert dropped.value == DROPPED[fault]
        # The Overview's record (`status --json`, the headline download): the same figures.
        config = load_config(store_fixtures.write_config(tmp_path, tmp_path / "s.sqlite3", nodes=1))
        record = overview.overview(store, config, T0 + POLLS * DT).to_json()
        assert record["joules_per_1m_usable_tokens"] == pytest.approx(TRUTH_J_PER_M, rel=0.01)
        assert record["energy_dropped_steps"] == DROPPED[fault] and record["energy_line"] == line
    finally:
        store.close()


def test_a_driver_reload_still_counts_what_was_used_since_it(tmp_path):
    """A counter back at a small value (no more than the GPU could draw since the interval began)
    is a reload, counted as before: the energy since the reload, a lower bound, and a reset."""
    store = Store(tmp_path / "s.sqlite3")
    try:
        for k, counter in enumerate([COUNTER0, COUNTER0 + 6_500_000, 3_000_000, 9_500_000]):
            device = store_fixtures.gpu_device(0, 95.0, power_w=POWER_W)
            device["energy_mj"] = counter
            ts = T0 + k * DT
            store_fixtures.write_reply(
                store, "node-1", store_fixtures.poll_reply(ts, [device], shard_entry(k)), ts, 5.0
            )
        (row,) = store.node_energy()
        assert row["joules"] == pytest.approx(6500 + 3000 + 6500) and row["resets"] == 1
        assert row["dropped_steps"] == 0
    finally:
        store.close()


@pytest.fixture
def nvml(monkeypatch):
    monkeypatch.setattr(agent_gpu, "NVML", agent_gpu._Nvml())
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    fake_pynvml.configure([dict(fake_pynvml.H200, uuid="GPU-0", power_mw=round(POWER_W * 1000))])
    yield fake_pynvml


@pytest.mark.parametrize("fault", ["counter_back", "overflow", "none"])
def test_the_real_agent_poll_with_a_faulty_nvml_counter(fault, nvml, tmp_path):
    """NVML's stand-in answers the agent's real poll; the shard is real lines on disk."""
    shard = tmp_path / "a.jsonl"
    write_shard(shard, [(TOKENS, "stop")] * PER_POLL)
    config = parse_config(
        {
            "run": {"name": "r", "store_path": str(tmp_path / "s.sqlite3")},
            "nodes": [{"name": "n", "host": "local", "shards": [str(shard)]}],
        }
    )
    store = Store(tmp_path / "s.sqlite3")
    try:
        for k in range(POLLS):
            if k:
                write_shard(shard, [(TOKENS, "stop")] * PER_POLL, mode="a")
            nvml.set_reading(0, "energy_mj", faulty(fault, k))
            reply = agent.handle(poll_request(config.nodes[0], store.shard_state("n")))
            assert reply["ok"], reply
            store_fixtures.write_reply(store, "n", reply, T0 + k * DT, 5.0)
        assert sum(r["count"] for r in store.length_counts(by="run")) == POLLS * PER_POLL
        cost = tokencost.energy_cost(store.node_energy())
        assert cost is not None and cost.joules_per_m == pytest.approx(TRUTH_J_PER_M, rel=0.01)
        assert cost.dropped_steps == DROPPED[fault]
    finally:
        store.close()
