"""`python -m runhealth scan|poll`: the JSON contracts, checked against ground truth."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from shardgen import truth_rows, write_shard

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, cwd=None):
    """`python -m runhealth ...` from the session's scratch folder (not the checkout)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # importable even where the checkout is not installed
    proc = subprocess.run(
        [sys.executable, "-m", "runhealth", *args], capture_output=True, text=True, cwd=cwd, timeout=120, env=env
    )
    return proc.returncode, proc.stdout, proc.stderr


def nearest_rank(sorted_values, q):
    return sorted_values[max(1, math.ceil(q / 100 * len(sorted_values))) - 1]


def test_scan_json_matches_ground_truth(tmp_path):
    rows_a, rows_b = truth_rows(700, 11), truth_rows(300, 12)
    write_shard(tmp_path / "a.jsonl", rows_a)
    write_shard(tmp_path / "b.jsonl", rows_b)
    with open(tmp_path / "b.jsonl", "a") as f:
        f.write("{not json}\n" + '{"choices": [{"finish_reason": "st')  # malformed + half-written
    rc, out, err = cli("scan", "--json", str(tmp_path / "*.jsonl"))
    assert rc == 0, err
    got = json.loads(out)
    rows = rows_a + rows_b
    tokens = sorted(t for t, _ in rows)
    at_ceiling = sum(1 for t, f in rows if f == "length" and t >= 4096)
    assert got["completions"] == 1000 and got["unparseable"] == 1
    assert got["finish_reasons"] == {"stop": 1000 - at_ceiling, "length": at_ceiling}
    assert got["ceiling"] == 4096 and got["at_ceiling"] == at_ceiling
    assert math.isclose(got["at_ceiling_fraction"], at_ceiling / 1000)
    assert got["tokens"]["max"] == 4096
    assert math.isclose(got["tokens"]["mean"], sum(tokens) / 1000)
    for q in (50, 90, 99):
        assert got["tokens"][f"p{q}"] == nearest_rank(tokens, q)


def test_scan_workers_flag(tmp_path):
    write_shard(tmp_path / "a.jsonl", truth_rows(300, 5))
    results = [cli("scan", "--json", "--workers", n, str(tmp_path / "*.jsonl")) for n in ("1", "2")]
    assert [r[0] for r in results] == [0, 0] and results[0][1] == results[1][1]
    rc, _, err = cli("scan", "--workers", "9", str(tmp_path / "*.jsonl"))
    assert rc == 2 and "--workers" in err


def test_scan_ceiling_flag_and_whatif(tmp_path):
    write_shard(tmp_path / "a.jsonl", truth_rows(2000, 5))
    rc, out, err = cli("scan", "--json", "--ceiling", "4096", "--whatif", "8192", str(tmp_path / "a.jsonl"))
    assert rc == 0, err
    got = json.loads(out)
    assert got["ceiling"] == 4096
    w = got["whatif"]
    assert w["limit"] == 8192 and isinstance(w["model"], str)
    lo, hi = w["interval"]
    assert 0 <= lo <= w["truncated_fraction"] <= hi <= got["at_ceiling_fraction"] + 1e-9
    assert w["extra_tokens_per_completion"] > 0
    # Added by #19: the back-test and why the headline model was chosen.
    assert w["model"] in w["band"] and len(w["band"]) >= 3 and w["model_reason"]
    check = w["backtest"]["checks"][0]
    assert check["cut"] == 2048 and check["limit"] == 4096
    assert math.isclose(check["truth"], got["at_ceiling_fraction"])
    rc, out, err = cli("scan", "--ceiling", "4096", "--whatif", "8192", str(tmp_path / "a.jsonl"))
    assert rc == 0 and "checked on this run: cut at 2,048" in out and "the truth is 16.7%" in out, out + err
    assert "what-if limit 8,192: " in out and "above 4,096;" in out, out  # #32: counts with separators


@pytest.mark.parametrize(
    "args",
    [
        ("scan", "--ceiling", "0"),
        ("scan", "--ceiling", "-5"),
        ("scan", "--whatif", "-1"),
        ("scan", "--whatif", "0"),
        ("compare", "--ceiling-a", "0"),
        ("compare", "--ceiling-b", "-5"),
    ],
)
def test_a_ceiling_or_whatif_limit_below_one_token_is_refused(tmp_path, args):
    write_shard(tmp_path / "a.jsonl", truth_rows(50, 5))
    command, flag, value = args
    rest = [str(tmp_path / "a.jsonl")] + (["--", str(tmp_path / "a.jsonl")] if command == "compare" else [])
    rc, out, err = cli(command, flag, value, *rest)
    assert rc == 2 and out == "", out
    assert f"argument {flag}: must be a whole number of tokens, at least 1 (got {value})" in err, err


