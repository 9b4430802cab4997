"""`runhealth compare`: the real CLI on generated shards with known distributions, and its core.

Run A is a log-normal cut at 4096; run B the same distribution cut at 8192 (other seed), so A's
what-if for 8192 must hold; run C is a clearly longer log-normal cut at 8192, so it must miss.
"""

import json
import math
import random
import re
import subprocess
import sys

import pytest
from shardgen import chat_line, write_shard

from runhealth.analysis.runcompare import newcombe_diff, quantile_interval
from runhealth.cli import split_compare

MU, SIGMA, N = math.log(1500), 0.9, 20000
FORECAST_KEYS = {"limit": int, "predicted_fraction": float, "measured_fraction": float, "inside": bool}


def lognormal_rows(seed: int, cap: int, mu: float = MU, n: int = N) -> list[tuple[int, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        t = max(1, int(rng.lognormvariate(mu, SIGMA)))
        rows.append((cap, "length") if t >= cap else (t, "stop"))
    return rows


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runhealth", *args], capture_output=True, text=True, timeout=120)


def compare_json(a, b, *options: str) -> dict:
    proc = run_cli("compare", "--json", *options, *map(str, a), "--", *map(str, b))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    rows = {
        "a": lognormal_rows(1, 4096),
        "b": lognormal_rows(2, 8192),
        "c": lognormal_rows(3, 8192, mu=math.log(3000)),
        "a2": lognormal_rows(4, 4096),
    }
    # A in two shards, named by a glob, as a run writes them.
    write_shard(d / "a-0.jsonl", rows["a"][: N // 2])
    write_shard(d / "a-1.jsonl", rows["a"][N // 2 :])
    for name in ("b", "c", "a2"):
        write_shard(d / f"{name}.jsonl", rows[name])
    return d, rows


def cut_count(rows, cap):
    return sum(1 for t, r in rows if r == "length" and t >= cap)


def test_matched_relaunch_counts_contract_and_forecast_inside(shards):
    d, rows = shards
    out = compare_json([d / "a-*.jsonl"], [d / "b.jsonl"])
    # "a" and "b" are exactly what `scan --json` prints for the same paths.
    for key, paths in (("a", [str(d / "a-*.jsonl")]), ("b", [str(d / "b.jsonl")])):
        scan = run_cli("scan", "--json", *paths)
        assert out[key] == json.loads(scan.stdout)
    a, b = out["a"], out["b"]
    assert (a["completions"], b["completions"]) == (N, N)
    assert (a["ceiling"], b["ceiling"]) == (4096, 8192)
    assert a["at_ceiling"] == cut_count(rows["a"], 4096) and b["at_ceiling"] == cut_count(rows["b"], 8192)
    assert a["tokens"]["mean"] == pytest.approx(sum(t for t, _ in rows["a"]) / N)
    f = out["forecast"]
    assert set(FORECAST_KEYS) | {"interval"} <= set(f)
    for key, kind in FORECAST_KEYS.items():
        assert type(f[key]) is kind, key
    lo, hi = f["interval"]
    assert isinstance(lo, float) and isinstance(hi, float) and lo <= f["predicted_fraction"] <= hi
    assert f["limit"] == 8192
    assert f["measured_fraction"] == cut_count(rows["b"], 8192) / N
    assert f["inside"] is True and lo <= f["measured_fraction"] <= hi
    assert f["measured_extra_tokens"] == pytest.approx(b["tokens"]["mean"] - a["tokens"]["mean"])
    assert (
        f["predicted_extra_tokens_interval"][0] <= f["measured_extra_tokens"] <= f["predicted_extra_tokens_interval"][1]
    )
    # The truth of the generating distribution lies inside too (P(T >= 8192) of the log-normal).
    truth = 0.5 * math.erfc((math.log(8192) - MU) / (SIGMA * math.sqrt(2)))
    assert lo <= truth <= hi
    share = out["differences"]["truncated_fraction"]
    assert share["difference"] == pytest.approx(b["at_ceiling_fraction"] - a["at_ceiling_fraction"])
    assert share["interval"][0] < share["difference"] < share["interval"][1] < 0
    mean = out["differences"]["mean_tokens"]
    assert mean["difference"] == pytest.approx(b["tokens"]["mean"] - a["tokens"]["mean"])
    assert 0 < mean["interval"][0] < mean["difference"] < mean["interval"][1]
    assert out["summary"].startswith(
        f"At 8,192: {100 * b['at_ceiling_fraction']:.1f}% still cut"
        f" (was {100 * a['at_ceiling_fraction']:.1f}% at 4,096); completions "
    )
    assert f"completions {100 * mean['relative']:.0f}% longer, all of it in the ones no longer cut" in out["summary"]


def test_a_censored_percentile_is_a_one_sided_bound(shards):
    """A and B draw from one log-normal: every true percentile difference is 0. A's P90 sits at
    its ceiling (13% cut at 4,096), so B - A is at most a bound with no lower end: on main it was
    a two-sided "+6xx to +7xx" that left out the truth, and the CLI printed no "≤" at all."""
    d, _rows = shards
    out = compare_json([d / "a-*.jsonl"], [d / "b.jsonl"])
    p90, p99 = out["differences"]["p90"], out["differences"]["p99"]
    assert p90["at_ceiling"] == ["a"] and p90["bound"] == "at most"
    lo, hi = p90["interval"]
    assert lo is None and hi >= 0 >= p90["a"] - 4096  # the bound holds the true difference, 0
    assert hi > p90["difference"]  # a 95% bound on a bound: above the point, never a band around it
    assert p99["bound"] == "not measurable" and p99["interval"] == [None, None]  # both runs cut there
    human = run_cli("compare", str(d / "a-*.jsonl"), "--", str(d / "b.jsonl")).stdout
    line = next(x for x in human.splitlines() if x.startswith("p90:"))
    assert f"(≤ {p90['difference']:+,}; ≤ {hi:+,.0f} (one-sided" in line and " to " not in line
    assert "both at ceiling; not measurable" in next(x for x in human.splitlines() if x.startswith("p99:"))


def test_uncut_lengths_say_whether_the_change_is_all_at_the_ceiling(shards):
    """Same distribution (A vs B): the longer mean is all in the completions no longer cut. A
    longer distribution (A vs C): the uncut lengths moved too, and the headline says so."""
    d, _rows = shards
    same = compare_json([d / "a-*.jsonl"], [d / "b.jsonl"])
    uncut = same["differences"]["uncut"]
    assert uncut["below"] == 4096 and uncut["unchanged"] is True
    assert uncut["mean"]["interval"][0] <= 0 <= uncut["mean"]["interval"][1]
    assert "the uncut lengths (below 4,096) are unchanged" in same["summary"]
    longer = compare_json([d / "a-*.jsonl"], [d / "c.jsonl"])
    assert longer["differences"]["uncut"]["unchanged"] is False
    assert "unchanged" not in longer["summary"]
    assert re.search(r"completions \d+% longer \(the uncut ones, below 4,096: \+\d+% in mean\)", longer["summary"])


def test_different_distribution_forecast_outside(shards):
    d, rows = shards
    out = compare_json([d / "a-*.jsonl"], [d / "c.jsonl"])
    f = out["forecast"]
    assert f["measured_fraction"] == cut_count(rows["c"], 8192) / N
    assert f["measured_fraction"] > f["interval"][1]
    assert f["inside"] is False


@pytest.mark.parametrize("a_name,b_name", [("b.jsonl", "a-*.jsonl"), ("a-*.jsonl", "a2.jsonl")])
def test_forecast_null_when_b_ceiling_not_higher(shards, a_name, b_name):
    d, _rows = shards
    out = compare_json([d / a_name], [d / b_name])
    assert out["forecast"] is None
    assert "not above" in out["forecast_note"]
    human = run_cli("compare", str(d / a_name), "--", str(d / b_name))
    assert human.returncode == 0 and "not above" in human.stdout and "forecast check at" not in human.stdout


def test_ceiling_options_override_detection(shards):
    d, _rows = shards
    out = compare_json([d / "a-*.jsonl"], [d / "b.jsonl"], "--ceiling-a", "4096", "--ceiling-b", "4096")
    assert out["b"]["ceiling"] == 4096 and out["b"]["ceiling_source"] != "detected"
    assert out["forecast"] is None


def test_human_output_is_escaped_and_states_the_assumption(shards, tmp_path):
    d, _rows = shards
    hostile = tmp_path / "b.jsonl"
    write_shard(hostile, lognormal_rows(2, 8192, n=2000))
    with open(hostile, "a", encoding="utf-8") as f:
        f.write(chat_line(10, "stop\x1b]0;pwned\x07"))
    proc = run_cli("compare", str(d / "a-*.jsonl"), "--", str(hostile))
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "stop\\x1b]0;pwned\\x07" in proc.stdout
    assert "same distribution as A's" in proc.stdout
    assert proc.stdout.startswith("B vs A: At 8,192: ")
    assert "forecast check at 8,192" in proc.stdout


def test_bad_usage_and_empty_run(shards, tmp_path):
    d, _rows = shards
    proc = run_cli("compare", str(d / "b.jsonl"))
    assert proc.returncode == 2 and "A_GLOBS... -- B_GLOBS..." in proc.stderr
    proc = run_cli("compare", "--json", str(d / "b.jsonl"), "--", str(tmp_path / "nothing-*.jsonl"))
    assert proc.returncode == 1 and "nothing matched" in proc.stderr
    out = json.loads(proc.stdout)
    assert out["b"]["completions"] == 0 and out["forecast"] is None


def test_newcombe_matches_the_published_example():
    # Newcombe (1998), Stat Med 17:873, Table II example (a), 56/70 - 48/80, method 10: 0.0524 to 0.3339.
    d = newcombe_diff(48, 80, 56, 70)
    assert d["difference"] == pytest.approx(0.2)
    assert d["interval"] == pytest.approx([0.0524, 0.3339], abs=5e-5)


def test_quantile_interval_brackets_the_point():
    pairs = [(t, 1) for t in range(1, 1001)]
    point, lo, hi = quantile_interval(pairs, 0.5)
    assert point == 500 and lo < 500 < hi and hi - lo < 80
    assert quantile_interval([], 0.5) is None


def test_only_the_compare_subcommand_is_split_at_its_double_dash():
    assert split_compare(["compare", "--json", "a", "--", "b", "c"]) == (["compare", "--json", "a"], ["b", "c"])
    assert split_compare(["scan", "compare", "--", "x"]) == (["scan", "compare", "--", "x"], None)
    assert split_compare(["compare", "a"]) == (["compare", "a"], None)


def test_a_forecast_check_fits_as_once_per_histogram(monkeypatch):
    """Compare redraws after each round of B's polls; A (finished, usually) is fitted once for
    them all, and again only when A's histogram or another input changes. The result is the
    uncached one's."""
    from runhealth.analysis import runcompare, stats, whatif

    rng = random.Random(3)

    def run(ceiling: int, n: int) -> tuple[stats.LengthHist, stats.Summary]:
        lengths = [min(int(rng.lognormvariate(6.5, 0.9)), ceiling) for _ in range(n)]
        hist = stats.LengthHist.from_rows([(t, "length" if t == ceiling else "stop", False, 1) for t in lengths])
        return hist, stats.summarize(hist, ceiling)

    a, b = run(1024, 4000), run(2048, 3000)
    fits: list[int] = []
    real = whatif.for_run
    monkeypatch.setattr(whatif, "for_run", lambda *args: fits.append(1) or real(*args))
    runcompare._WHATIFS.clear()
    first = runcompare.forecast_check(*a, *b, bootstrap=20)
    again = runcompare.forecast_check(*a, *b, bootstrap=20)
    assert first[0] is not None, first[1]  # a forecast, not a note why none
    assert len(fits) == 1 and first == again
    grown = stats.LengthHist.from_rows([*a[0].rows(), (700, "stop", False, 1)])
    runcompare.forecast_check(grown, a[1], *b, bootstrap=20)
    assert len(fits) == 2  # A's histogram changed: fitted again
    runcompare._WHATIFS.clear()
    monkeypatch.setattr(whatif, "for_run", real)
    assert runcompare.forecast_check(*a, *b, bootstrap=20) == first
