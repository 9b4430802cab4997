"""Config loading: the example from the README loads; every wrong value names file, node and field."""

import dataclasses
import json
import logging
import pickle
import re
import textwrap
from pathlib import Path

import pytest

from runhealth.errors import ConfigError
from runhealth.settings import config as config_module
from runhealth.settings.config import NodeConfig, RunConfig, RunContext, find_config_path, load_config, parse_config
from runhealth.settings.configspec import Secret, spec_of

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
        (("port = 22", 'port = "22"'), "node 'node-1': field 'port' must be int, got str"),
        (("port = 22", "port = true"), "field 'port' must be int, got bool"),
        (('python = "python3"', 'python = "python3; rm -rf /"'), "field 'python'"),
        (('python = "python3"', 'python = "$(id)"'), "field 'python'"),
        (('user = "ubuntu"', 'usr = "ubuntu"'), "node 'node-1': unknown field 'usr'"),
        (('shards = ["/data/gen/out/*.jsonl"]', "shards = []"), "field 'shards'"),
        (('shards = ["/data/gen/out/*.jsonl"]', 'shards = ["out/*.jsonl"]'), "absolute paths"),
        (('host = "10.0.0.11"', 'host = "-oProxyCommand=x"'), "field 'host'"),
        (("interval_s = 10", "interval_s = 0"), "[run] field 'interval_s'"),
        (
            ('metrics_urls = ["http://127.0.0.1:30000/metrics"]', 'metrics_urls = ["file:///etc/passwd"]'),
            "field 'metrics_urls'",
        ),
        (('name = "node-1"', 'name = "node 1"'), "field 'name'"),
        # `re.match(...$)` lets a name end in a newline: the rules match the whole value.
        (('name = "node-1"', 'name = "node-1\\n"'), "node 'node-1\\n': field 'name'"),
        (('name = "dflash-gen"', 'name = "dflash-gen\\n"'), "[run] field 'name'"),
        (('python = "python3"', 'python = "python3\\n"'), "field 'python'"),
        (
            ('python = "python3"', 'python = "python3"\nscan_workers = 0'),
            "field 'scan_workers' must be between 1 and 8",
        ),
        (
            ('python = "python3"', 'python = "python3"\nscan_workers = 9'),
            "field 'scan_workers' must be between 1 and 8",
        ),
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
    assert "missing [run] table" in bad(tmp_path, EXAMPLE[EXAMPLE.index("[[nodes]]") :])


def test_secrets_are_refused_in_the_config_file(tmp_path):
    message = bad(tmp_path, EXAMPLE + 'passphrase = "hunter2"\n')
    assert "'passphrase' must not be in the config file" in message
    assert "hunter2" not in message


def test_invalid_toml_and_missing_file(tmp_path):
    assert "not valid TOML" in bad(tmp_path, "[run\nname=")
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")


def test_duplicate_node_names(tmp_path):
    node = EXAMPLE[EXAMPLE.index("[[nodes]]") :]
    assert "node name 'node-1' is used twice" in bad(tmp_path, EXAMPLE + node)


def test_paths_with_shell_characters_are_kept_literally(tmp_path):
    weird = "/data/my out/$(touch pwned)/`id`;x/'q\"*.jsonl"
    raw = {"run": {"name": "r"}, "nodes": [{"name": "n", "host": "local", "shards": [weird]}]}
    assert parse_config(raw).nodes[0].shards == [weird]


def test_secrets_come_from_secrets_file_and_never_show(tmp_path):
    secrets = write(tmp_path, '[nodes.node-1]\npassphrase = "hunter2-planted"\n', "secrets.toml")
    config = load_config(write(tmp_path, EXAMPLE), secrets_path=secrets)
    node = config.nodes[0]
    assert node.passphrase.reveal() == "hunter2-planted"  # the one way to read it
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
    from runhealth.collect.collector import poll_request

    plain = load_config(write(tmp_path, EXAMPLE), secrets_path=tmp_path / "none.toml").nodes[0]
    assert plain.scan_workers is None and poll_request(plain, {})["shards"]["scan_workers"] is None
    two = load_config(
        write(tmp_path, EXAMPLE.replace('python = "python3"', 'python = "python3"\nscan_workers = 2')),
        secrets_path=tmp_path / "none.toml",
    ).nodes[0]
    assert poll_request(two, {})["shards"]["scan_workers"] == 2