def test_scan_human_output_and_nothing_matched(tmp_path):
    write_shard(tmp_path / "a.jsonl", truth_rows(100, 6))
    rc, out, _ = cli("scan", str(tmp_path / "a.jsonl"))
    assert rc == 0 and "completions: 100" in out and "ceiling: 4,096" in out
    rc, _, err = cli("scan", str(tmp_path / "none-*.jsonl"))
    assert rc == 1 and "nothing matched" in err


def test_poll_reports_every_node_and_fails_when_one_is_down(tmp_path):
    write_shard(tmp_path / "a.jsonl", truth_rows(250, 7))
    config = tmp_path / "runhealth.toml"
    config.write_text(f"""
[run]
name = "cli-test"
store_path = "{tmp_path / "ignored.sqlite3"}"

[[nodes]]
name = "localhost"
host = "local"
shards = ["{tmp_path / "*.jsonl"}"]
python = "{sys.executable}"
gpu = "off"

[[nodes]]
name = "down"
host = "127.0.0.1"
port = 1
shards = ["/x/*.jsonl"]
connect_timeout_s = 2
""")
    rc, out, err = cli("poll", "--json", "--config", str(config))
    assert rc == 1, err
    got = json.loads(out)
    nodes = {n["name"]: n for n in got["nodes"]}
    assert nodes["localhost"]["ok"] and nodes["localhost"]["lengths"]["completions"] == 250
    assert not nodes["down"]["ok"] and "refused" in nodes["down"]["error"]
    assert got["lengths"]["completions"] == 250


def test_poll_with_bad_config_names_the_field(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[run]\nname = "x"\n[[nodes]]\nname = "n"\nhost = "local"\nshards = ["/a"]\nport = "22"\n')
    rc, _, err = cli("poll", "--config", str(config))
    assert rc == 2 and "field 'port' must be int" in err and str(config) in err


def test_poll_reports_per_run_when_there_are_several(tmp_path):
    for name, n, seed in (("a", 120, 8), ("b", 80, 9)):
        (tmp_path / name).mkdir()
        write_shard(tmp_path / name / "s.jsonl", truth_rows(n, seed))
    runs = "".join(
        f"""
[[runs]]
name = "run-{name}"
store_path = "{tmp_path / f"{name}.sqlite3"}"
[[runs.nodes]]
name = "localhost"
host = "local"
shards = ["{tmp_path / name / "*.jsonl"}"]
python = "{sys.executable}"
gpu = "off"
"""
        for name in ("a", "b")
    )
    config = tmp_path / "runhealth.toml"
    config.write_text(runs + '\n[[runs]]\nname = "old"\nfinished = true\n')
    rc, out, err = cli("poll", "--json", "--config", str(config))
    assert rc == 0, err
    got = json.loads(out)
    assert [r["name"] for r in got["runs"]] == ["run-a", "run-b"]  # the finished run is not polled
    assert [r["lengths"]["completions"] for r in got["runs"]] == [120, 80]
    rc, out, _ = cli("poll", "--config", str(config))
    assert rc == 0 and "#### run run-a" in out and "#### run run-b" in out


def test_scan_text_words_numbers_as_the_pages_do(tmp_path):
    # Issue 32: the text said `p90 4096` and "malformed" where the pages say "≥ 4,096" and the JSON
    # "unparseable"; counts lacked separators.
    rows = [(4096, "length")] * 300 + [(1200, "stop")] * 1700
    write_shard(tmp_path / "a.jsonl", rows)
    with open(tmp_path / "a.jsonl", "a") as f:
        f.write("{not json}\n")
    rc, out, err = cli("scan", str(tmp_path / "*.jsonl"))
    assert rc == 0, err
    assert "completions: 2,000  (unparseable lines: 1)" in out and "malformed" not in out
    assert "p50 1,200  p90 ≥ 4,096  p99 ≥ 4,096  max ≥ 4,096" in out
    assert "ceiling: 4,096" in out and "at the ceiling: 300 (15.0%)" in out and "stop 1,700" in out
