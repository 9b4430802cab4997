"""The dashboard process's one runtime: config, store, collector (and the demo simulator).

`get_runtime()` is cached with `st.cache_resource`, so however many browser tabs are open the
process holds one store and one collector, and pages never talk to nodes themselves. With no
config file it serves the built-in demo run through the same collector and agent a real run
uses. `RUNHEALTH_COLLECTOR=off` renders from the store alone (tests; a read-only viewer next
to another process that collects).
"""

from __future__ import annotations

import dataclasses
import os

import streamlit as st

from runhealth import demo
from runhealth.collector import Collector
from runhealth.config import RunConfig, find_config_path, load_config
from runhealth.errors import RunhealthError
from runhealth.outbound import Outbound, start_outbound
from runhealth.store import Store

COLLECTOR_ENV = "RUNHEALTH_COLLECTOR"


@dataclasses.dataclass
class Runtime:
    """What every page reads from. `config_error` is set (and the rest None) when the config is bad."""

    config: RunConfig | None
    store: Store | None
    collector: Collector | None = None
    demo: bool = False
    config_error: str | None = None
    simulator: demo.Simulator | None = None
    notice: str | None = None  # why this process is not collecting, when it is not
    outbound: Outbound | None = None  # /metrics and webhooks, served by the process that collects


def build_runtime() -> Runtime:
    """Load the config (or the demo), open the store and start collecting."""
    collect = os.environ.get(COLLECTOR_ENV, "on").lower() not in ("off", "0", "false", "no")
    simulator = None
    try:
        path = find_config_path()
        if path is not None:
            config = load_config(path)
        else:
            if collect:
                simulator = demo.Simulator()
                if not simulator.start():  # another dashboard process already simulates
                    simulator = None
            config = demo.demo_config(metrics_port=simulator.metrics_port if simulator else None)
        store = Store(config.resolved_store_path())
    except RunhealthError as exc:
        return Runtime(config=None, store=None, config_error=str(exc))
    runtime = Runtime(config=config, store=store, demo=config.demo, simulator=simulator)
    if collect:
        collector = Collector(config, store)
        try:
            collector.start()
            runtime.collector = collector
            runtime.outbound = start_outbound(config, store)
        except RunhealthError as exc:
            runtime.notice = str(exc)
    return runtime


@st.cache_resource(show_spinner=False, max_entries=1)
def get_runtime() -> Runtime:
    return build_runtime()
