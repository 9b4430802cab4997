"""runhealth.rules.health and runhealth.rules.activity on scripted poll rows whose true rates and stall times are known."""

import dataclasses
import time

from store_fixtures import write_reply

from runhealth.rules import activity, hardware, health
from runhealth.settings.config import RunConfig
from runhealth.settings.runsettings import RunSettings

NOW = 100_000.0


def node_rows(rate_tps, *, until=NOW, since=NOW - 1800, every=10.0, skew=0.0, tokens_per_completion=1000, stop_at=None):
    """Polls every `every` s producing `rate_tps`; from `stop_at` on the deltas are zero (stalled).
    The first poll is the backfill index of what was there before."""
    rows, t = [(since, since + skew, 5000, 5_000_000, 1)], since + every
    while t <= until:
        producing = stop_at is None or t <= stop_at
        tok = rate_tps * every if producing else 0
        rows.append((t, t + skew, tok / tokens_per_completion, tok, 0))
        t += every
    return rows


def test_last_minute_and_15_min_rates_are_exact_on_a_constant_node():
    r = activity.node_rate(node_rows(2000.0, skew=37.0), NOW)  # node clock 37 s ahead: cancels out
    assert abs(r.tokens_per_s_1m - 2000) < 1e-6
    assert abs(r.tokens_per_s_15m - 2000) < 1e-6
    assert abs(r.completions_per_s_15m - 2.0) < 1e-9


def test_the_last_minute_sees_a_stop_the_15_min_average_smooths():
    rows = node_rows(3000.0, stop_at=NOW - 120)
    r = activity.node_rate(rows, NOW)
    assert r.tokens_per_s_1m == 0.0  # stopped 2 min ago: the last minute says so
    assert abs(r.tokens_per_s_15m - 3000 * 13 / 15) < 1e-6
    assert r.last_growth_unix == NOW - 120


def test_run_rates_sum_nodes_and_leave_out_a_node_without_polls_in_the_window():
    rows = {"a": node_rows(1000.0), "b": node_rows(500.0), "gone": node_rows(9999.0, until=NOW - 1000)}
    out = activity.run_rates(rows, NOW)
    assert abs(out.tokens_per_s_1m - 1500) < 1e-6  # "gone" last polled 1000 s ago: no made-up rate
    assert out.per_node["gone"].tokens_per_s_1m is None


def test_a_stall_of_the_whole_run_names_since_when():
    per_node = activity.run_rates(
        {"a": node_rows(1000.0, stop_at=NOW - 400), "b": node_rows(1000.0, stop_at=NOW - 300)}, NOW
    ).per_node
    found = activity.stall_state(per_node, NOW, stall_after_s=120)
    assert found.run_since_unix == NOW - 300  # the run stalled when its last node stopped
    assert found.nodes == {"a": NOW - 400, "b": NOW - 300}
    assert found.lone() == {}  # no node writes: the run is stalled, no node is named on its own
    assert activity.stall_state(per_node, NOW, stall_after_s=600).run_since_unix is None


def test_one_node_stalled_while_others_write():
    per_node = activity.run_rates(
        {"node-3": node_rows(1000.0, stop_at=NOW - 360), "node-1": node_rows(1000.0)}, NOW
    ).per_node
    found = activity.stall_state(per_node, NOW, stall_after_s=120)
    assert found.run_since_unix is None and found.lone() == {"node-3": NOW - 360}
    assert found.writing == {"node-1"}
    # A node that is down is reported as down, not as stalled.
    assert activity.stall_state(per_node, NOW, 120, live={"node-1"}).nodes == {}


def test_shards_that_never_grew_count_from_when_we_first_saw_them():
    rows = {"a": node_rows(0.0, since=NOW - 200)}
    per_node = activity.run_rates(rows, NOW).per_node
    assert per_node["a"].last_growth_unix == NOW - 200  # the first index brought the backlog
    assert activity.stall_state(per_node, NOW, 120).run_since_unix == NOW - 200


def empty_node(first_seen):
    """A node added to the config whose shards hold nothing yet: polls with no completions."""
    return [(t, t, 0, 0, 1 if t == first_seen else 0) for t in range(int(first_seen), int(NOW) + 1, 10)]


