"""A planted secret never leaks: not in logs, exceptions, the store, or what pages render.

The node's client key is encrypted with a planted passphrase that reaches runhealth only
through `.streamlit/secrets.toml`; afterwards everything runhealth wrote or said is searched
for the passphrase and for the private key's contents.
"""

import logging
import sys
from pathlib import Path

from conftest import SECRET_PASSPHRASE
from shardgen import truth_rows, write_shard

from runhealth.collect.collector import Collector
from runhealth.errors import AuthError
from runhealth.settings.config import load_config
from runhealth.store import Store

ROOT = Path(__file__).resolve().parent.parent


def key_material(key_path: Path) -> list[str]:
    """Distinctive chunks of the private key file's body."""
    body = "".join(line for line in key_path.read_text().splitlines() if "PRIVATE KEY" not in line)
    return [body[i : i + 24] for i in range(0, len(body) - 24, 97)]


def write_config(tmp_path, node, key, passphrase):
    shards = tmp_path / "shards"
    shards.mkdir(exist_ok=True)
    write_shard(shards / "a.jsonl", truth_rows(50, 1))
    config = tmp_path / "runhealth.toml"
    config.write_text(f"""
[run]
name = "secret-test"
store_path = "{tmp_path / "store.sqlite3"}"

[[nodes]]
name = "enc"
host = "{node.ip}"
port = {node.port}
identity_file = "{key}"
known_hosts = "{node.known_hosts}"
shards = ["{shards}/*.jsonl"]
python = "{sys.executable}"
gpu = "off"
connect_timeout_s = 5
""")
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(f'[nodes.enc]\npassphrase = "{passphrase}"\n')
    return config, secrets


def everything_written(tmp_path: Path) -> str:
    return "".join(p.read_bytes().decode("latin-1") for p in tmp_path.glob("store.sqlite3*"))


def assert_clean(text: str, key: Path) -> None:
    assert SECRET_PASSPHRASE not in text
    for chunk in key_material(key):
        assert chunk not in text


def rendered_text(node) -> str:
    """Every element's full protobuf text (values, labels, JSON, dataframes), recursively."""
    parts = [str(getattr(node, "proto", ""))]
    for child in getattr(node, "children", {}).values():
        parts.append(rendered_text(child))
    return "\n".join(parts)


def collect_once(tmp_path, node, key, passphrase):
    """Write the config and secrets, poll the node once; returns (config path, config, store, result)."""
    config_path, secrets = write_config(tmp_path, node, key, passphrase)
    config = load_config(config_path, secrets_path=secrets)
    store = Store(config.resolved_store_path())
    with Collector(config, store) as collector:
        result = collector.poll_once()["enc"]
    return config_path, config, store, result


def test_passphrase_from_secrets_unlocks_the_key_and_never_leaks(tmp_path, sshd_node, ssh_encrypted_key, caplog):
    caplog.set_level(logging.DEBUG)
    node = sshd_node("127.0.0.31")
    _, config, store, result = collect_once(tmp_path, node, ssh_encrypted_key, SECRET_PASSPHRASE)
    assert isinstance(result, dict), result
    assert store.nodes()[0]["completions"] == 50
    store.close()
    assert_clean(everything_written(tmp_path) + caplog.text + repr(config), ssh_encrypted_key)


def test_wrong_passphrase_is_an_auth_error_that_quotes_no_secret(tmp_path, sshd_node, ssh_encrypted_key, caplog):
    caplog.set_level(logging.DEBUG)
    node = sshd_node("127.0.0.32")
    wrong = SECRET_PASSPHRASE + "-wrong"
    _, _, store, result = collect_once(tmp_path, node, ssh_encrypted_key, wrong)
    assert isinstance(result, AuthError)
    shown = str(result) + store.nodes()[0]["last_error"]
    store.close()
    text = shown + everything_written(tmp_path) + caplog.text
    assert wrong not in text
    assert_clean(text, ssh_encrypted_key)


def test_nodes_page_shows_no_secret(tmp_path, sshd_node, ssh_encrypted_key, monkeypatch):
    from test_pages import open_app

    node = sshd_node("127.0.0.33")
    config_path, _, _, result = collect_once(tmp_path, node, ssh_encrypted_key, SECRET_PASSPHRASE)
    assert isinstance(result, dict), result
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(config_path))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = open_app("nodes", timeout=30).run()
    assert not at.exception
    rendered = rendered_text(at._tree)
    assert "secret-test" in rendered  # the page did render this run
    assert str(ssh_encrypted_key) in rendered  # ...and its effective config, key path included
    assert_clean(rendered, ssh_encrypted_key)


def test_the_dashboard_binds_to_localhost_by_default():
    import tomllib

    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "127.0.0.1"
    assert config["browser"]["gatherUsageStats"] is False
