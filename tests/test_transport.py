"""Transport tests against real OpenSSH sshd processes on 127.0.0.x (never mocked).

Scenarios are named after the field failure they reproduce: a node that is down, a reinstalled
node whose host key changed, a wrong key, a firewall that accepts TCP but never answers, an agent
stuck on a dead NFS mount, hostile shard paths, an agent printing garbage.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import pwd
import socket
import threading
import time
from pathlib import Path

import pytest
import sshd as sshd_lib
from conftest import SECRET_PASSPHRASE

from runhealth.errors import (
    AgentError,
    AuthError,
    CommandTimeout,
    ConfigError,
    ConnectError,
    HostKeyError,
    TransportError,
)
from runhealth.node import wire
from runhealth.remote import make_transport
from runhealth.remote.base import fan_out
from runhealth.remote.local import LocalTransport
from runhealth.remote.protocol import BOOTSTRAP, encode_frame, launch_argv, program_frame
from runhealth.remote.ssh import SSHTransport

pytestmark = pytest.mark.ssh

AGENT_PATH = Path(__file__).parent.parent / "runhealth" / "node" / "agent.py"
STANDIN = program_frame(main_source=(Path(__file__).parent / "standin_agent.py").read_text())


@pytest.fixture(scope="module")
def three_nodes(sshd_node):
    return [sshd_node(ip) for ip in ("127.0.0.2", "127.0.0.3", "127.0.0.4")]


@pytest.fixture(scope="module")
def node(sshd_node):
    """One shared sshd for the single-node scenarios."""
    return sshd_node("127.0.0.6")


@pytest.fixture
def real_agent():
    if not AGENT_PATH.exists():
        pytest.skip("runhealth/node/agent.py is not written yet")
    return program_frame()


@pytest.fixture
def transports():
    """Collects transports and closes them after the test."""
    made: list = []

    def track(transport):
        made.append(transport)
        return transport

    yield track
    for transport in made:
        transport.close()


def _poll_request(shard_dir: Path) -> dict:
    return {
        "op": "poll",
        "gpu": "off",
        "metrics_urls": [],
        "metrics_timeout_s": 1.0,
        "shards": {
            "globs": [str(shard_dir / "*.jsonl")],
            "state": {},
            "budget_bytes": 1 << 20,
            "finish_reason_path": None,
            "completion_tokens_path": None,
        },
    }


# ----------------------------------------------------------------------------- protocol


def test_frame_is_length_newline_json():
    assert encode_frame({"op": "hello"}) == b'14\n{"op":"hello"}'
    assert encode_frame({"t": "é"}) == b'14\n{"t":"\\u00e9"}'  # ASCII JSON, both directions (wire.py)


def test_every_str_encodes_even_a_file_name_that_is_not_utf8():
    """A lone surrogate (os.fsdecode of a non-UTF-8 name) travels as an escape and comes back."""
    name = os.fsdecode(b"/data/caf\xe9.jsonl")
    header, body = encode_frame({"globs": [name]}).split(b"\n", 1)
    assert int(header) == len(body) and wire.decode_body(body) == {"globs": [name]}


def test_launch_argv_is_python_and_the_constant_bootstrap():
    assert launch_argv("/usr/bin/python3") == ["/usr/bin/python3", "-u", "-c", BOOTSTRAP]


@pytest.mark.parametrize("python", ["python3; rm -rf /", "py thon", "$(id)", "", "python`x`", "python3\n"])
def test_launch_argv_rejects_shell_in_python(python):
    with pytest.raises(ConfigError, match="python"):
        launch_argv(python)


def test_program_frame_ships_pynvml_source():
    frame = program_frame(main_source="print(1)")
    program = json.loads(frame.split(b"\n", 1)[1])
    assert program["main"] == "print(1)"
    assert "nvmlInit" in program["modules"].get("pynvml", "nvmlInit")


# ----------------------------------------------------------------------------- SSH, happy path


@pytest.mark.parametrize("program", ["standin", "real"])
def test_three_nodes_hello_and_poll_via_fan_out(program, three_nodes, tmp_path, transports, request):
    frame = STANDIN if program == "standin" else request.getfixturevalue("real_agent")
    (tmp_path / "a.jsonl").write_text('{"finish_reason": "stop", "completion_tokens": 7}\n')
    group = {n.node_config().name: transports(SSHTransport(n.node_config(), program=frame)) for n in three_nodes}
    hello = fan_out(group, lambda name: {"op": "hello"}, timeout_s=10)
    assert sorted(hello) == ["node-2", "node-3", "node-4"]
    assert all(reply["ok"] for reply in hello.values()), hello
    poll = fan_out(group, lambda name: _poll_request(tmp_path), timeout_s=10)
    for reply in poll.values():
        assert reply["ok"] and reply["schema_version"] == 1, reply
        if program == "real":
            assert reply["shards"]["files"][str(tmp_path / "a.jsonl")]["lines"] == 1


def test_persistent_connection_and_agent_are_reused(node, transports):
    transport = transports(SSHTransport(node.node_config(), program=STANDIN))
    first = transport.request({"op": "hello"})
    channel, client = transport.channel, transport._clients[-1]
    for _ in range(5):
        assert transport.request({"op": "hello"})["pid"] == first["pid"]
        assert transport.channel is channel and transport._clients[-1] is client
    assert transport.connected and transport.rtt_ms < 1000


def test_stderr_flood_larger_than_the_ssh_window_does_not_stall(node, transports):
    transport = transports(SSHTransport(node.node_config(), program=STANDIN))
    assert transport.request({"op": "stderr", "n": 5_000_000}, timeout_s=20)["ok"]


# ----------------------------------------------------------------------------- SSH, node failures


def test_node_down_fails_alone_and_backs_off(sshd_node, three_nodes, transports):
    doomed = sshd_node("127.0.0.5")
    doomed.sshd.stop()
    group = {
        n.node_config().name: transports(SSHTransport(n.node_config(), program=STANDIN))
        for n in [*three_nodes[:2], doomed]
    }
    results = fan_out(group, lambda name: {"op": "hello"}, timeout_s=10)
    assert not isinstance(results["node-2"], Exception), results
    assert not isinstance(results["node-3"], Exception), results
    assert isinstance(results["node-5"], ConnectError), results
    assert str(results["node-5"]) == f"connection refused by 127.0.0.5:{doomed.port}"
    # A fresh attempt (Refresh now skips the backoff) fails again and doubles the backoff to 2 s;
    # the request right after it is answered from the backoff, without a new connection attempt.
    group["node-5"].retry_now()
    with pytest.raises(ConnectError, match=r"^connection refused by [0-9.:]+$"):
        group["node-5"].request({"op": "hello"})
    with pytest.raises(ConnectError, match=r"refused by .* \(next reconnect attempt in [12] s\)"):
        group["node-5"].request({"op": "hello"})


def test_nothing_listening_is_connection_refused(transports, node):
    port = sshd_lib.free_port("127.0.0.9")
    cfg = node.node_config(host="127.0.0.9", port=port)
    with pytest.raises(ConnectError) as info:
        transports(SSHTransport(cfg, program=STANDIN)).request({"op": "hello"})
    assert str(info.value) == f"connection refused by 127.0.0.9:{port}"


def test_unresolvable_host_is_dns_error(transports, node):
    cfg = node.node_config(host="no-such-node.invalid", port=22)
    with pytest.raises(ConnectError, match="DNS lookup failed for no-such-node.invalid"):
        transports(SSHTransport(cfg, program=STANDIN)).request({"op": "hello"})


def test_firewall_that_accepts_tcp_but_never_sends_a_banner_is_bounded(transports, node):
    listener = socket.create_server(("127.0.0.7", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    cfg = node.node_config(host="127.0.0.7", port=listener.getsockname()[1], connect_timeout_s=1)
    started = time.monotonic()
    try:
        with pytest.raises(ConnectError, match="no SSH banner from 127.0.0.7"):
            transports(SSHTransport(cfg, program=STANDIN)).request({"op": "hello"})
        assert time.monotonic() - started < 4
    finally:
        listener.close()
        for sock in held:
            sock.close()


# ----------------------------------------------------------------------------- SSH, trust


def test_unknown_host_key_is_refused(node, tmp_path, transports):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError, match="is not in known_hosts .*accept_new_host_key = true"):
        transports(SSHTransport(node.node_config(known_hosts=str(empty)), program=STANDIN)).request({"op": "hello"})
    assert empty.read_text() == ""


def test_reinstalled_node_changed_host_key_is_refused_even_with_accept_new(
    node, sshd_node, ssh_dir, tmp_path, transports
):
    impostor_key = sshd_lib.keygen(tmp_path / "other_host_key")
    stale = sshd_lib.write_known_hosts(tmp_path / "known_hosts", [(node.ip, node.port, impostor_key)])
    before = stale.read_text()
    cfg = node.node_config(known_hosts=str(stale), accept_new_host_key=True)
    with pytest.raises(HostKeyError, match="CHANGED — refusing.*ssh-keygen -R"):
        transports(SSHTransport(cfg, program=STANDIN)).request({"op": "hello"})
    assert stale.read_text() == before


def test_accept_new_host_key_records_the_key(node, tmp_path, transports):
    known_hosts = tmp_path / "fresh" / "known_hosts"
    cfg = node.node_config(known_hosts=str(known_hosts), accept_new_host_key=True)
    assert transports(SSHTransport(cfg, program=STANDIN)).request({"op": "hello"})["ok"]
    key_type, key_b64 = Path(f"{node.host_key}.pub").read_text().split()[:2]
    assert known_hosts.read_text() == f"[{node.ip}]:{node.port} {key_type} {key_b64}\n"
    strict = node.node_config(known_hosts=str(known_hosts))  # now trusted without the flag
    assert transports(SSHTransport(strict, program=STANDIN)).request({"op": "hello"})["ok"]


def test_wrong_client_key_is_auth_error(node, tmp_path, transports):
    stranger = sshd_lib.keygen(tmp_path / "id_stranger")
    cfg = node.node_config(identity_file=str(stranger))
    with pytest.raises(
        AuthError,
        match=f"authentication failed for .*@{node.ip} "
        r"\(tried: key file .*id_stranger",
    ):
        transports(SSHTransport(cfg, program=STANDIN)).request({"op": "hello"})


def test_missing_identity_file_is_auth_error(node, tmp_path, transports):
    cfg = node.node_config(identity_file=str(tmp_path / "nope"))
    with pytest.raises(AuthError, match="identity file not found"):
        transports(SSHTransport(cfg, program=STANDIN)).request({"op": "hello"})


def test_passphrase_never_leaks_into_errors_or_logs(node, ssh_encrypted_key, transports, caplog):
    caplog.set_level(logging.DEBUG)
    good = node.node_config(identity_file=str(ssh_encrypted_key), passphrase=SECRET_PASSPHRASE)
    assert transports(SSHTransport(good, program=STANDIN)).request({"op": "hello"})["ok"]
    messages = []
    for passphrase, pattern in [
        (None, "is encrypted; set its passphrase"),
        (SECRET_PASSPHRASE[::-1], "wrong passphrase"),
    ]:
        cfg = node.node_config(identity_file=str(ssh_encrypted_key), passphrase=passphrase)
        with pytest.raises(AuthError, match=pattern) as info:
            transports(SSHTransport(cfg, program=STANDIN)).request({"op": "hello"})
        messages.append(repr(info.value) + str(info.value))
    private_key = ssh_encrypted_key.read_text().splitlines()[1]
    for secret in (SECRET_PASSPHRASE, SECRET_PASSPHRASE[::-1], private_key):
        assert secret not in caplog.text and secret not in "".join(messages)
    assert SECRET_PASSPHRASE not in repr(good)


def test_a_passphrase_for_a_key_that_is_not_encrypted_is_ignored_as_ssh_does(node, transports, caplog):
    caplog.set_level(logging.DEBUG)
    cfg = node.node_config(passphrase=SECRET_PASSPHRASE)  # the fixture's client key has none
    assert transports(SSHTransport(cfg, program=STANDIN)).request({"op": "hello"})["ok"]
    assert "is not encrypted" in caplog.text and SECRET_PASSPHRASE not in caplog.text


# ----------------------------------------------------------------------------- SSH, agent faults


def test_agent_stuck_on_dead_mount_times_out_and_next_request_restarts(node, transports):
    transport = transports(SSHTransport(node.node_config(), program=STANDIN))
    old_pid = transport.request({"op": "hello"})["pid"]
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match="did not answer 'sleep' within 1 s"):
        transport.request({"op": "sleep", "seconds": 3}, timeout_s=1)
    assert 1 <= time.monotonic() - started < 3
    assert not transport.connected
    assert transport.request({"op": "hello"}, timeout_s=5)["pid"] != old_pid
    # Not orphaned: sshd kills it on our "signal" request (refused for root logins, as in
    # this test), else it dies on the closed pipe as soon as it wakes.
    _assert_process_gone(old_pid, within_s=5)


def _assert_process_gone(pid: int, within_s: float = 3.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"agent process {pid} is still running")


@pytest.mark.parametrize(
    "op, pattern",
    [
        ("garbage", r"garbage instead of a reply: b'hello, I am not a frame\\n'"),
        ("notjson", r"not a JSON object: b'<html>oops!'"),
        ("huge", "reply too large"),
        ("schema", "agent schema version 7, expected 1"),
        ("fail", "no such shard: /x"),
    ],
)
def test_bad_replies_are_agent_errors_and_the_next_request_works(node, transports, op, pattern):
    transport = transports(SSHTransport(node.node_config(), program=STANDIN))
    transport.request({"op": "hello"})
    with pytest.raises(AgentError, match=pattern):
        transport.request({"op": op}, timeout_s=5)
    assert transport.request({"op": "hello"}, timeout_s=5)["ok"]


def test_agent_crash_reports_exit_status_and_clean_stderr_tail(node, transports):
    transport = transports(SSHTransport(node.node_config(), program=STANDIN))
    with pytest.raises(TransportError, match="exit status 3; stderr: standin: fatal") as info:
        transport.request({"op": "exit"}, timeout_s=5)
    assert "\x1b" not in str(info.value)
    assert transport.request({"op": "hello"}, timeout_s=5)["ok"]


def test_missing_remote_python_says_so(node, transports):
    cfg = node.node_config(python="/nonexistent/python3")
    with pytest.raises(TransportError, match="exit status 127; stderr: .*/nonexistent/python3"):
        transports(SSHTransport(cfg, program=STANDIN)).request({"op": "hello"}, timeout_s=5)


HOSTILE = [
    "/data/with space/a.jsonl",
    '/data/it\'s "quoted".jsonl',
    "/data/$(touch {m})",
    "/data/`touch {m}`",
    "/data/x; touch {m}",
    "/data/*; touch {m} #",
    "-rf {m}",
]


@pytest.mark.parametrize("program", ["standin", "real"])
def test_hostile_shard_paths_are_data_not_commands(program, node, tmp_path, transports, request):
    frame = STANDIN if program == "standin" else request.getfixturevalue("real_agent")
    marker = tmp_path / "pwned"
    globs = [path.format(m=marker) for path in HOSTILE]
    transport = transports(SSHTransport(node.node_config(), program=frame))
    if program == "standin":
        assert transport.request({"op": "echo", "globs": globs})["request"]["globs"] == globs
    else:
        poll = _poll_request(tmp_path)
        poll["shards"]["globs"] = globs
        assert sorted(transport.request(poll)["shards"]["unmatched_globs"]) == sorted(globs)
    assert not marker.exists()


# ----------------------------------------------------------------------------- SSH, a login shell that talks
# HPC login nodes often greet every login on stdout, non-interactive ones included; that text
# reaches the exec channel ahead of the agent's first reply (issue 29, item 10).
BASHRC = (
    'echo "Welcome to hpc-login-01 (from ~/.bashrc)"\n'
    "printf '\\033[1mquota: 93%% of /home used\\033[0m '\n"  # ends without a newline
    'echo "module: cuda/12.4 loaded" >&2\n'
)


@pytest.fixture(scope="module")
def talking_node(sshd_node, tmp_path_factory):
    """An sshd whose logins run a ~/.bashrc that prints a banner.

    sshd runs the agent as ``<login shell> -c <command>``; Debian's bash reads ~/.bashrc there
    (it is built with SSH_SOURCE_BASHRC), and SetEnv points HOME at a folder holding BASHRC. With
    another login shell a ForceCommand sources the same file.
    """
    home = tmp_path_factory.mktemp("talking-home")
    (home / ".bashrc").write_text(BASHRC)
    options = {"SetEnv": f"HOME={home}"}
    if not pwd.getpwuid(os.getuid()).pw_shell.endswith("/bash"):
        options["ForceCommand"] = f'. {home}/.bashrc; eval "$SSH_ORIGINAL_COMMAND"'
    return sshd_node("127.0.0.12", **options)


def test_a_login_shell_that_prints_a_banner_leaves_the_node_polling_exactly(
    talking_node, real_agent, tmp_path, transports, caplog
):
    caplog.set_level(logging.INFO, logger="runhealth.remote.protocol")
    shard = tmp_path / "a.jsonl"
    stop, length = (
        '{"finish_reason": "stop", "completion_tokens": 5}\n',
        '{"finish_reason": "length", "completion_tokens": 9}\n',
    )
    shard.write_text(stop * 3 + length * 2)
    transport = transports(SSHTransport(talking_node.node_config(), program=real_agent))
    assert transport.request({"op": "hello"})["ok"]
    _, out, _ = transport._clients[-1].exec_command("true")  # the fixture really talks
    assert out.read().startswith(b"Welcome to hpc-login-01 (from ~/.bashrc)\n\x1b[1mquota")
    first = transport.request(_poll_request(tmp_path))["shards"]["files"][str(shard)]
    assert sorted(first["counts"]) == [[5, "stop", 0, 3], [9, "length", 0, 2]] and first["lines"] == 5
    with shard.open("a") as fh:
        fh.write(length)
    poll = _poll_request(tmp_path)
    poll["shards"]["state"] = {str(shard): {"inode": first["inode"], "offset": first["offset"]}}
    second = transport.request(poll)["shards"]["files"][str(shard)]
    assert second["counts"] == [[9, "length", 0, 1]] and second["offset"] == shard.stat().st_size
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 1 and "Welcome to hpc-login-01" in skipped[0] and "\x1b" not in skipped[0]


def test_output_without_a_reply_is_skipped_up_to_a_bound_then_named(node, transports):
    transport = transports(SSHTransport(node.node_config(), program=STANDIN))
    pid = transport.request({"op": "hello"})["pid"]
    assert transport.request({"op": "noise", "n": wire.MAX_NOISE_BYTES})["pid"] == pid  # between replies too
    with pytest.raises(
        AgentError, match=r"no reply within 65536 bytes of other output: 'Welcome to the login node\\x0a"
    ):
        transport.request({"op": "noise", "n": 200_000}, timeout_s=5)
    assert transport.request({"op": "hello"}, timeout_s=5)["pid"] != pid  # a fresh agent, in step


# ----------------------------------------------------------------------------- ssh config


def _write_ssh_config(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_ssh_config_alias_proxy_jump_and_proxy_command(sshd_node, node, tmp_path, transports):
    jump = sshd_node("127.0.0.8")
    both = tmp_path / "known_hosts"
    both.write_text(node.known_hosts.read_text() + jump.known_hosts.read_text())
    key = node.client_key
    config = _write_ssh_config(
        tmp_path / "ssh_config",
        f"""
