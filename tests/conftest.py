"""Shared fixtures: a hermetic environment, and real OpenSSH sshd processes on loopback.

Every test session runs hermetic (`hermetic_environment`, autouse): HOME, the XDG folders and
the working directory are fresh temporary folders and RUNHEALTH_CONFIG, RUNHEALTH_COLLECTOR and
the ssh-agent variables are removed, so no test reads the user's runhealth.toml (in the
checkout or anywhere), ~/.ssh/config, ~/.streamlit or .streamlit/secrets.toml
(tests/test_hermetic.py proves it with a poisoned copy of the checkout).

The sshd fixtures are never mocked.

The chain follows ansible/pylibssh's tests/conftest.py: session temp dir -> client keys ->
authorized_keys -> `sshd_node` factory (host key + sshd on 127.0.0.x + known_hosts). A missing
sshd fails the test with how to install it; it never skips.

    node = sshd_node("127.0.0.2")          # started, banner seen; stopped at session end
    cfg = node.node_config(name="node-2")  # runhealth.settings.config.NodeConfig pointing at it
    transport = SSHTransport(cfg)
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
import sshd as sshd_lib
from cputrace import pytest_runtest_protocol  # noqa: F401 - RUNHEALTH_TEST_CPU=FILE: each test's CPU
from hypothesis import HealthCheck, settings
from leakcheck import (
    pytest_sessionfinish,  # noqa: F401 - fails the run if a test leaves a process
    track,
)

from runhealth.settings.config import NodeConfig

sshd_lib.ON_START.append(track)  # every sshd counts as this session's (leakcheck.py)

# Hypothesis: "dev" (the default) draws new examples on every run, so a developer's runs keep
# searching; "ci" (selected by CI=true, which .ci/run sets; `--hypothesis-profile` overrides) is
# derandomized, with no example database: the same examples on every run, so a red CI run is
# reproducible and a green one cannot turn red by chance. A costly property test states its
# examples as a multiple of the profile's `max_examples` (test_fields_property: 4x, 400 in dev),
# which CI sets to a quarter; a cheap one keeps its fixed count in both.
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI", "").lower() in ("1", "true") else "dev")

# A planted secret: tests assert it never shows up in exceptions or logs.
SECRET_PASSPHRASE = "planted-Secret-passphrase-7f3a"


HERMETIC_UNSET = (
    "RUNHEALTH_CONFIG",
    "RUNHEALTH_COLLECTOR",
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "STREAMLIT_CONFIG",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
)


@pytest.fixture(scope="session", autouse=True)
def hermetic_environment(tmp_path_factory):
    """A fresh HOME, cache and working directory for the whole session; no runhealth variables."""
    home = tmp_path_factory.mktemp("home")
    workdir = tmp_path_factory.mktemp("cwd")
    with pytest.MonkeyPatch.context() as mp:
        for name in HERMETIC_UNSET:
            mp.delenv(name, raising=False)
        for name in [n for n in os.environ if n.startswith(("RUNHEALTH_", "STREAMLIT_"))]:
            mp.delenv(name)
        mp.setenv("HOME", str(home))
        mp.setenv("XDG_CACHE_HOME", str(home / ".cache"))
        mp.chdir(workdir)
        yield workdir


def xdist_group_of(item: pytest.Item) -> str | None:
    """The pytest-xdist group `item` runs in (`-n N --dist loadgroup`, as scripts/test.sh runs).

    A fixture is made once per worker, so tests that share a costly one share a worker: those on
    the session's demo server (`server_url`) go to "browser-demo" (the demo starts once); the other
    browser tests, which start a server of their own or none, to "browser" (its worker launches a
    second Chromium); a test using a module- or class-scoped fixture of its own module goes with
    the rest of that module (a wheel built and installed once, not once per worker). The rest
    spread freely. tests/test_xdist_groups.py checks this on a real collection.
    """
    if item.get_closest_marker("browser"):
        return "browser-demo" if "server_url" in item.fixturenames else "browser"
    defs = item._fixtureinfo.name2fixturedefs
    module = item.nodeid.split("::")[0]
    for name in item.fixturenames:
        fixturedef = defs[name][-1] if defs.get(name) else None
        if fixturedef and fixturedef.scope in ("module", "class") and fixturedef.baseid == module:
            return module
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the marks into the node IDs it schedules
def pytest_collection_modifyitems(config, items):
    groups = {item.nodeid: xdist_group_of(item) for item in items}
    # A module whose module-scoped fixture a browser test also uses runs whole on the browser
    # worker, so that fixture is still made once (tests/test_retired_access.py).
    with_browser = {i.nodeid.split("::")[0] for i in items if groups[i.nodeid] == "browser"}
    for item in items:
        group = groups[item.nodeid]
        if group is not None and group in with_browser:
            group = "browser"
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


@dataclasses.dataclass
class SshdNode:
    """A running sshd plus what a client needs to reach it."""

    sshd: sshd_lib.Sshd
    host_key: Path
    known_hosts: Path
    client_key: Path

    @property
    def ip(self) -> str:
        return self.sshd.ip

    @property
    def port(self) -> int:
        return self.sshd.port

    def node_config(self, **overrides) -> NodeConfig:
        """A NodeConfig for this sshd; the remote python is this interpreter (same machine)."""
        fields = dict(
            name=f"node-{self.ip.rsplit('.', 1)[1]}",
            host=self.ip,
            shards=[],
            port=self.port,
            user=None,
            identity_file=str(self.client_key),
            known_hosts=str(self.known_hosts),
            python=sys.executable,
            connect_timeout_s=5.0,
            command_timeout_s=10.0,
        )
        fields.update(overrides)
        return NodeConfig(**fields)


@pytest.fixture(scope="session")
def sshd_tools():
    """Fail (never skip) when OpenSSH is missing, saying how to install it."""
    problem = sshd_lib.missing_tools()
    if problem:
        pytest.fail(problem)


@pytest.fixture(scope="session")
def ssh_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ssh")


@pytest.fixture(scope="session")
def ssh_client_key(sshd_tools, ssh_dir) -> Path:
    """Unencrypted client key, authorized on every `sshd_node`."""
    return sshd_lib.keygen(ssh_dir / "id_client")


@pytest.fixture(scope="session")
def ssh_encrypted_key(sshd_tools, ssh_dir) -> Path:
    """Client key encrypted with SECRET_PASSPHRASE, also authorized on every `sshd_node`."""
    return sshd_lib.keygen(ssh_dir / "id_encrypted", passphrase=SECRET_PASSPHRASE)


@pytest.fixture(scope="session")
def ssh_authorized_keys(ssh_dir, ssh_client_key, ssh_encrypted_key) -> Path:
    path = ssh_dir / "authorized_keys"
    path.write_text("".join(Path(f"{key}.pub").read_text() for key in (ssh_client_key, ssh_encrypted_key)))
    return path


@pytest.fixture(scope="session")
def sshd_node(request, ssh_dir, ssh_client_key, ssh_authorized_keys):
    """Factory: ``sshd_node(ip="127.0.0.2", host_key=None, **sshd_options) -> SshdNode``.

    Each call starts a new sshd (own free port, own host key unless one is given, own
    known_hosts file). All are stopped at session end; their logs are printed if a test failed.
    """
    started: list[SshdNode] = []

    def start(ip: str = "127.0.0.2", host_key: Path | None = None, **options) -> SshdNode:
        index = len(started)
        if host_key is None:
            host_key = sshd_lib.keygen(ssh_dir / f"host_key_{index}", comment="host")
        server = sshd_lib.Sshd(ip, host_key, ssh_authorized_keys, ssh_dir, extra_options=options)
        try:
            server.start()
        except RuntimeError as exc:
            pytest.fail(str(exc))
        known_hosts = sshd_lib.write_known_hosts(ssh_dir / f"known_hosts_{index}", [(ip, server.port, host_key)])
        node = SshdNode(server, host_key, known_hosts, ssh_client_key)
        started.append(node)
        return node

    yield start
    for node in started:
        node.sshd.stop()
    if request.session.testsfailed:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        for node in started:
            text = node.sshd.log_text().strip()
            if text and reporter:
                reporter.write_line(f"--- sshd {node.ip}:{node.port} log ---\n{text}")


# -- the demo dashboard and one Chromium, shared by every browser test module -------------------
# Session fixtures live here, not in a test module: a fixture imported into a second module is a
# second fixture, and a second sync_playwright() in one process fails.
@pytest.fixture(scope="session")
def server_url():
    import tempfile

    import test_browser as tb

    with tempfile.TemporaryDirectory(prefix="runhealth-browser-") as tmp, tb.streamlit_server(Path(tmp)) as url:
        yield url


@pytest.fixture(scope="session")
def browser_page():
    import test_browser as tb
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = tb.launch_chromium(p)
        page = browser.new_page(viewport=tb.VIEWPORT)
        yield page
        browser.close()