def test_an_empty_node_added_to_a_stalled_run_keeps_the_run_stalled_since_its_last_completion():
    """Issue 24: adding an empty node to a stalled run gave "node-a: no new completions ... while
    other nodes write" (no node wrote), then "Run stalled since" the empty node's first poll."""
    stalled = {"a": node_rows(1000.0, stop_at=NOW - 400), "b": node_rows(1000.0, stop_at=NOW - 300)}
    just_added = activity.run_rates({**stalled, "new": empty_node(NOW - 60)}, NOW).per_node
    found = activity.stall_state(just_added, NOW, stall_after_s=120)
    assert found.run_since_unix == NOW - 300 and found.lone() == {}
    seen_for_a_while = activity.run_rates({**stalled, "new": empty_node(NOW - 200)}, NOW).per_node
    found = activity.stall_state(seen_for_a_while, NOW, stall_after_s=120)
    assert found.run_since_unix == NOW - 300  # the last completion, not when "new" was first seen
    assert found.waiting["new"] == NOW - 200 and "new" not in found.nodes and found.lone() == {}


def test_rate_drop_below_half_the_hours_median():
    minutes = [1000.0] * 50 + [100.0] * 5
    assert activity.rate_drop(400.0, minutes) == 1000.0
    assert activity.rate_drop(600.0, minutes) is None
    assert activity.rate_drop(10.0, minutes[:5]) is None  # five minutes are no baseline
    assert activity.rate_drop(None, minutes) is None


def test_minute_rates_drop_the_filling_bucket_and_backfill():
    buckets = [
        {"tokens": 600_000, "backfill": 1},
        {"tokens": 60_000, "backfill": 0},
        {"tokens": 120_000, "backfill": 0},
        {"tokens": 5, "backfill": 0},
    ]
    assert activity.minute_rates(buckets) == [1000.0, 2000.0]


def test_stall_after_default_and_override():
    cfg = RunConfig(name="r", nodes=[], interval_s=10)
    assert cfg.stall_after == 120.0
    assert RunConfig(name="r", nodes=[], interval_s=60).stall_after == 180.0
    assert RunConfig(name="r", nodes=[], stall_after_s=30).stall_after == 30.0


def test_one_stall_rule_for_config_exporter_and_alerts():
    """The Overview (RunConfig.stall_after) and the alerts/exporter (from the run's meta) agree,
    also for a store whose meta predates the saved stall_after_s; the README's default says the same."""
    for interval_s in (1.0, 10.0, 39.0, 40.0, 41.0, 60.0, 600.0):
        for configured in (None, 30.0, 900.0):
            cfg = RunConfig(name="r", nodes=[], interval_s=interval_s, stall_after_s=configured)
            assert cfg.stall_after == health.stall_after_s(interval_s, configured) > 0
            assert health.stall_after_s(interval_s, None) == max(3 * interval_s, 120.0)
    spec = next(f for f in dataclasses.fields(RunConfig) if f.name == "stall_after_s").metadata["spec"]
    assert spec.default_doc == "`max(3 × interval_s, 120)`"


def test_one_stale_rule_for_config_exporter_and_alerts():
    """Three poll intervals, at least 30 s, unless configured; RunConfig reads the same function."""
    assert health.stale_after_s(2) == 30.0
    assert health.stale_after_s(10) == 30.0
    assert health.stale_after_s(60) == 180.0
    assert health.stale_after_s(60, 45) == 45.0
    assert health.stale_after_s(60, None) == 180.0
    assert RunConfig(name="r", nodes=[], interval_s=60).stale_after == 180.0
    assert RunConfig(name="r", nodes=[], interval_s=60, stale_after_s=45).stale_after == 45.0


def gpu(label, util=95.0, temp=60.0, throttle=(), error=None):
    node, index = label.split("/")
    return {
        "node": node,
        "gpu": int(index),
        "label": label,
        "util_pct": util,
        "temp_c": temp,
        "throttle_reasons": list(throttle),
        "error": error,
    }


