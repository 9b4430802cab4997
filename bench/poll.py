"""Benchmark one poll round over real sshd on loopback: why runhealth keeps an agent running.

Starts N sshd processes (127.0.0.2, .3, ...; tests/sshd.py) and times a round (fan_out of a
"poll" request with no new data) three ways:

- persistent: runhealth's SSHTransport (one connection, one long-lived agent per node);
- exec/poll:  a reused connection, but a new ``exec`` channel running a one-shot
              ``python3 -c BOOTSTRAP`` agent per poll (what a naive collector does);
- conn/poll:  a brand-new SSH connection (TCP, kex, auth) plus agent per poll.

Usage: python bench/poll.py --nodes 1,8,32 [--rounds 40] [--skip-conn-above 32]
Goals: 8 nodes <= 30 ms median and >= 10x faster than exec/poll; 64 nodes <= 300 ms.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import sshd as sshd_lib

from runhealth.remote.base import fan_out
from runhealth.remote.protocol import AgentSession, launch_argv, program_frame
from runhealth.remote.ssh import ChannelStream, SSHTransport
from runhealth.settings.config import NodeConfig

ROOT = Path(__file__).resolve().parent.parent


def start_nodes(count: int, workdir: Path) -> tuple[list[sshd_lib.Sshd], Path, Path]:
    client_key = sshd_lib.keygen(workdir / "id_client")
    host_key = sshd_lib.keygen(workdir / "host_key")
    authorized = workdir / "authorized_keys"
    authorized.write_text(Path(f"{client_key}.pub").read_text())
    servers = [sshd_lib.Sshd(f"127.0.0.{2 + i}", host_key, authorized, workdir).start() for i in range(count)]
    known_hosts = sshd_lib.write_known_hosts(workdir / "known_hosts", [(s.ip, s.port, host_key) for s in servers])
    return servers, client_key, known_hosts


def poll_request(shard_dir: Path, state: dict) -> dict:
    return {
        "op": "poll",
        "gpu": "off",
        "metrics_urls": [],
        "metrics_timeout_s": 1.0,
        "shards": {
            "globs": [str(shard_dir / "*.jsonl")],
            "state": state,
            "budget_bytes": 1 << 28,
            "finish_reason_path": None,
            "completion_tokens_path": None,
        },
    }


def one_shot(transport: SSHTransport, request: dict, timeout_s: float = 30.0) -> dict:
    """New exec channel + python start-up + program on an existing connection, per poll."""
    channel = transport._clients[-1].get_transport().open_session(timeout=timeout_s)
    channel.exec_command(shlex.join(launch_argv(transport.node.python)))
    session = AgentSession(ChannelStream(channel), transport.name)
    session.send_program(transport._program or program_frame(), timeout_s)
    reply = session.request(request, timeout_s)
    channel.shutdown_write()
    channel.settimeout(timeout_s)
    # drain both streams before the exit status (paramiko #448)
    while channel.recv(65536) or channel.recv_stderr(65536):
        pass
    channel.recv_exit_status()
    channel.close()
    return reply


def time_rounds(rounds: int, run_round) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        results = run_round()
        times.append((time.perf_counter() - started) * 1000.0)
        failed = {k: v for k, v in results.items() if isinstance(v, Exception)}
        if failed:
            raise SystemExit(f"poll failed: {failed}")
    return times


def bench(count: int, rounds: int, conn_rounds: int, workdir: Path, program: bytes | None) -> list[tuple]:
    servers, client_key, known_hosts = start_nodes(count, workdir)
    shard_dir = workdir / "shards"
    shard_dir.mkdir()
    (shard_dir / "a.jsonl").write_text('{"finish_reason": "stop", "completion_tokens": 7}\n' * 1000)
    configs = {
        f"node-{i}": NodeConfig(
            name=f"node-{i}",
            host=s.ip,
            port=s.port,
            shards=[],
            identity_file=str(client_key),
            known_hosts=str(known_hosts),
            python=sys.executable,
        )
        for i, s in enumerate(servers)
    }
    transports = {name: SSHTransport(cfg, program=program) for name, cfg in configs.items()}
    try:
        first = fan_out(transports, lambda n: poll_request(shard_dir, {}))
        bad = {k: v for k, v in first.items() if isinstance(v, Exception)}
        if bad:
            raise SystemExit(f"first poll failed: {bad}")
        state = {
            path: {"inode": f["inode"], "offset": f["offset"]}
            for path, f in next(iter(first.values())).get("shards", {"files": {}})["files"].items()
        }
        request = poll_request(shard_dir, state)
        rows = {"persistent": time_rounds(rounds, lambda: fan_out(transports, lambda n: request))}
        with ThreadPoolExecutor(max_workers=count) as pool:

            def exec_round():
                futures = {n: pool.submit(one_shot, t, request) for n, t in transports.items()}
                return {n: _result(f) for n, f in futures.items()}

            rows["exec/poll"] = time_rounds(max(3, rounds // 4), exec_round)
        if conn_rounds:

            def conn_round():
                fresh = {n: SSHTransport(cfg, program=program) for n, cfg in configs.items()}
                try:
                    return fan_out(fresh, lambda n: request)
                finally:
                    for t in fresh.values():
                        t.close()

            rows["conn/poll"] = time_rounds(conn_rounds, conn_round)
    finally:
        for t in transports.values():
            t.close()
        for s in servers:
            s.stop()
    base = statistics.median(rows["persistent"])
    return [(count, name, statistics.median(t), _p95(t), statistics.median(t) / base) for name, t in rows.items()]


def _result(future):
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - reported like fan_out does
        return exc


def _p95(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="8", help="comma-separated node counts, e.g. 1,8,32,64")
    parser.add_argument("--rounds", type=int, default=40, help="persistent rounds per count")
    parser.add_argument("--conn-rounds", type=int, default=3, help="new-connection rounds")
    parser.add_argument(
        "--standin", action="store_true", help="use tests/standin_agent.py instead of runhealth/node/agent.py"
    )
    parser.add_argument(
        "--skip-conn-above", type=int, default=32, help="skip the new-connection strategy above this many nodes"
    )
    args = parser.parse_args()
    problem = sshd_lib.missing_tools()
    if problem:
        raise SystemExit(problem)
    program = None
    if args.standin:
        program = program_frame(main_source=(ROOT / "tests" / "standin_agent.py").read_text())
    print(f"{'nodes':>5}  {'strategy':<11} {'median ms':>10} {'p95 ms':>9} {'x persistent':>13}")
    for count in [int(n) for n in args.nodes.split(",")]:
        conn_rounds = args.conn_rounds if count <= args.skip_conn_above else 0
        with tempfile.TemporaryDirectory(prefix="runhealth-bench-") as tmp:
            for row in bench(count, args.rounds, conn_rounds, Path(tmp), program):
                print(f"{row[0]:>5}  {row[1]:<11} {row[2]:>10.1f} {row[3]:>9.1f} {row[4]:>12.1f}x", flush=True)


if __name__ == "__main__":
    main()
