"""SSH transport: the node's agent over one persistent paramiko connection.

One ``exec`` channel per node, kept open across polls, so a poll costs a round trip instead of
a login, a channel and a Python start-up. The socket is ours (TCP_NODELAY set; paramiko does
not), `~/.ssh/config` is honoured (HostName, Port, User, IdentityFile, ProxyCommand, ProxyJump
via a ``direct-tcpip`` channel), and host keys are verified against known_hosts: an unknown key
is refused unless the node opts in to accept-and-record, and a changed key is always refused.
"""

from __future__ import annotations

import getpass
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import paramiko

from runhealth import textsafe
from runhealth.errors import (
    AuthError,
    ConfigError,
    ConnectError,
    HostKeyError,
    RunhealthError,
    TransportError,
)
from runhealth.remote.base import POLL_SLICE_S, Tail, Transport, sanitize
from runhealth.remote.protocol import AgentSession, launch_argv
from runhealth.settings.config import NodeConfig, reveal

log = textsafe.get_logger(__name__)

_SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
_TRACEBACK_HEADS = (
    "Traceback (most recent call last)",
    "During handling of the above exception",
    "The above exception was the direct cause",
)


class _ParamikoToOurs(logging.Handler):
    """paramiko's log, one line per event on our logger.

    paramiko logs a failed handshake (a silent node, every poll) as "Exception (client): ..."
    followed by the full traceback, one record per line; without a handler of ours those reach
    stderr through logging's last resort. The traceback lines are dropped here: blank or
    indented ones, their headers, and the exception line that follows an indented one.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._state = threading.local()  # per transport thread: was the last line indented?

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        after_indent = getattr(self._state, "indented", False)
        self._state.indented = text[:1].isspace()
        if not text.strip() or self._state.indented or after_indent or text.startswith(_TRACEBACK_HEADS):
            return
        log.warning("%s: %s", record.name, text)


def _route_paramiko_logs() -> None:
    plog = logging.getLogger("paramiko")
    if not any(isinstance(h, _ParamikoToOurs) for h in plog.handlers):
        plog.addHandler(_ParamikoToOurs())
        plog.propagate = False
        if plog.level == logging.NOTSET:
            plog.setLevel(logging.WARNING)  # its DEBUG/INFO chatter is not made, then dropped


_route_paramiko_logs()


class ChannelStream:
    """An SSH exec channel as a deadline-aware `ByteStream`; stderr drained, kept bounded.

    Reads wake every quarter second to drain stderr: stdout and stderr share the channel's
    flow-control window, so unread stderr would eventually stall the remote agent.
    """

    def __init__(self, channel: paramiko.Channel):
        self.channel = channel
        self.stderr = Tail()

    def _drain_stderr(self) -> None:
        while self.channel.recv_stderr_ready():
            self.stderr.add(self.channel.recv_stderr(65536))

    def _slice(self, deadline: float) -> None:
        self._drain_stderr()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self.channel.settimeout(min(remaining, POLL_SLICE_S))

    def write(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            self._slice(deadline)
            try:
                sent = self.channel.send(bytes(view[: 1 << 18]))
            except TimeoutError:
                continue
            if sent == 0:
                raise BrokenPipeError("channel closed")
            view = view[sent:]

    def read(self, max_bytes: int, deadline: float) -> bytes:
        while True:
            self._slice(deadline)
            try:
                return self.channel.recv(max_bytes)
            except TimeoutError:
                continue

    def eof_detail(self) -> str:
        # Drain stderr before asking for the exit status (paramiko #448).
        self.channel.settimeout(1.0)
        try:
            for chunk in iter(lambda: self.channel.recv_stderr(65536), b""):
                self.stderr.add(chunk)
        except TimeoutError:
            pass
        status = self.channel.recv_exit_status() if self.channel.status_event.wait(1.0) else None
        return f"exit status {status}; stderr: {self.stderr.text()}"


def _send_signal(channel: paramiko.Channel, name: str) -> None:
    """RFC 4254 "signal" request; sshd (OpenSSH >= 7.9) killpg()s the session's processes.

    paramiko has no public call for it, so this builds the message the way Channel's own
    requests do. Best effort: servers that refuse it still close the channel.
    """
    try:
        message = paramiko.Message()
        message.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
        message.add_int(channel.remote_chanid)
        message.add_string("signal")
        message.add_boolean(False)
        message.add_string(name)
        channel.transport._send_user_message(message)  # noqa: SLF001 - paramiko's own requests send this way
    except Exception:  # noqa: BLE001 - the channel may already be gone
        log.debug("could not send signal %s", name, exc_info=True)


class _RejectUnknownHostKey(paramiko.MissingHostKeyPolicy):
    def __init__(self, node_name: str, known_hosts: str):
        self.node_name, self.known_hosts = node_name, known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostKeyError(
            f"host key for {self.node_name} ({hostname}, {key.get_name()} {key.fingerprint}) "
            f"is not in known_hosts ({self.known_hosts}); set accept_new_host_key = true for "
            "that node to trust it on first use"
        )


class _AcceptNewHostKey(paramiko.MissingHostKeyPolicy):
    """Trust on first use, like ``StrictHostKeyChecking=accept-new``: add AND save the key."""

    _file_lock = threading.Lock()  # nodes often share one known_hosts file

    def __init__(self, node_name: str, known_hosts: str):
        self.node_name, self.known_hosts = node_name, known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with self._file_lock:
            os.makedirs(os.path.dirname(self.known_hosts) or ".", mode=0o700, exist_ok=True)
            with open(self.known_hosts, "a+b") as fh:
                fh.seek(0, os.SEEK_END)
                if fh.tell() > 0:
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":
                        line = "\n" + line
                fh.write(line.encode("ascii"))
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning(
            "%s: trusted new host key %s %s for %s; saved to %s",
            self.node_name,
            key.get_name(),
            key.fingerprint,
            hostname,
            self.known_hosts,
        )


class _Hop:
    """One SSH endpoint after ~/.ssh/config resolution."""

    def __init__(
        self,
        alias: str,
        hostname: str,
        port: int,
        user: str,
        identity_files: list[str],
        proxy_command: str | None,
        proxy_jump: str | None,
    ):
        self.alias, self.hostname, self.port, self.user = alias, hostname, port, user
        self.identity_files = identity_files
        self.proxy_command, self.proxy_jump = proxy_command, proxy_jump

    @property
    def known_hosts_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.hostname}:{self.port}"


def _split_jump(spec: str) -> tuple[str | None, str, int | None]:
    """``[ssh://][user@]host[:port]`` -> (user, host, port)."""
    spec = spec.strip().removeprefix("ssh://")
    user, _, hostport = spec.rpartition("@")
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest.removeprefix(":") or None
    else:
        host, _, port = hostport.partition(":")
    return user or None, host, int(port) if port else None


def _tcp_connect(hop: _Hop, timeout_s: float) -> socket.socket:
    """TCP with TCP_NODELAY: paramiko leaves Nagle on, which costs ~40 ms per round trip."""
    try:
        sock = socket.create_connection((hop.hostname, hop.port), timeout=timeout_s)
    except socket.gaierror:
        raise ConnectError(f"DNS lookup failed for {hop.hostname}") from None
    except ConnectionRefusedError:
        raise ConnectError(f"connection refused by {hop}") from None
    except TimeoutError:
        raise ConnectError(f"connecting to {hop} timed out after {timeout_s:g} s") from None
    except OSError as exc:
        raise ConnectError(f"cannot reach {hop}: {exc.strerror or exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class SSHTransport(Transport):
    """The agent over one persistent SSH connection (paramiko) to a node.

    Args:
        node: a NodeConfig (name, host, port, user, identity_file, known_hosts,
            accept_new_host_key, python, connect_timeout_s, command_timeout_s, passphrase,
            password). ``host`` may be a ~/.ssh/config alias (HostName, Port, User,
            IdentityFile, ProxyCommand, ProxyJump, UserKnownHostsFile are honoured; node
            fields win). Jump hosts use their own IdentityFile, else the node's.
        ssh_config_path: the ssh config to read instead of ~/.ssh/config.
        program: the program frame to send instead of runhealth/node/agent.py's (tests).
    """

    def __init__(self, node: NodeConfig, ssh_config_path: str | None = None, program: bytes | None = None):
        super().__init__(node.name, node.command_timeout_s, node.connect_timeout_s, program)
        self.node = node
        self.command = shlex.join(launch_argv(node.python))
        self._ssh_config_path = ssh_config_path or os.path.expanduser("~/.ssh/config")
        self._clients: list[paramiko.SSHClient] = []  # jump hosts first, the node last
        self._stream: ChannelStream | None = None

    @property
    def channel(self) -> paramiko.Channel | None:
        """The exec channel the agent runs on, while it runs."""
        return self._stream.channel if self._stream else None

    def _start(self) -> AgentSession:
        client = self._clients[-1] if self._clients else None
        ssh = client.get_transport() if client else None
        channel = None
        if ssh is not None and ssh.is_active():
            try:
                channel = ssh.open_session(timeout=self.connect_timeout_s)
            except (paramiko.SSHException, OSError, EOFError):
                log.info("%s: SSH connection went stale; reconnecting", self.name)
        if channel is None:
            self._close_connection()
            self._clients = self._connect()
            ssh = self._clients[-1].get_transport()
            try:
                channel = ssh.open_session(timeout=self.connect_timeout_s)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise TransportError(f"{self.name}: cannot open an SSH session: {sanitize(str(exc), 200)}") from None
        try:
            channel.exec_command(self.command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            channel.close()
            raise TransportError(f"{self.name}: cannot start the agent: {sanitize(str(exc), 200)}") from None
        self._stream = ChannelStream(channel)
        return AgentSession(self._stream, self.name)

    def _stop_agent(self) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            return
        if not stream.channel.exit_status_ready():
            _send_signal(stream.channel, "KILL")  # a hung agent never reads the EOF below
        stream.channel.close()  # a healthy agent sees EOF on stdin and exits

    def _close_connection(self) -> None:
        for client in reversed(self._clients):
            client.close()
        self._clients = []

    # -- resolution ------------------------------------------------------------------

    def _ssh_config(self) -> paramiko.SSHConfig:
        if not os.path.exists(self._ssh_config_path):
            return paramiko.SSHConfig()
        try:
            return paramiko.SSHConfig.from_path(self._ssh_config_path)
        except (OSError, paramiko.ConfigParseError) as exc:
            raise ConfigError(f"cannot read ssh config {self._ssh_config_path}: {exc}") from None

    def _hops(self) -> list[_Hop]:
        """Jump hosts (if any) then the node, each resolved through the ssh config."""
        config = self._ssh_config()
        node = self.node
        target = self._resolve(config, node.host, node.user, node.port, node.identity_file)
        hops = []
        if target.proxy_jump and not target.proxy_command:
            for spec in target.proxy_jump.split(","):
                user, host, port = _split_jump(spec)
                hops.append(self._resolve(config, host, user, port, None))
        return hops + [target]

    def _resolve(
        self, config: paramiko.SSHConfig, alias: str, user: str | None, port: int | None, identity: str | None
    ) -> _Hop:
        entry = config.lookup(alias)
        files = [identity] if identity else entry.get("identityfile", [])
        if not files and self.node.identity_file:
            files = [self.node.identity_file]  # a jump host without its own IdentityFile
        proxy_command = entry.get("proxycommand")
        proxy_jump = entry.get("proxyjump")
        return _Hop(
            alias,
            entry.get("hostname", alias),
            int(port or entry.get("port", 22)),
            user or entry.get("user") or getpass.getuser(),
            [os.path.expanduser(f) for f in files],
            None if (proxy_command or "none").lower() == "none" else proxy_command,
            None if (proxy_jump or "none").lower() == "none" else proxy_jump,
        )

    def _known_hosts_path(self) -> str:
        if self.node.known_hosts:
            return os.path.expanduser(self.node.known_hosts)
        entry = self._ssh_config().lookup(self.node.host).get("userknownhostsfile")
        first = entry.split()[0] if entry else "~/.ssh/known_hosts"
        return os.path.expanduser(first)

    # -- connecting --------------------------------------------------------------------

    def _connect(self) -> list[paramiko.SSHClient]:
        clients: list[paramiko.SSHClient] = []
        known_hosts = self._known_hosts_path()
        try:
            for hop in self._hops():
                sock = self._open_socket(hop, clients[-1] if clients else None)
                clients.append(self._login(hop, sock, known_hosts))
        except BaseException:
            for client in reversed(clients):
                client.close()
            raise
        log.info("%s: connected to %s as %s", self.name, hop, hop.user)
        return clients

    def _open_socket(
        self, hop: _Hop, via: paramiko.SSHClient | None
    ) -> paramiko.Channel | paramiko.ProxyCommand | socket.socket:
        """A socket-like link to `hop`: through the previous jump host, a ProxyCommand, or TCP."""
        if via is not None:
            return self._translate(
                hop,
                lambda: via.get_transport().open_channel(
                    "direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0), timeout=self.connect_timeout_s
                ),
                via=via,
            )
        if hop.proxy_command:
            try:
                return paramiko.ProxyCommand(hop.proxy_command)
            except OSError as exc:
                raise ConnectError(f"ProxyCommand for {hop.alias} could not start: {exc.strerror or exc}") from None
        return _tcp_connect(hop, self.connect_timeout_s)

    def _login(
        self, hop: _Hop, sock: paramiko.Channel | paramiko.ProxyCommand | socket.socket, known_hosts: str
    ) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if os.path.exists(known_hosts):
            client.load_host_keys(known_hosts)
        if os.path.exists(_SYSTEM_KNOWN_HOSTS):
            client.load_system_host_keys(_SYSTEM_KNOWN_HOSTS)
        policy = _AcceptNewHostKey if self.node.accept_new_host_key else _RejectUnknownHostKey
        client.set_missing_host_key_policy(policy(self.name, known_hosts))
        key_file = next((f for f in hop.identity_files if os.path.exists(f)), None)
        explicit = self.node.identity_file and os.path.expanduser(self.node.identity_file)
        if key_file is None and explicit and hop.identity_files == [explicit]:
            raise AuthError(f"identity file not found: {hop.identity_files[0]}")
        pkey = self._load_key(key_file) if key_file else None
        timeout_s = self.connect_timeout_s
        try:
            self._translate(
                hop,
                lambda: client.connect(
                    hop.hostname,
                    hop.port,
                    username=hop.user,
                    pkey=pkey,
                    password=reveal(self.node.password),
                    passphrase=reveal(self.node.passphrase),
                    # the handshake gets twice the banner's deadline, so a silent server is
                    # reported as "no banner" rather than as a vague negotiation failure
                    timeout=2 * timeout_s,
                    banner_timeout=timeout_s,
                    auth_timeout=timeout_s,
                    channel_timeout=timeout_s,
                    sock=sock,
                    allow_agent=True,
                    look_for_keys=pkey is None,
                ),
                known_hosts=known_hosts,
                pkey_file=key_file,
            )
        except BaseException:
            client.close()
            raise
        client.get_transport().set_keepalive(15)
        return client

    def _load_key(self, path: str) -> paramiko.PKey:
        passphrase = reveal(self.node.passphrase)
        try:
            try:
                return paramiko.PKey.from_path(path, passphrase.encode() if passphrase else None)
            except TypeError:  # cryptography: a passphrase for a plain key, or none for an encrypted one
                if not passphrase:
                    raise
            # The key is not encrypted: ssh ignores an unused passphrase, and so do we.
            log.info("%s: private key %s is not encrypted; its configured passphrase is not used", self.name, path)
            return paramiko.PKey.from_path(path)
        except OSError as exc:
            raise AuthError(f"cannot read private key {path}: {exc.strerror}") from None
        except TypeError:
            raise AuthError(
                f"private key {path} is encrypted; set its passphrase in the secrets for node {self.name}"
            ) from None
        except (ValueError, paramiko.SSHException):
            raise AuthError(f"cannot load private key {path}: wrong passphrase or unsupported key format") from None

    def _translate(
        self,
        hop: _Hop,
        step: Callable[[], Any],
        via: paramiko.SSHClient | None = None,
        known_hosts: str = "",
        pkey_file: str | None = None,
    ) -> Any:
        """Run one paramiko step, turning its exceptions into one-line runhealth errors."""
        try:
            return step()
        except RunhealthError:
            raise
        except paramiko.BadHostKeyException:
            raise HostKeyError(
                f"host key for {self.name} ({hop.hostname}) CHANGED — refusing; if the node was "
                "reinstalled, remove its old key with: ssh-keygen -R "
                f"{shlex.quote(hop.known_hosts_name)} -f {shlex.quote(known_hosts)}"
            ) from None
        except paramiko.AuthenticationException:
            raise AuthError(
                f"authentication failed for {hop.user}@{hop.hostname} (tried: {self._tried(pkey_file)})"
            ) from None
        except paramiko.ChannelException as exc:
            where = f"jump host {via.get_transport().getpeername()[0]}" if via else self.name
            raise ConnectError(f"{where} could not open a connection to {hop}: {exc.text}") from None
        except paramiko.ProxyCommandFailure as exc:
            raise ConnectError(f"ProxyCommand for {hop.alias} failed: {exc.error}") from None
        except paramiko.SSHException as exc:
            text = str(exc)
            if "banner" in text.lower():
                raise ConnectError(
                    f"no SSH banner from {hop} within {self.connect_timeout_s:g} s (is sshd running there?)"
                ) from None
            if "No existing session" in text:
                text = f"no answer within {2 * self.connect_timeout_s:g} s"
            raise ConnectError(f"SSH handshake with {hop} failed: {sanitize(text, 200)}") from None
        except (TimeoutError, EOFError, OSError) as exc:
            what = "timed out" if isinstance(exc, TimeoutError) else "was cut"
            raise ConnectError(f"SSH connection to {hop} {what} during the handshake") from None

    def _tried(self, pkey_file: str | None) -> str:
        tried = [f"key file {pkey_file}"] if pkey_file else ["default keys ~/.ssh/id_*"]
        if os.environ.get("SSH_AUTH_SOCK"):
            tried.append("ssh-agent")
        if self.node.password:
            tried.append("password")
        return ", ".join(tried)
