"""Several runs: `[[runs]]` config tables, the old single-run file, errors naming the run, and
the registry finding a run whose config entry was removed (its store is not forgotten)."""

import textwrap

import pytest

from runhealth.collect.collector import run_meta
from runhealth.errors import ConfigError
from runhealth.settings import runs
from runhealth.settings.config import RunContext, parse_config
from runhealth.store import Store

TWO_RUNS = """
[[runs]]
name = "gen-4096"
finished = true
max_output_tokens = 4096
store_path = "{tmp}/a.sqlite3"

[[runs]]
name = "gen-8192"
max_output_tokens = 8192
target_completions = 902087
store_path = "{tmp}/b.sqlite3"

[[runs.nodes]]
name = "node-1"
host = "10.0.0.11"
shards = ["/data/out8k/*.jsonl"]

[[runs.nodes]]
name = "node-2"
host = "10.0.0.12"
shards = ["/data/out8k/*.jsonl"]
"""
SINGLE = """
[run]
name = "dflash-gen"
max_output_tokens = 4096

[[nodes]]
name = "node-1"
host = "10.0.0.11"
shards = ["/data/gen/out/*.jsonl"]
"""


def write(tmp_path, text: str):
    path = tmp_path / "runhealth.toml"
    path.write_text(textwrap.dedent(text).replace("{tmp}", str(tmp_path)), encoding="utf-8")
    return path


def test_two_runs_load_each_with_its_own_settings_and_store(tmp_path):
    a, b = runs.load_runs(write(tmp_path, TWO_RUNS), secrets_path=tmp_path / "none.toml")
    assert (a.config.name, a.finished, a.config.max_output_tokens, a.config.nodes) == ("gen-4096", True, 4096, [])
    assert (b.config.name, b.finished, b.config.max_output_tokens) == ("gen-8192", False, 8192)
    assert [n.name for n in b.config.nodes] == ["node-1", "node-2"] and b.config.target_completions == 902087
    assert a.config.resolved_store_path() != b.config.resolved_store_path()


def test_old_single_run_file_is_one_run(tmp_path):
    (entry,) = runs.load_runs(write(tmp_path, SINGLE), secrets_path=tmp_path / "none.toml")
    assert entry.config.name == "dflash-gen" and not entry.finished and len(entry.config.nodes) == 1


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('host = "10.0.0.12"', 'host = "-oProxyCommand=x"'), "run 'gen-8192': node 'node-2': field 'host'"),
        (("max_output_tokens = 8192", "max_output_tokens = -1"), "run 'gen-8192': [run] field 'max_output_tokens'"),
        (("finished = true", 'finished = "yes"'), "run 'gen-4096': field 'finished' must be true or false"),
        (('name = "gen-8192"', 'name = "gen-4096"'), "run 'gen-4096': field 'name' is used by another run"),
        (('store_path = "{tmp}/b.sqlite3"', 'store_path = "{tmp}/a.sqlite3"'), "field 'store_path' is run 'gen-4096'"),
        (("finished = true", "interval_s = 10"), "run 'gen-4096': no [[runs.nodes]] defined"),
        (('name = "node-2"', "nam = 1"), "run 'gen-8192': nodes[1]: unknown field 'nam'"),
    ],
)
def test_errors_name_the_file_the_run_and_the_field(tmp_path, change, expected):
    path = write(tmp_path, TWO_RUNS.replace(*change))
    with pytest.raises(ConfigError) as err:
        runs.load_runs(path, secrets_path=tmp_path / "none.toml")
    assert str(err.value).startswith(str(path)) and expected in str(err.value), str(err.value)


def test_runs_and_single_run_tables_do_not_mix(tmp_path):
    with pytest.raises(ConfigError, match="move 'run' into a run"):
        runs.load_runs(write(tmp_path, TWO_RUNS + SINGLE.split("[[nodes]]")[0]), secrets_path=tmp_path / "none.toml")


def test_secrets_still_refused_inside_a_run(tmp_path):
    text = TWO_RUNS.replace(
        'shards = ["/data/out8k/*.jsonl"]\n', 'shards = ["/data/out8k/*.jsonl"]\npassword = "x"\n', 1
    )
    with pytest.raises(ConfigError, match="run 'gen-8192': node 'node-1': field 'password' must not be in the config"):
        runs.load_runs(write(tmp_path, text), secrets_path=tmp_path / "none.toml")


def test_a_run_removed_from_the_config_is_found_as_finished(tmp_path):
    old = parse_config(
        {
            "run": {
                "name": "gen-old",
                "max_output_tokens": 2048,
                "target_completions": 10,
                "store_path": str(tmp_path / "old.sqlite3"),
            },
            "nodes": [{"name": "n", "host": "local", "shards": ["/x/*.jsonl"]}],
        }
    )
    store = Store(old.resolved_store_path())
    store.set_meta("run", run_meta(old, RunContext()))
    store.close()
    (tmp_path / "junk.sqlite3").write_bytes(b"not a database")  # ignored, not an error
    entries = runs.load_runs(write(tmp_path, TWO_RUNS), secrets_path=tmp_path / "none.toml")
    (found,) = runs.discover_finished(entries)
    assert found.finished and found.config.name == "gen-old" and found.config.max_output_tokens == 2048
    assert found.config.nodes == [] and found.config.store_path == str(tmp_path / "old.sqlite3")
    assert runs.discover_finished([*entries, found]) == []


def test_collect_fills_one_store_per_live_run(tmp_path):
    """`runhealth collect` over a [[runs]] file: a collector per live run, each into its own store."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from shardgen import truth_rows, write_shard

    root = Path(__file__).resolve().parent.parent
    text = ""
    for name, n in (("a", 60), ("b", 40)):
        (tmp_path / name).mkdir()
        write_shard(tmp_path / name / "s.jsonl", truth_rows(n, 3))
        text += (
            f'[[runs]]\nname = "run-{name}"\ninterval_s = 1\nstore_path = "{tmp_path / f"{name}.sqlite3"}"\n'
            f'[[runs.nodes]]\nname = "localhost"\nhost = "local"\nshards = ["{tmp_path / name}/*.jsonl"]\n'
            f'python = "{sys.executable}"\ngpu = "off"\n\n'
        )
    config = tmp_path / "runhealth.toml"
    config.write_text(text + '[[runs]]\nname = "done"\nfinished = true\n', encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "runhealth", "collect", "--config", str(config)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, counts = time.time() + 60, {}
        while time.time() < deadline and counts != {"a": 60, "b": 40}:
            time.sleep(0.5)
            for name in ("a", "b"):
                if (tmp_path / f"{name}.sqlite3").exists():
                    store = Store(tmp_path / f"{name}.sqlite3")
                    counts[name] = sum(r["count"] for r in store.length_counts(by="run"))
                    store.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=30)[1]
    assert counts == {"a": 60, "b": 40}, err
    assert proc.returncode == 0 and "of run-a every" in err and "of run-b every" in err and "done" not in err
