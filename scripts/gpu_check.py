"""Run the shipped node agent on a machine with real GPUs and set its readings beside nvidia-smi's.

Not a test (CI has no GPU): a check to run by hand on a GPU node, or on a lent GPU machine:

    python3 scripts/gpu_check.py [--load-s 20] [--json OUT.json]

It needs only the standard library, runhealth's source tree and, for the NVML path, the
nvidia-ml-py package of the interpreter that runs it (shipped to the agent as the dashboard does).
It polls the agent three ways, each through the same LocalTransport and program frame a real
run uses:

1. NVML (pynvml shipped along), the GPUs idle;
2. NVML again while a load runs (torch matrix products, if torch is there), so utilisation,
   power, clocks and the process list must move;
3. the nvidia-smi fallback: no pynvml shipped, and the node's own hidden from the agent.

and prints each GPU's fields with nvidia-smi's own query of the same moment, then a verdict per
field, and the energy section: NVML's total-energy counter (nvmlDeviceGetTotalEnergyConsumption,
`energy_mj`) at the idle and the loaded poll, the mean power it implies over the time between
them beside the power draws read at both ends, and what the dashboard would use where the
counter is NOT_SUPPORTED (power x time). Exit status 0 when every NVML reading agrees with nvidia-smi within the stated tolerance.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runhealth.node import agent  # noqa: E402
from runhealth.remote.local import LocalTransport  # noqa: E402
from runhealth.remote.protocol import program_frame  # noqa: E402

SMI_FIELDS = "index,uuid,name,utilization.gpu,memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm"
LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    for _ in range(50):
        b = a @ a
    torch.cuda.synchronize()
"""


def smi_query() -> list[dict]:
    """nvidia-smi's own reading of every GPU, as numbers where it gives numbers."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    rows = []
    for line in out.strip().splitlines():
        vals = [v.strip() for v in line.split(",")]
        row = dict(zip(SMI_FIELDS.split(","), vals, strict=True))
        for k, v in row.items():
            try:
                row[k] = float(v)
            except ValueError:
                pass
        rows.append(row)
    return rows


def without_pynvml() -> bytes:
    """The shipped agent with no pynvml anywhere: none shipped, and the node's own hidden."""
    source = (Path(agent.__file__)).read_text(encoding="utf-8")
    future = "from __future__ import annotations\n"
    assert future in source
    hidden = source.replace(future, future + 'import sys as _sys\n_sys.modules["pynvml"] = None\n', 1)
    return program_frame(include_pynvml=False, main_source=hidden)


def agent_gpus(shard_dir: Path, nvml: bool) -> tuple[dict, float]:
    """One poll of the real agent (a fresh process), its GPU reply and how long the poll took."""
    program = program_frame() if nvml else without_pynvml()
    transport = LocalTransport(python=sys.executable, name="gpu-check", program=program)
    try:
        started = time.perf_counter()
        reply = transport.request(
            {"op": "poll", "shards": {"globs": [str(shard_dir / "*.jsonl")], "state": {}}, "gpu": "auto"}
        )
        took = time.perf_counter() - started
    finally:
        transport.close()
    return reply, took


# agent field, nvidia-smi field, tolerance (absolute), what it is
PAIRS = [
    ("name", "name", None, "name"),
    ("uuid", "uuid", None, "uuid"),
    ("mem_total_mib", "memory.total", 1, "memory total MiB"),
    ("mem_used_mib", "memory.used", 64, "memory used MiB"),
    ("power_limit_w", "power.limit", 1, "power limit W"),
    ("power_w", "power.draw", 60, "power W (moment to moment)"),
    ("temp_c", "temperature.gpu", 3, "temperature C"),
    ("util_pct", "utilization.gpu", 40, "utilisation % (moment to moment)"),
    ("sm_clock_mhz", "clocks.sm", 400, "SM clock MHz (moment to moment)"),
]


def compare(label: str, reply: dict, took_s: float, smi: list[dict]) -> bool:
    gpus = reply.get("gpus", {})
    print(f"\n== {label}: source={gpus.get('source')!r} error={gpus.get('error')!r} poll {took_s * 1000:.0f} ms")
    devices = gpus.get("devices", [])
    if not devices:
        print("   no devices")
        return False
    ok = True
    for dev in devices:
        ref = next((r for r in smi if int(r["index"]) == dev.get("index")), None)
        print(f"   GPU {dev.get('index')}: {json.dumps({k: v for k, v in dev.items() if k != 'processes'})}")
        print(f"   processes: {dev.get('processes')}")
        if ref is None:
            print("   nvidia-smi has no such GPU")
            ok = False
            continue
        for field, smi_field, tol, what in PAIRS:
            got, want = dev.get(field), ref.get(smi_field)
            if tol is None:
                agree = got == want
            else:
                agree = isinstance(got, (int, float)) and isinstance(want, float) and abs(got - want) <= tol
            ok &= agree
            print(f"     {'ok  ' if agree else 'DIFF'} {what:34} agent {got!r:>24}  nvidia-smi {want!r}")
    return ok


