"""The node agent under a real Python 3.8: the program the dashboard ships, run as a node runs it.

Nodes may have only an old python3 (README: 3.8+). ast.parse(feature_version=(3, 8)) in
test_agent.py checks syntax only; a 3.9+ library call (str.removeprefix, math.lcm, ...) or a
3.9+ builtin generic evaluated at run time would still break a 3.8 node. So this suite takes the
program exactly as the protocol assembles it (program_frame: the agent and every part, plus the
dashboard's pynvml), starts it with the protocol's BOOTSTRAP under `python3.8 -I -S` and checks
that its replies equal the same program's under this interpreter, and the shards' known counts.

Where no Python 3.8 exists (RUNHEALTH_PYTHON38, python3.8 on PATH, pyenv's versions folder, the
usual system paths), the suite falls back to vermin's static check of the shipped parts against
3.8 and says so in a warning; it never skips. vermin also runs on every machine, because the run
covers only the branches that these shards reach.
"""

from __future__ import annotations

import collections
import io
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from shardgen import truth_rows, write_shard

from runhealth.node import wire
from runhealth.remote import protocol

PY38_FOLDERS = ["/usr/bin", "/usr/local/bin", "/opt/python/3.8/bin"]
TIMEOUT_S = 120


def _is_python38(candidate: str) -> bool:
    """Whether `candidate` runs and is 3.8 (a pyenv shim for a version not selected exits 127)."""
    try:
        done = subprocess.run(
            [candidate, "-I", "-S", "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == "(3, 8)"


def find_python38() -> str | None:
    """The first working Python 3.8 interpreter found, or None."""
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = [os.environ.get("RUNHEALTH_PYTHON38"), shutil.which("python3.8")]
    candidates += [str(p) for p in sorted(pyenv_root.glob("versions/3.8*/bin/python3.8"), reverse=True)]
    candidates += [f"{folder}/python3.8" for folder in PY38_FOLDERS]
    return next((c for c in candidates if c and _is_python38(c)), None)


def shipped_sources() -> dict[str, str]:
    """{name: source} of everything the program frame carries (the agent's parts and pynvml)."""
    header, body = protocol.program_frame().split(b"\n", 1)
    program = json.loads(body)
    assert int(header) == len(body) and program["main"] and program["modules"]
    return {"runhealth_agent": program["main"], **program["modules"]}


def vermin_violations(paths: list[Path]) -> subprocess.CompletedProcess:
    vermin = shutil.which(
        "vermin", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    if vermin is None:
        pytest.fail(
            "neither a Python 3.8 interpreter nor vermin (the dev extra's) was found: "
            "the agent's 3.8 compatibility is unchecked"
        )
    return subprocess.run(
        [vermin, "--target=3.8-", "--violations", "--no-tips", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def check_with_vermin(folder: Path) -> None:
    paths = []
    for name, source in shipped_sources().items():
        paths.append(folder / f"{name}.py")
        paths[-1].write_text(source, encoding="utf-8")
    done = vermin_violations(paths)
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------------------- shards and requests
def write_shards(folder: Path) -> tuple[list[str], collections.Counter]:
    """Two generated chat shards plus one with awkward lines; returns globs and the true counts."""
    truth: collections.Counter = collections.Counter()
    for i, (n, seed) in enumerate([(1500, 38), (700, 83)]):
        rows = truth_rows(n, seed)
        write_shard(folder / f"part-{i}.jsonl", rows)
        truth.update(rows)
    odd = [
        json.dumps(
            {"text": "héllo ✓ ünïcode", "finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 7}}
        ),
        "{not json at all",
        json.dumps(
            {
                "text": "sglang",
                "meta_info": {
                    "finish_reason": {"type": "length", "length": 4096},
                    "prompt_tokens": 9,
                    "completion_tokens": 4096,
                },
            }
        ),
    ]
    with open(folder / "odd.jsonl", "w", encoding="utf-8") as f:
        f.write("\n".join(odd) + "\n" + '{"text": "a writer mid-li')  # the last line is not complete yet
    truth.update([(7, "stop"), (4096, "length")])
    return [str(folder / "part-*.jsonl"), str(folder / "odd.jsonl"), str(folder / "absent-*.jsonl")], truth


def requests(globs: list[str]) -> list[dict]:
    poll = {"op": "poll", "shards": {"globs": globs, "scan_workers": 1}, "gpu": "auto"}
    return [
        {"op": "hello"},
        poll,
        {"op": "sample", "globs": globs, "n": 25, "seed": 7},
        {"op": "sample", "globs": globs, "n": 5, "seed": 8, "finish_reason": "length"},
        {"op": "poll", "shards": {"globs": globs}, "gpu": "demo", "demo_gpus": 3},
    ]


def run_program(python: str, reqs: list[dict], cwd: Path) -> list[dict]:
    """Start BOOTSTRAP as a node would (isolated, no site), send the program and `reqs`."""
    stdin = protocol.program_frame() + b"".join(protocol.encode_frame(r) for r in reqs)
    argv = [python, "-I", "-S", "-u", "-c", protocol.BOOTSTRAP]
    done = subprocess.run(argv, input=stdin, capture_output=True, timeout=TIMEOUT_S, cwd=cwd)
    assert done.returncode == 0 and not done.stderr, done.stderr.decode(errors="replace")
    out, replies = io.BytesIO(done.stdout), []
    for _ in reqs:
        assert out.read(len(wire.SYNC)) == wire.SYNC  # the agent's own stdout is frames only
        replies.append(wire.read_frame(out))
    assert out.read() == b""  # one reply per request, nothing else on stdout
    return replies


def comparable(reply: dict) -> dict:
    """A reply less what differs between two runs of the same program (times, pid, version)."""
    drop = {"time_unix", "agent_ms", "pid", "python", "loadavg", "host", "gpus", "disk"}
    out = {k: v for k, v in reply.items() if k not in drop}
    if "shards" in out:
        out["shards"] = {k: v for k, v in out["shards"].items() if k not in ("scan_s", "walk_s")}
    return out


def gpu_view(poll: dict) -> tuple:
    gpus = poll["gpus"]
    return gpus["source"], gpus["error"], gpus["simulated"], len(gpus["devices"])


def counts_of(poll: dict) -> collections.Counter:
    seen: collections.Counter = collections.Counter()
    for entry in poll["shards"]["files"].values():
        for tokens, finish, _estimated, n in entry["counts"]:
            seen[(tokens, finish)] += n
    return seen


# ---------------------------------------------------------------------------- the tests
def test_shipped_agent_under_python_3_8_equals_this_interpreter(tmp_path):
    py38 = find_python38()
    if py38 is None:
        warnings.warn(
            "no Python 3.8 interpreter found: checked the shipped agent with vermin --target=3.8 only", stacklevel=1
        )
        check_with_vermin(tmp_path)
        return
    globs, truth = write_shards(tmp_path)
    old = run_program(py38, requests(globs), tmp_path)
    new = run_program(sys.executable, requests(globs), tmp_path)
    assert all(r["ok"] for r in old), [r.get("error") for r in old]
    assert old[0]["python"].startswith("3.8.") and new[0]["python"] != old[0]["python"]
    poll = old[1]
    assert counts_of(poll) == truth and poll["shards"]["matched"] == 3
    assert poll["shards"]["unmatched_globs"] == [globs[2]]
    # The shipped pynvml is imported under 3.8 too: same source (or the same NVML error) as here.
    assert gpu_view(poll) == gpu_view(new[1]) and (poll["gpus"]["source"] or "NVML" in poll["gpus"]["error"])
    assert len(old[4]["gpus"]["devices"]) == 3 and old[4]["gpus"]["simulated"]
    assert len(old[2]["samples"]) == 25 and old[2]["population"] == sum(truth.values()) + 1  # + the bad line
    assert [comparable(r) for r in old] == [comparable(r) for r in new]


def test_shipped_parts_use_nothing_newer_than_python_3_8(tmp_path):
    """vermin over every shipped source, on every machine; the control file shows it can fail."""
    check_with_vermin(tmp_path)
    control = tmp_path / "control.py"
    control.write_text('print("runhealth-x".removeprefix("runhealth-"))\n')  # str.removeprefix: 3.9
    done = vermin_violations([control])
    assert done.returncode != 0 and "removeprefix" in done.stdout, done.stdout
