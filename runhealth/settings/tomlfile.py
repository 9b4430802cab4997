"""Reading a TOML file: the one place runhealth opens one (issue 31 item 4).

The config (`config.load_config`), the runs file (`runs.load_runs`), Streamlit's
`.streamlit/config.toml` (`serve.launch`) and the secrets file (`config.apply_secrets`,
`alerting.webhook`, `serve.exposure`) are all read here, so a file that is missing, unreadable
or not valid TOML fails the same way everywhere: a `ConfigError` naming the file and, for a
syntax error, tomllib's line and column (which `config.fix_hint` turns into "Fix the TOML
syntax at line 3, column 5 of ..."). A secrets file's errors name the file only: the parser's
text may quote a secret.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from runhealth.errors import ConfigError

TOML_SYNTAX = "not valid TOML"  # in every syntax error's message (config.fix_hint looks for it)


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML document at `path`.

    Raises:
        ConfigError: the file is missing ("config file not found"), unreadable, or not valid
            TOML ("<path>: not valid TOML: ... (at line 3, column 5)").
    """
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {TOML_SYNTAX}: {exc}") from None


def read_secrets(path: Path) -> dict[str, Any]:
    """The secrets file at `path`, {} when there is none.

    Raises:
        ConfigError: the file cannot be read or parsed; the message names the file and the kind
            of error only (the exception's text may quote the file's content).
    """
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read secrets file ({type(exc).__name__})") from None