Host gpu-direct
    HostName {node.ip}
    Port {node.port}
    IdentityFile {key}
Host bastion
    HostName {jump.ip}
    Port {jump.port}
    IdentityFile {key}
Host gpu-behind-bastion
    HostName {node.ip}
    Port {node.port}
    IdentityFile {key}
    ProxyJump bastion
Host gpu-via-proxycommand
    HostName {node.ip}
    Port {node.port}
    IdentityFile {key}
    ProxyCommand ssh -q -i {key} -o BatchMode=yes -o UserKnownHostsFile={both} -p {jump.port} -W %h:%p {getpass.getuser()}@{jump.ip}
Host gpu-behind-dead-bastion
    HostName {node.ip}
    Port {node.port}
    ProxyJump root@127.0.0.9:{sshd_lib.free_port("127.0.0.9")}
""",
    )
    for alias in ("gpu-direct", "gpu-behind-bastion", "gpu-via-proxycommand"):
        cfg = node.node_config(name=alias, host=alias, port=None, identity_file=None, known_hosts=str(both))
        transport = transports(SSHTransport(cfg, ssh_config_path=config, program=STANDIN))
        assert transport.request({"op": "hello"})["ok"]
        assert len(transport._clients) == (2 if alias == "gpu-behind-bastion" else 1)
    cfg = node.node_config(name="dead", host="gpu-behind-dead-bastion", port=None, known_hosts=str(both))
    with pytest.raises(ConnectError, match="connection refused by 127.0.0.9"):
        transports(SSHTransport(cfg, ssh_config_path=config, program=STANDIN)).request({"op": "hello"})


# ----------------------------------------------------------------------------- local


def test_local_transport_echo_timeout_and_restart(transports):
    transport = transports(LocalTransport(program=STANDIN))
    reply = transport.request({"op": "echo", "x": [1, "é"]}, timeout_s=5)
    assert reply["request"] == {"op": "echo", "x": [1, "é"]}
    old_pid = transport.pid
    started = time.monotonic()
    with pytest.raises(CommandTimeout):
        transport.request({"op": "sleep", "seconds": 4}, timeout_s=0.5)
    assert time.monotonic() - started < 2.5
    with pytest.raises(ProcessLookupError):
        os.kill(old_pid, 0)  # killed, not leaked
    assert transport.request({"op": "hello"}, timeout_s=5)["pid"] != old_pid


def test_local_transport_real_agent_hello_and_poll(real_agent, tmp_path, transports):
    (tmp_path / "a.jsonl").write_text('{"finish_reason": "length", "completion_tokens": 9}\n')
    transport = transports(LocalTransport())
    assert transport.request({"op": "hello"}, timeout_s=10)["ok"]
    reply = transport.request(_poll_request(tmp_path), timeout_s=10)
    assert reply["shards"]["files"][str(tmp_path / "a.jsonl")]["lines"] == 1


def test_make_transport_picks_local_or_ssh(node):
    assert isinstance(make_transport(node.node_config(host="local")), LocalTransport)
    assert isinstance(make_transport(node.node_config()), SSHTransport)


def test_fan_out_bounds_a_slow_host_by_its_own_timeout(three_nodes, transports):
    group = {n.node_config().name: transports(SSHTransport(n.node_config(), program=STANDIN)) for n in three_nodes}
    fan_out(group, lambda name: {"op": "hello"})  # connect first, so only the stall is timed
    started = time.monotonic()
    results = fan_out(
        group, lambda name: {"op": "sleep", "seconds": 4} if name == "node-3" else {"op": "hello"}, timeout_s=1
    )
    assert time.monotonic() - started < 3.5  # the stalled node costs its timeout, no more
    assert isinstance(results["node-3"], CommandTimeout)
    assert results["node-2"]["ok"] and results["node-4"]["ok"]
