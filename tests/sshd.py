"""Real OpenSSH sshd processes on loopback, for the transport tests and bench/poll.py.

Each `Sshd` is ``/usr/sbin/sshd -D -e -f /dev/null -o ...`` on its own 127.0.0.x address and a
free port, logging to a file (not a pipe, which could fill and stall it). The caller provides
the host key and the authorized_keys file; `write_known_hosts` produces the matching
known_hosts. Nothing here imports pytest, so the benchmark can reuse it.
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

SSHD = "/usr/sbin/sshd"
INSTALL_HINT = "install openssh-server: apt-get install -y openssh-server"
# Called with each started sshd's pid: tests/conftest.py adds leakcheck.track, since sshd's
# setproctitle hides the environment that says which test session started it.
ON_START: list[Callable[[int], None]] = []


def missing_tools() -> str | None:
    """None when sshd and ssh-keygen exist, else the message saying how to install them."""
    if not os.path.exists(SSHD) or not _which("ssh-keygen"):
        return f"{SSHD} or ssh-keygen not found; {INSTALL_HINT}"
    return None


def _which(name: str) -> bool:
    return any(os.access(os.path.join(d, name), os.X_OK) for d in os.environ.get("PATH", "/usr/bin").split(os.pathsep))


def keygen(path: Path, passphrase: str = "", comment: str = "runhealth-test") -> Path:
    """Create an ed25519 key pair at `path` (and `path`.pub); return `path`."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return path


def free_port(ip: str) -> int:
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return sock.getsockname()[1]


def write_known_hosts(path: Path, entries: list[tuple[str, int, Path]]) -> Path:
    """known_hosts with one ``[ip]:port <pubkey>`` line per (ip, port, host_key_path)."""
    lines = []
    for ip, port, host_key in entries:
        key_type, key_b64 = Path(f"{host_key}.pub").read_text().split()[:2]
        lines.append(f"[{ip}]:{port} {key_type} {key_b64}\n")
    path.write_text("".join(lines))
    return path


class Sshd:
    """One sshd on `ip`; `start()` returns once it accepts TCP and sends its banner."""

    def __init__(
        self,
        ip: str,
        host_key: Path,
        authorized_keys: Path,
        workdir: Path,
        port: int | None = None,
        extra_options: dict[str, str] | None = None,
    ):
        self.ip, self.host_key, self.authorized_keys = ip, host_key, authorized_keys
        self.port = port or free_port(ip)
        self.log_path = workdir / f"sshd-{ip}-{self.port}.log"
        self.extra_options = extra_options or {}
        self.proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        options = {
            "ListenAddress": self.ip,
            "Port": str(self.port),
            "HostKey": str(self.host_key),
            "AuthorizedKeysFile": str(self.authorized_keys),
            "PidFile": "none",
            "StrictModes": "no",
            "UsePAM": "no",
            "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no",
            "PubkeyAuthentication": "yes",
            "LogLevel": "ERROR",
            "MaxStartups": "200",
            "MaxSessions": "50",
            "PermitRootLogin": "yes" if getpass.getuser() == "root" else "no",
            **self.extra_options,
        }
        argv = [SSHD, "-D", "-e", "-f", "/dev/null"]
        for key, value in options.items():
            argv += ["-o", f"{key}={value}"]
        return argv

    def start(self, timeout_s: float = 10.0) -> Sshd:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege-separation chroot
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        for hook in ON_START:
            hook(self.proc.pid)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sshd on {self.ip}:{self.port} exited with status {self.proc.returncode}:\n{self.log_text()}"
                )
            if self._banner_ok():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"sshd on {self.ip}:{self.port} sent no banner within {timeout_s} s:\n{self.log_text()}")

    def _banner_ok(self) -> bool:
        try:
            with socket.create_connection((self.ip, self.port), timeout=1.0) as sock:
                return sock.recv(64).startswith(b"SSH-")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"
