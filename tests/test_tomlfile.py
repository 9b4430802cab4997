"""One TOML reader (issue 31 item 4): every file runhealth reads fails the same way.

The config, the runs file and Streamlit's config.toml name the file and tomllib's line and
column; a secrets file names the file and never its content. Before the fold, launch and
exposure parsed on their own: a broken .streamlit/config.toml escaped `runhealth dashboard`
as a bare TOMLDecodeError, and a secrets file that is not UTF-8 crashed the exposure check.
"""

from __future__ import annotations

import pytest

from runhealth.alerting import webhook
from runhealth.errors import ConfigError
from runhealth.serve import exposure, launch
from runhealth.settings import config, runs, tomlfile

BROKEN = '[run]\nname = "r"\nstore_path = \n'  # line 3, column 14: a key without a value
SECRET = "hunter2-secret"


def _where(exc: pytest.ExceptionInfo[ConfigError], path: object) -> str:
    text = str(exc.value)
    assert text.startswith(f"{path}: ") and tomlfile.TOML_SYNTAX in text, text
    return config.fix_hint(text, path)


def test_config_runs_and_streamlit_config_report_the_same_line_and_column(tmp_path):
    path = tmp_path / "runhealth.toml"
    path.write_text(BROKEN)
    (tmp_path / ".streamlit").mkdir()
    streamlit_toml = tmp_path / ".streamlit" / "config.toml"
    streamlit_toml.write_text(BROKEN)
    with pytest.raises(ConfigError) as by_config:
        config.load_config(path, secrets_path=tmp_path / "none.toml")
    with pytest.raises(ConfigError) as by_runs:
        runs.load_runs(path, secrets_path=tmp_path / "none.toml")
    with pytest.raises(ConfigError) as by_launch:
        launch.streamlit_options(tmp_path)
    hints = {_where(by_config, path), _where(by_runs, path), _where(by_launch, streamlit_toml)}
    assert hints == {
        f"Fix the TOML syntax at line 3, column 14 of {path}",
        f"Fix the TOML syntax at line 3, column 14 of {streamlit_toml}",
    }


def test_a_missing_config_says_so_and_a_missing_streamlit_config_is_no_options(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        tomlfile.read_toml(tmp_path / "none.toml")
    assert launch.streamlit_options(tmp_path) == []


@pytest.mark.parametrize("content", [f'[alerts]\nwebhook_urls = "{SECRET}\n'.encode(), b"\xff\xfe" + SECRET.encode()])
def test_every_secrets_reader_names_the_file_never_its_content(tmp_path, content):
    secrets = tmp_path / "secrets.toml"
    secrets.write_bytes(content)
    cfg = config.parse_config({"run": {"name": "r"}, "nodes": [{"name": "n", "host": "local", "shards": ["/x"]}]})
    for read in (lambda: config.apply_secrets(cfg, secrets), lambda: webhook.load_urls(secrets, environ={})):
        with pytest.raises(ConfigError) as exc:
            read()
        assert str(exc.value).startswith(f"{secrets}: cannot read secrets file") and SECRET not in str(exc.value)
    assert exposure.auth_configured([secrets]) is False  # skipped, as Streamlit could not sign in with it


def test_a_missing_secrets_file_is_empty(tmp_path):
    assert tomlfile.read_secrets(tmp_path / "none.toml") == {}
    assert webhook.load_urls(tmp_path / "none.toml", environ={}) == ([], [])
