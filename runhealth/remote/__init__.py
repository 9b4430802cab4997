"""The dashboard's side of the agent link, one module per job.

protocol.py  bootstrap, program frame, AgentSession (framing from runhealth/node/wire.py)
base.py      Transport (lazy start, restart, backoff), fan_out / fan_out_calls, Tail, sanitize
local.py     LocalTransport: the agent as a subprocess
ssh.py       SSHTransport: the agent over one persistent paramiko connection

`make_transport(node)` picks the subclass for a node.
"""

from __future__ import annotations

import sys
from typing import Any

from runhealth.remote.base import Transport
from runhealth.remote.local import LocalTransport
from runhealth.settings.config import NodeConfig


def make_transport(node: NodeConfig, **kwargs: Any) -> Transport:
    """LocalTransport for ``host = "local"``, SSHTransport otherwise.

    A local node runs the dashboard's own interpreter unless its python is set to something
    other than the default "python3".
    """
    if node.host == "local":
        python = node.python if node.python not in (None, "python3") else sys.executable
        return LocalTransport(
            python, name=node.name, command_timeout_s=node.command_timeout_s, program=kwargs.get("program")
        )
    from runhealth.remote.ssh import SSHTransport  # paramiko is loaded only for SSH nodes

    return SSHTransport(node, **kwargs)
