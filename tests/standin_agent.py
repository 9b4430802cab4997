"""A tiny stand-in for the node agent, speaking the same frames (tests only).

Ops: hello, echo (returns the request), sleep (seconds), garbage (the SYNC marker, then raw
non-frame bytes), notjson, huge (announces an oversized frame), schema (wrong schema_version),
fail (ok=false), stderr (writes `n` bytes to stderr first), exit (dies with status 3 after a
stderr line), noise (`n` bytes of text without a marker before its reply, as a login shell's).
"""

import json
import os
import sys
import time

out = sys.stdout.buffer
inp = sys.stdin.buffer
SYNC = b"\x1eRUNHEALTH1\n"  # runhealth/node/wire.py SYNC, written before every reply frame


def send(obj):
    body = json.dumps(obj).encode()
    out.write(b"%s%d\n%s" % (SYNC, len(body), body))  # one write: header and body in one packet
    out.flush()


def serve():
    while True:
        line = inp.readline()
        if not line:
            return
        req = json.loads(inp.read(int(line)))
        op = req.get("op")
        reply = {"schema_version": 1, "ok": True, "op": op, "pid": os.getpid()}
        if op == "echo":
            reply["request"] = req
        elif op == "sleep":
            time.sleep(req.get("seconds", 60))
        elif op == "garbage":
            out.write(SYNC + b"hello, I am not a frame\n")
            out.flush()
            continue
        elif op == "notjson":
            out.write(SYNC + b"11\n<html>oops!")
            out.flush()
            continue
        elif op == "huge":
            out.write(SYNC + b"999999999999\n")
            out.flush()
            continue
        elif op == "schema":
            reply["schema_version"] = 7
        elif op == "fail":
            reply = {"schema_version": 1, "ok": False, "error": "no such shard: /x"}
        elif op == "noise":
            out.write((b"Welcome to the login node\n" * req.get("n", 1000))[: req.get("n", 1000)])
            out.flush()
        elif op == "stderr":
            sys.stderr.write("e" * req.get("n", 1000))
            sys.stderr.flush()
        elif op == "exit":
            sys.stderr.write("standin: fatal \x1b[31mred\x1b[0m error\n")
            sys.stderr.flush()
            os._exit(3)
        send(reply)


serve()
