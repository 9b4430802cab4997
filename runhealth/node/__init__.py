"""What is shipped to a GPU node: the agent (agent.py) and its parts scan.py, backfill.py,
gpu.py and wire.py. Standard library only, Python 3.8-compatible, read-only on the node;
remote/protocol.py sends these sources over the pipe (this file is not shipped)."""