def test_gpu_health_in_words_most_serious_first_and_notes_apart():
    gpus = [gpu("n1/0"), gpu("n1/3", throttle=("sw_power_cap",))]
    found = {("n1", 0): {"ecc_uncorrected_volatile": 2, "pcie_replay": 12}, ("n1", 2): {"remapped_rows_pending": True}}
    found[("n1", 1)] = {"row_remap_failure": True}
    words = [(f.level, f.kind, f.text) for f in hardware.health_findings(found)]
    assert words == [
        ("error", "ecc_uncorrected", "n1/GPU 0: 2 uncorrected ECC errors since the driver loaded"),
        ("error", "row_remap_failed", "n1/GPU 1: row remapping failed (the GPU needs service)"),
        (
            "warning",
            "rows_pending",
            "n1/GPU 2: memory rows waiting to be remapped or retired (takes effect at the next GPU reset)",
        ),
    ]
    xids = [{"node": "n1", "gpu": 0, "xid": 79, "ts_unix": NOW}, {"node": "n1", "gpu": 0, "xid": 48, "ts_unix": NOW}]
    assert hardware.xid_findings(xids) == [
        ("n1", 0, 48, "n1/GPU 0: XID 79 (GPU has fallen off the bus), XID 48 (double-bit ECC error)")
    ]
    assert hardware.gpu_notes(gpus, found, run_writing=True) == [
        ("info", "At the power cap (sw_power_cap: normal under full load): n1/3"),
        ("info", "PCIe replays since the driver loaded: n1/0 (12)"),
    ]


def test_healthy_counters_are_silent():
    assert hardware.health_findings({("n1", 0): {"ecc_uncorrected_volatile": 0}}) == []
    assert hardware.gpu_notes([gpu("n1/0", util=0)], {}, run_writing=False) == []


def test_host_problems_ram_swap_and_load():
    gib = 2**30
    hosts = {
        "n1": {
            "cpus": 8,
            "mem_total_bytes": 100 * gib,
            "mem_available_bytes": 5 * gib,
            "swap_total_bytes": 8 * gib,
            "swap_free_bytes": 4 * gib,
        },
        "n2": {"cpus": 64, "mem_total_bytes": 100 * gib, "mem_available_bytes": 60 * gib, "swap_total_bytes": 0},
    }
    out = health.host_problems(hosts, {"n1": [16.0, 10.0, 9.0], "n2": [3.0, 3.0, 3.0]})
    assert out == [
        ("warning", "n1: RAM 95% used (5.0 GiB available)"),
        ("warning", "n1: swap 50% used (the host is short of memory)"),
        ("warning", "n1: CPU load 16.0 on 8 CPUs"),
    ]


def test_a_gpu_that_stopped_reporting_is_named_missing():
    seen = {"n1": {0, 1, 2, 3}, "n2": {0, 1}}
    now = {"n1": {0, 1, 3}, "n2": {0, 1}}
    assert health.missing_gpus(seen, now, live={"n1", "n2"}) == [
        ("error", "n1: GPU 2 missing from the latest poll (3 of 4 reporting)")
    ]
    assert health.missing_gpus(seen, now, live={"n2"}) == []  # a down node is reported as down


def test_a_lone_stall_names_the_nodes_that_do_write(tmp_path):
    """The per-node sentence says who writes: never "while other nodes write" when none does."""
    from runhealth.store import Store

    store = Store(tmp_path / "s.sqlite3")
    now = time.time()
    for node, stop in (("node-1", now - 600), ("node-2", None)):
        for k in range(70):
            ts = now - 690 + 10 * k
            grew = stop is None or ts <= stop
            files = (
                {"/o.jsonl": {"lines": 2, "tokens": 200, "counts": [[100, "stop", 0, 2]], "offset": k}} if grew else {}
            )
            write_reply(store, node, {"time_unix": ts, "shards": {"files": files}, "gpus": {}}, ts, 5.0)
    found = {a.name: a for a in health.evaluate(store, now, RunSettings(interval_s=10.0))}
    assert "run_stalled" not in found
    assert found["node_stalled"].node == "node-1"
    assert found["node_stalled"].summary.endswith("while node-2 writes."), found["node_stalled"].summary
    store.close()
