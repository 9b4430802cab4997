"""Every red mark is an alert (#30, item 4): each GPU fault, driven through the NVML stand-in and
the real agent's poll, is one alert of `health.evaluate` and shows on every consumer of that set —
the Overview and the GPUs page (AppTest), a real HTTP webhook receiver, and `/metrics`
(`runhealth_alert`). Before, XIDs, uncorrected ECC, failed row remaps and a GPU missing from its
node's poll were drawn red from a second list, and neither webhooks nor /metrics said a word.
"""

from __future__ import annotations

import sys
import time

import fake_pynvml
import pytest
import store_fixtures
import streamlit as st
import test_pages
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from store_fixtures import write_reply
from test_webhooks import Receiver

from runhealth.alerting import exporter, notify
from runhealth.node import agent
from runhealth.node import gpu as agent_gpu
from runhealth.rules import health
from runhealth.store import Store

GPU = dict(fake_pynvml.H200)
NODE = "node-1"


@pytest.fixture
def nvml(monkeypatch):
    monkeypatch.setattr(agent_gpu, "NVML", agent_gpu._Nvml())
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    fake_pynvml.configure([dict(GPU, uuid="GPU-0"), dict(GPU, uuid="GPU-1")])
    st.cache_data.clear()
    yield fake_pynvml
    st.cache_data.clear()


def poll(store: Store, tmp_path) -> None:
    """One poll of the real agent (in this process, NVML = the stand-in), stored as the collector does."""
    shards = {"globs": [str(tmp_path / "none" / "*.jsonl")], "state": {}}
    reply = agent.handle({"op": "poll", "shards": shards, "gpu": "auto"})
    assert reply["ok"], reply
    write_reply(store, NODE, reply, time.time(), 5.0)


def break_it(nvml, fault: str) -> None:
    if fault == "xid":
        nvml.raise_xid(1, 79)  # GPU has fallen off the bus
    elif fault == "ecc":
        nvml.configure([dict(GPU, uuid="GPU-0"), dict(GPU, uuid="GPU-1", ecc_volatile=3)])
    elif fault == "row_remap":
        nvml.configure([dict(GPU, uuid="GPU-0"), dict(GPU, uuid="GPU-1", remapped=(0, 0, 0, 1))])
    elif fault == "missing":
        nvml.configure([dict(GPU, uuid="GPU-0")])  # GPU 1 no longer enumerated
    elif fault == "lost":
        nvml.configure([dict(GPU, uuid="GPU-0"), dict(GPU, uuid="GPU-1", lost=True)])


FAULTS = {  # fault -> (alert name, words the page and the webhook carry)
    "xid": ("gpu_xid", "XID 79 (GPU has fallen off the bus)"),
    "ecc": ("gpu_ecc_uncorrected", "3 uncorrected ECC errors"),
    "row_remap": ("gpu_row_remap_failed", "row remapping failed"),
    "missing": ("gpu_missing", "GPU 1 missing from the latest poll"),
    "lost": ("gpu_error", "GPU 1"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_gpu_fault_is_an_alert_on_the_page_in_a_webhook_and_in_metrics(fault, nvml, tmp_path, monkeypatch):
    store_path = tmp_path / "s.sqlite3"
    config = store_fixtures.write_config(tmp_path, store_path, nodes=1)
    store = Store(store_path)
    store.set_meta("run", {"name": store_fixtures.RUN_NAME, "interval_s": 10, "nodes": [NODE]})
    poll(store, tmp_path)  # healthy: both GPUs report
    assert not [a for a in health.evaluate(store) if a.name.startswith("gpu_")]
    break_it(nvml, fault)
    poll(store, tmp_path)
    name, words = FAULTS[fault]

    found = [a for a in health.evaluate(store) if a.name == name]
    assert len(found) == 1 and found[0].severity == "critical" and words in found[0].summary, found

    receiver = Receiver(200)  # a real HTTP receiver gets it as a "start"
    try:
        n = notify.Notifier(store, [receiver.url()], tracker=notify.AlertTracker(clear_s=0), retries=1, deadline_s=2)
        n.check()
        for url, q in n.queues.items():
            while not q.empty():
                n.deliver(url, q.get_nowait())
        posts = [p for p in receiver.posts if p["alert"] == name]
        assert len(posts) == 1 and words in posts[0]["summary"] and posts[0]["severity"] == "critical"
    finally:
        receiver.close()

    registry = CollectorRegistry()
    registry.register(exporter.StoreMetrics(store))
    exported = {
        (s.labels["alert"], s.labels["severity"], s.labels["node"])
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name == "runhealth_alert" and s.value == 1
    }
    assert (name, "critical", NODE) in exported
    store.close()

    for page in ("overview", "gpus"):  # red on the page, with the alert's own words, once
        at = test_pages.run_page(page, config, monkeypatch)
        assert not at.exception
        red = [e.value for e in at.error if words in e.value]
        assert len(red) == 1, (page, [e.value for e in at.error])