def energy_report(first: dict, first_t: float, second: dict, second_t: float) -> bool:
    """The energy counter between two polls: mean W from the counter beside the power readings.
    False only when a counter went backwards without a driver reload (the two polls share one)."""
    print("\n== energy (NVML nvmlDeviceGetTotalEnergyConsumption, mJ since the driver loaded)")
    ok = True
    before = {d.get("index"): d for d in first.get("gpus", {}).get("devices", [])}
    for dev in second.get("gpus", {}).get("devices", []):
        old = before.get(dev.get("index"), {})
        e0, e1 = old.get("energy_mj"), dev.get("energy_mj")
        p0, p1 = old.get("power_w"), dev.get("power_w")
        dt = second_t - first_t
        if e0 is None or e1 is None:
            watts = f"power x time: {(p0 + p1) / 2:.1f} W mean" if p0 is not None and p1 is not None else "no power"
            print(
                f"   GPU {dev.get('index')}: energy counter NOT_SUPPORTED ({e0!r}, {e1!r}); the dashboard uses {watts}"
            )
            continue
        mean_w = (e1 - e0) / 1000 / dt
        ok &= e1 >= e0
        print(
            f"   GPU {dev.get('index')}: {e0} -> {e1} mJ over {dt:.1f} s = {(e1 - e0) / 1000:.1f} J, "
            f"mean {mean_w:.1f} W (power.draw read {p0} W and {p1} W at the two polls)"
        )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-s", type=float, default=20.0, help="seconds of GPU load for the second poll")
    parser.add_argument("--json", type=Path, help="write the three replies here")
    args = parser.parse_args()
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi not found: this is not a GPU machine", file=sys.stderr)
        return 2
    replies = {}
    ok = True
    with tempfile.TemporaryDirectory(prefix="runhealth-gpu-check-") as tmp:
        shard_dir = Path(tmp)
        (shard_dir / "s0.jsonl").write_text(
            "".join(
                json.dumps({"text": "x" * i, "finish_reason": "stop", "completion_tokens": i}) + "\n"
                for i in range(1, 101)
            )
        )
        reply, took = agent_gpus(shard_dir, nvml=True)
        idle_t = time.time()
        ok &= compare("NVML, idle", reply, took, smi_query())
        files = reply.get("shards", {}).get("files", {})
        print(f"   shards in the same poll: {[(Path(p).name, f.get('lines')) for p, f in files.items()]}")
        replies["nvml_idle"] = reply

        load = None
        try:
            import torch  # noqa: F401

            load = subprocess.Popen([sys.executable, "-c", LOAD, str(args.load_s)])
            time.sleep(min(8.0, args.load_s / 2))
        except ImportError:
            print("\n(no torch here: the loaded poll runs on idle GPUs)")
        reply, took = agent_gpus(shard_dir, nvml=True)
        load_t = time.time()
        smi = smi_query()
        ok &= compare("NVML, under load", reply, took, smi)
        ok &= energy_report(replies["nvml_idle"], idle_t, reply, load_t)
        if load is not None:
            procs = [p.get("pid") for d in reply["gpus"]["devices"] for p in (d.get("processes") or [])]
            seen = load.pid in procs
            ok &= seen
            print(f"   load pid {load.pid} in the agent's process list: {seen}")
            load.wait()
        replies["nvml_load"] = reply

        reply, took = agent_gpus(shard_dir, nvml=False)
        ok &= compare("nvidia-smi fallback", reply, took, smi_query()) and reply["gpus"]["source"] == "nvidia-smi"
        # nvidia-smi has no energy field: the fallback says None, and the dashboard integrates power.
        ok &= all(d.get("energy_mj") is None for d in reply["gpus"]["devices"])
        replies["smi_fallback"] = reply
    if args.json:
        args.json.write_text(json.dumps(replies, indent=1))
    print("\nverdict:", "NVML readings agree with nvidia-smi" if ok else "some readings differ (see DIFF)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
