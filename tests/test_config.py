"""Config loading: the example from the README loads; every wrong value names file, node and field."""

import textwrap

import pytest

from runhealth.config import find_config_path, load_config, parse_config
from runhealth.errors import ConfigError

EXAMPLE = """
[run]
name = "dflash-gen"
target_completions = 902087
max_output_tokens = 4096
interval_s = 10

[[nodes]]
name = "node-1"
host = "10.0.0.11"
port = 22
user = "ubuntu"
identity_file = "~/.ssh/id_ed25519"
known_hosts = "~/.ssh/known_hosts"
shards = ["/data/gen/out/*.jsonl"]
metrics_urls = ["http://127.0.0.1:30000/metrics"]
python = "python3"
"""


def write(tmp_path, text, name="runhealth.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_example_config_loads(tmp_path):
    config = load_config(write(tmp_path, EXAMPLE), secrets_path=tmp_path / "none.toml")
    assert config.name == "dflash-gen"
    assert config.target_completions == 902087
    node = config.nodes[0]
    assert (node.host, node.port, node.user, node.python) == ("10.0.0.11", 22, "ubuntu", "python3")
    assert node.shards == ["/data/gen/out/*.jsonl"]
    assert not node.is_local and not node.accept_new_host_key


def bad(tmp_path, text):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), secrets_path=tmp_path / "none.toml")
    return str(info.value)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (('port = 22', 'port = "22"'), "node 'node-1': field 'port' must be int, got str"),
        (('port = 22', 'port = true'), "field 'port' must be int, got bool"),
        (('python = "python3"', 'python = "python3; rm -rf /"'), "field 'python'"),
        (('python = "python3"', 'python = "$(id)"'), "field 'python'"),
        (('user = "ubuntu"', 'usr = "ubuntu"'), "node 'node-1': unknown field 'usr'"),
        (('shards = ["/data/gen/out/*.jsonl"]', 'shards = []'), "field 'shards'"),
        (('shards = ["/data/gen/out/*.jsonl"]', 'shards = ["out/*.jsonl"]'), "absolute paths"),
        (('host = "10.0.0.11"', 'host = "-oProxyCommand=x"'), "field 'host'"),
        (('interval_s = 10', 'interval_s = 0'), "[run] field 'interval_s'"),
        (('metrics_urls = ["http://127.0.0.1:30000/metrics"]', 'metrics_urls = ["file:///etc/passwd"]'),
         "field 'metrics_urls'"),
        (('name = "node-1"', 'name = "node 1"'), "field 'name'"),
        (('python = "python3"', 'python = "python3"\nscan_workers = 0'), "field 'scan_workers' must be between 1 and 8"),
        (('python = "python3"', 'python = "python3"\nscan_workers = 9'), "field 'scan_workers' must be between 1 and 8"),
        (('python = "python3"', 'python = "python3"\nscan_workers = 2.5'), "field 'scan_workers' must be int"),
    ],
)
def test_wrong_value_names_file_node_and_field(tmp_path, change, expected):
    message = bad(tmp_path, EXAMPLE.replace(*change))
    assert str(tmp_path / "runhealth.toml") in message
    assert expected in message


def test_missing_required_field(tmp_path):
    assert "missing required field 'host'" in bad(tmp_path, EXAMPLE.replace('host = "10.0.0.11"', ""))
    assert "unknown field 'runn'" in bad(tmp_path, EXAMPLE.replace("[run]", "[runn]"))
    assert "missing [run] table" in bad(tmp_path, EXAMPLE[EXAMPLE.index("[[nodes]]"):])


def test_secrets_are_refused_in_the_config_file(tmp_path):
    message = bad(tmp_path, EXAMPLE + 'passphrase = "hunter2"\n')
    assert "'passphrase' must not be in the config file" in message
    assert "hunter2" not in message


def test_invalid_toml_and_missing_file(tmp_path):
    assert "not valid TOML" in bad(tmp_path, "[run\nname=")
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")


def test_duplicate_node_names(tmp_path):
    node = EXAMPLE[EXAMPLE.index("[[nodes]]"):]
    assert "node name 'node-1' is used twice" in bad(tmp_path, EXAMPLE + node)


def test_paths_with_shell_characters_are_kept_literally(tmp_path):
    weird = "/data/my out/$(touch pwned)/`id`;x/'q\"*.jsonl"
    raw = {"run": {"name": "r"}, "nodes": [{"name": "n", "host": "local", "shards": [weird]}]}
    assert parse_config(raw).nodes[0].shards == [weird]


def test_secrets_come_from_secrets_file_and_never_show(tmp_path):
    secrets = write(tmp_path, '[nodes.node-1]\npassphrase = "hunter2-planted"\n', "secrets.toml")
    config = load_config(write(tmp_path, EXAMPLE), secrets_path=secrets)
    node = config.nodes[0]
    assert node.passphrase == "hunter2-planted"
    shown = node.public_dict()
    assert shown["passphrase_set"] is True
    assert "hunter2-planted" not in repr(shown) + repr(node) + repr(config)


def test_config_path_resolution(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RUNHEALTH_CONFIG", raising=False)
    assert find_config_path() is None  # -> the demo
    write(tmp_path, EXAMPLE)
    assert find_config_path().name == "runhealth.toml"
    monkeypatch.setenv("RUNHEALTH_CONFIG", "/elsewhere.toml")
    assert str(find_config_path()) == "/elsewhere.toml"
    assert str(find_config_path("explicit.toml")) == "explicit.toml"


def test_scan_workers_reach_the_poll_request(tmp_path):
    from runhealth.collector import poll_request

    plain = load_config(write(tmp_path, EXAMPLE), secrets_path=tmp_path / "none.toml").nodes[0]
    assert plain.scan_workers is None and poll_request(plain, {})["shards"]["scan_workers"] is None
    two = load_config(write(tmp_path, EXAMPLE.replace('python = "python3"', 'python = "python3"\nscan_workers = 2')),
                      secrets_path=tmp_path / "none.toml").nodes[0]
    assert poll_request(two, {})["shards"]["scan_workers"] == 2