README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_key_tables_are_the_generated_ones():
    """The README's key tables come from the declarations: regenerate with `python -m runhealth.settings.config --markdown`."""
    text = README.read_text(encoding="utf-8")
    found = re.search(r"<!-- config-keys:[^\n]*-->\n(.*?)\n<!-- /config-keys -->", text, re.S)
    assert found, "README.md lost its <!-- config-keys --> markers"
    assert found.group(1).strip() == config_module.markdown().strip()


def test_every_file_key_is_declared_once_with_its_text():
    for cls in (RunConfig, NodeConfig):
        for field in dataclasses.fields(cls):
            s = spec_of(field)
            if field.name == "nodes":
                assert s is None  # [[nodes]] is checked as its own tables
                continue
            assert s is not None and s.doc, f"{cls.__name__}.{field.name} has no spec(...) with a doc"
    # The unknown-field message lists exactly the declared keys: the table checked is the declared one.
    with pytest.raises(ConfigError) as info:
        parse_config({"run": {"name": "r", "bogus": 1}, "nodes": []})
    allowed = info.value.args[0].split("(allowed: ")[1].rstrip(")").split(", ")
    assert sorted(allowed) == sorted(f.name for f in dataclasses.fields(RunConfig) if spec_of(f) is not None)
    assert config_module.SECRET_KEYS == {"passphrase", "password", "private_key"}


def test_the_loaded_config_is_frozen_and_runtime_facts_live_in_the_context(tmp_path):
    config = load_config(write(tmp_path, EXAMPLE), secrets_path=tmp_path / "none.toml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.interval_s = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.nodes[0].host = "elsewhere"  # type: ignore[misc]
    assert not hasattr(config, "source") and not hasattr(config, "demo")
    assert not hasattr(config.nodes[0], "demo_gpus")
    context = RunContext(source="x", demo=True, demo_gpus={"node-1": 3})
    with pytest.raises(TypeError):
        context.demo_gpus["node-1"] = 9  # type: ignore[index]
    from runhealth.collect.collector import poll_request

    assert poll_request(config.nodes[0], {}, demo_gpus=context.demo_gpus["node-1"])["demo_gpus"] == 3


def test_secrets_never_print_through_repr_str_format_logging_or_serialisation(tmp_path, caplog):
    planted = "hunter2-planted-XYZ"
    secrets = write(tmp_path, f'[nodes.node-1]\npassphrase = "{planted}"\npassword = "{planted}"\n', "secrets.toml")
    config = load_config(write(tmp_path, EXAMPLE), secrets_path=secrets)
    node = config.nodes[0]
    assert isinstance(node.passphrase, Secret) and isinstance(node.password, Secret)
    log = logging.getLogger("runhealth.test_secret")
    with caplog.at_level(logging.DEBUG):
        log.info("node %s %r config %s %r", node.passphrase, node.password, node, config)
        log.info("plain: %s", node.passphrase, extra={"node": node})
    shown = [
        repr(config),
        str(config),
        repr(node),
        str(node),
        f"{node.passphrase}",
        f"{node.password!r}",
        f"{node.passphrase:>40}",
        str(dataclasses.asdict(node)),
        repr(node.public_dict()),
        caplog.text,
        str([node.passphrase]),
        format(node.password, "s"),
    ]
    for text in shown:
        assert planted not in text, text
    assert "***" in f"{node.passphrase}" and "***" in caplog.text
    with pytest.raises(TypeError):
        json.dumps(dataclasses.asdict(node))  # refused, not written out in the clear
    with pytest.raises(TypeError):
        pickle.dumps(node.passphrase)
    with pytest.raises(AttributeError):
        node.passphrase._value = "x"  # type: ignore[union-attr]
    assert node.passphrase.reveal() == planted and node.password.reveal() == planted
    assert config_module.reveal(None) is None and config_module.reveal(node.password) == planted
    assert node.public_dict()["passphrase_set"] is True and "passphrase" not in node.public_dict()
    built = NodeConfig(name="n", host="h", shards=["/x"], password=planted)  # type: ignore[arg-type]
    assert isinstance(built.password, Secret) and planted not in repr(built)
