"""The agent's GPU layer against a pynvml stand-in (tests/fake_pynvml.py) and nvidia-smi text.

These tests pin the layer to pynvml's documented names, constants and error classes and to
nvidia-smi's CSV output; scripts/gpu_check.py checks the same layer against a live driver
(run by hand on a GPU machine: CI has none; docs/gpu-check-h200.txt is one such run).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import fake_pynvml
import pytest

from runhealth.node import agent, wire
from runhealth.node import gpu as agent_gpu

HERE = Path(__file__).parent
# design.md section 1, verbatim: the one-liner the dashboard runs on the node.
BOOTSTRAP = (
    "import sys,json;i=sys.stdin.buffer;n=int(i.readline());p=json.loads(i.read(n));"
    "g={'__name__':'runhealth_agent','__modules__':p.get('modules',{})};"
    "exec(compile(p['main'],'runhealth_agent','exec'),g)"
)
GPU = dict(fake_pynvml.H200)


@pytest.fixture
def nvml(monkeypatch):
    """A fresh NVML state with the stand-in installed as `pynvml`."""
    monkeypatch.setattr(agent_gpu, "NVML", agent_gpu._Nvml())
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    fake_pynvml.configure([dict(GPU, uuid="GPU-0"), dict(GPU, uuid="GPU-1", util=12)])
    return fake_pynvml


def test_two_healthy_gpus(nvml):
    gpus = agent.read_gpus("auto")
    assert (gpus["source"], gpus["error"], gpus["simulated"]) == ("nvml", None, False)
    first, second = gpus["devices"]
    assert first == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-0",
        "util_pct": 97,
        "mem_used_mib": 120000,
        "mem_total_mib": 143771,
        "power_w": 650.21,
        "power_limit_w": 700.0,
        "energy_mj": 8_123_456_789,
        "temp_c": 61,
        "sm_clock_mhz": 1980,
        "throttle_reasons": ["sw_power_cap"],
        "processes": [{"pid": 4321, "name": agent_gpu._proc_name(4321), "mem_used_mib": 119000}],
        "health": {
            "ecc_uncorrected_volatile": 0,
            "ecc_uncorrected_aggregate": 0,
            "remapped_rows_pending": False,
            "row_remap_failure": False,
            "pcie_replay": 0,
            "xid": [],
        },
        "error": None,
    }
    assert second["util_pct"] == 12 and second["uuid"] == "GPU-1"


def test_what_predicts_a_gpu_falling_out_is_read_and_unsupported_is_absent(nvml):
    """A100/H100-class GPU with uncorrected ECC errors and a pending row remap; a consumer GPU
    with no ECC, no remapping and no PCIe counter: those keys are simply absent."""
    nvml.configure(
        [
            dict(GPU, uuid="GPU-0", ecc_volatile=2, ecc_aggregate=5, remapped=(0, 1, 1, 0), pcie_replay=37),
            dict(
                GPU,
                uuid="GPU-1",
                ecc_volatile=nvml.NOT_SUPPORTED,
                ecc_aggregate=nvml.NOT_SUPPORTED,
                remapped=nvml.NOT_SUPPORTED,
                pcie_replay=nvml.NOT_SUPPORTED,
                retired_pending=1,
            ),
        ]
    )
    first, second = agent.read_gpus("auto")["devices"]
    assert first["health"] == {
        "ecc_uncorrected_volatile": 2,
        "ecc_uncorrected_aggregate": 5,
        "remapped_rows_pending": True,
        "row_remap_failure": False,
        "pcie_replay": 37,
        "xid": [],
    }
    assert second["health"] == {"retired_pages_pending": True, "xid": []}


def test_xid_events_since_the_last_poll_from_the_set_kept_open(nvml):
    agent.read_gpus("auto")  # the first poll opens the event set and registers each GPU
    nvml.raise_xid(1, 79)  # "GPU has fallen off the bus"
    nvml.raise_xid(1, 48)  # double-bit ECC error
    first, second = agent.read_gpus("auto")["devices"]
    assert second["health"]["xid"] == [79, 48] and first["health"]["xid"] == []
    assert agent.read_gpus("auto")["devices"][1]["health"]["xid"] == []  # drained: reported once
    assert len(nvml._event_sets) == 1  # kept open, not one set per poll


def test_a_driver_without_events_leaves_xid_absent(nvml):
    nvml.configure([dict(GPU, uuid="GPU-0")], missing={"nvmlEventSetCreate"})
    (dev,) = agent.read_gpus("auto")["devices"]
    assert "xid" not in dev["health"] and dev["error"] is None
    assert "nvmlEventSetCreate" in agent_gpu.NVML.missing


def test_nvml_is_initialised_once_per_process(nvml):
    for _ in range(3):
        agent.read_gpus("auto")
    assert nvml.init_calls == 1


def test_power_reading_not_supported_is_none(nvml):
    nvml.configure([dict(GPU, uuid="GPU-0", power_mw=nvml.NOT_SUPPORTED)])
    (dev,) = agent.read_gpus("auto")["devices"]
    assert dev["power_w"] is None and dev["power_limit_w"] == 700.0 and dev["error"] is None


def test_old_driver_missing_functions_gives_none_fields(nvml, monkeypatch):
    # The driver lacks the newer "event reasons" symbol and the process query ...
    nvml.configure(
        [dict(GPU, uuid="GPU-0")],
        missing={"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetComputeRunningProcesses"},
    )
    # ... and this pynvml is so old it has no temperature function at all.
    monkeypatch.delattr(nvml, "nvmlDeviceGetTemperature")
    (dev,) = agent.read_gpus("auto")["devices"]
    assert dev["throttle_reasons"] == ["sw_power_cap"]  # fell back to the older name
    assert dev["processes"] is None and dev["temp_c"] is None and dev["error"] is None
    assert set(agent_gpu.NVML.missing) == {
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetTemperature",
    }
    agent.read_gpus("auto")
    assert len(agent_gpu.NVML.missing) == 3  # noted once, not once per poll


def test_memory_used_leaves_out_the_drivers_reserved_memory_as_nvidia_smi_does(nvml, monkeypatch):
    """Found on a real H200 (scripts/gpu_check.py): NVML v1's "used" counts the driver's reserved
    memory (615 MiB idle), nvidia-smi's memory.used does not; v2 separates it."""
    (dev,) = agent.read_gpus("auto")["devices"][:1]
    assert dev["mem_used_mib"] == 120000 and dev["mem_total_mib"] == 143771
    # A driver without nvmlDeviceGetMemoryInfo_v2: v1, reserved included, and nothing noted missing.
    monkeypatch.setattr(agent_gpu, "NVML", agent_gpu._Nvml())
    nvml.configure([dict(GPU, uuid="GPU-0")], missing={"nvmlDeviceGetMemoryInfo_v2"})
    (dev,) = agent.read_gpus("auto")["devices"]
    assert dev["mem_used_mib"] == 120615 and dev["error"] is None and agent_gpu.NVML.missing == []
    # A pynvml from before the v2 struct.
    monkeypatch.setattr(agent_gpu, "NVML", agent_gpu._Nvml())
    monkeypatch.delattr(nvml, "nvmlMemory_v2")
    nvml.configure([dict(GPU, uuid="GPU-0")])
    (dev,) = agent.read_gpus("auto")["devices"]
    assert dev["mem_used_mib"] == 120615


def test_one_gpu_lost_the_other_still_reports(nvml):
    nvml.configure([dict(GPU, uuid="GPU-0", lost=True), dict(GPU, uuid="GPU-1")])
    lost, ok = agent.read_gpus("auto")["devices"]
    assert lost == {"index": 0, "error": "GPU is lost"}
    assert ok["uuid"] == "GPU-1" and ok["error"] is None


def test_gpu_lost_in_the_middle_of_a_query(nvml):
    nvml.configure([dict(GPU, uuid="GPU-0", temp=nvml.LOST), dict(GPU, uuid="GPU-1")])
    lost, ok = agent.read_gpus("auto")["devices"]
    assert lost == {"index": 0, "error": "GPU is lost"} and ok["temp_c"] == 61


def test_error_classes_mirror_pynvml():
    err = fake_pynvml.NVMLError(fake_pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert type(err) is fake_pynvml.NVMLError_NotSupported and str(err) == "Not Supported"
    assert isinstance(fake_pynvml.NVMLError_GpuIsLost(), fake_pynvml.NVMLError)
    real = pytest.importorskip("pynvml")  # nvidia-ml-py is in requirements-dev.txt
    for name in (
        "NVMLError_NotSupported",
        "NVMLError_FunctionNotFound",
        "NVMLError_GpuIsLost",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetTotalEnergyConsumption",
        "NVML_ERROR_NOT_SUPPORTED",
        "nvmlClocksThrottleReasonSwPowerCap",
        "NVML_TEMPERATURE_GPU",
        "NVML_CLOCK_SM",
    ):
        assert hasattr(real, name) and hasattr(fake_pynvml, name), name
    assert real.NVML_ERROR_GPU_IS_LOST == fake_pynvml.NVML_ERROR_GPU_IS_LOST


# ---------------------------------------------------------------------------- nvidia-smi
SMI_OUTPUT = """\
0, NVIDIA H200, GPU-5b3c8d2e-1f4a-4b6c-9d8e-7f6a5b4c3d2e, 97, 120315, 143771, 651.37, 700.00, 61, 1980
1, NVIDIA H200, GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d, 0, 1, 143771, [N/A], [N/A], 34, 345
2, NVIDIA GeForce GTX 1080 Ti, GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0, [Not Supported], 523, 11264, [Not Supported], [Not Supported], 45, 1733
"""


def test_nvidia_smi_csv_parsing():
    h200, idle, old = agent.parse_smi_csv(SMI_OUTPUT)
    assert h200 == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-5b3c8d2e-1f4a-4b6c-9d8e-7f6a5b4c3d2e",
        "util_pct": 97,
        "mem_used_mib": 120315,
        "mem_total_mib": 143771,
        "power_w": 651.37,
        "power_limit_w": 700.0,
        "energy_mj": None,
        "temp_c": 61,
        "sm_clock_mhz": 1980,
        "throttle_reasons": None,
        "processes": None,
        "error": None,
    }
    assert idle["power_w"] is None and idle["power_limit_w"] is None and idle["util_pct"] == 0
    assert old["util_pct"] is None and old["power_w"] is None and old["name"] == "NVIDIA GeForce GTX 1080 Ti"


def _no_pynvml(monkeypatch):
    monkeypatch.setattr(agent_gpu, "NVML", agent_gpu._Nvml())
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError


def test_falls_back_to_nvidia_smi(monkeypatch, tmp_path):
    _no_pynvml(monkeypatch)
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncat <<'EOF'\n" + SMI_OUTPUT + "EOF\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    gpus = agent.read_gpus("auto")
    assert gpus["source"] == "nvidia-smi" and len(gpus["devices"]) == 3 and gpus["error"] is None


def test_no_telemetry_says_why(monkeypatch, tmp_path):
    _no_pynvml(monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))
    gpus = agent.read_gpus("auto")
    assert gpus["source"] is None and gpus["devices"] == []
    assert gpus["error"].startswith("no GPU telemetry: NVML: ") and "nvidia-smi" in gpus["error"]


def test_bootstrap_registers_the_shipped_pynvml_lazily():
    """Through the real bootstrap with -I -S (no site-packages): pynvml comes from __modules__."""
    src = HERE.parent / "runhealth" / "node"
    program = json.dumps(
        {
            "main": (src / "agent.py").read_text(),
            "modules": {
                "runhealth_node_scan": (src / "scan.py").read_text(),
                "runhealth_node_gpu": (src / "gpu.py").read_text(),
                "runhealth_node_backfill": (src / "backfill.py").read_text(),
                "runhealth_node_wire": (src / "wire.py").read_text(),
                "runhealth_node_fields": (src / "fields.py").read_text(),
                "runhealth_node_formats": (src / "formats.py").read_text(),
                "pynvml": (HERE / "fake_pynvml.py").read_text(),
            },
        }
    ).encode()
    poll = json.dumps({"op": "poll", "shards": {"globs": []}, "gpu": "auto"}).encode()
    stdin = b"%d\n%s%d\n%s" % (len(program), program, len(poll), poll)
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-u", "-c", BOOTSTRAP], input=stdin, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    reply = wire.read_frame(io.BytesIO(done.stdout), sync=True)
    assert reply["gpus"]["source"] == "nvml" and [d["uuid"] for d in reply["gpus"]["devices"]] == [
        "GPU-aaaa",
        "GPU-bbbb",
    ]


def test_energy_counter_is_read_in_millijoules_and_not_supported_is_none(nvml):
    """NVML's nvmlDeviceGetTotalEnergyConsumption (mJ since the driver loaded) is the reading; a
    GPU older than Volta answers NVMLError_NotSupported, which is None (the dashboard then
    integrates power x time), and the other readings of that GPU are kept."""
    nvml.configure([dict(GPU, uuid="GPU-0", energy_mj=42_000), dict(GPU, uuid="GPU-1", energy_mj=nvml.NOT_SUPPORTED)])
    first, second = agent.read_gpus("auto")["devices"]
    assert first["energy_mj"] == 42_000
    assert second["energy_mj"] is None and second["power_w"] == 650.21 and second["error"] is None
    nvml.configure([dict(GPU, uuid="GPU-0")], missing=("nvmlDeviceGetTotalEnergyConsumption",))
    (only,) = agent.read_gpus("auto")["devices"]
    assert only["energy_mj"] is None and "nvmlDeviceGetTotalEnergyConsumption" in agent_gpu.NVML.missing


def test_nvidia_smi_has_no_energy_field_so_its_devices_say_none():
    """nvidia-smi's --query-gpu has no energy counter (it rejects such a field): the fallback's
    devices carry energy_mj None, and the query asks for no field nvidia-smi would refuse."""
    (dev,) = agent_gpu.parse_smi_csv("0, NVIDIA H200, GPU-0, 97, 120000, 143771, 650.21, 700.00, 61, 1980\n")
    assert dev["energy_mj"] is None and dev["power_w"] == 650.21
    assert not any("energy" in f for f in agent_gpu.SMI_FIELDS)


def test_demo_energy_counter_is_the_integral_of_its_power(monkeypatch):
    """The demo GPU's counter grows by the integral of the power it reports (checked against a
    fine trapezoid sum of the same power curve over 60 s)."""
    t0 = 1_800_000_000.0
    clock = [t0]
    monkeypatch.setattr(agent_gpu.time, "time", lambda: clock[0])
    before = agent_gpu._demo_devices(2)
    steps, power = 600, []
    for k in range(steps + 1):
        clock[0] = t0 + 60.0 * k / steps
        power.append([d["power_w"] for d in agent_gpu._demo_devices(2)])
    after = agent_gpu._demo_devices(2)
    for i in range(2):
        joules = (after[i]["energy_mj"] - before[i]["energy_mj"]) / 1000
        trapezoid = sum((power[k][i] + power[k + 1][i]) / 2 * (60.0 / steps) for k in range(steps))
        assert joules == pytest.approx(trapezoid, rel=2e-3)
        assert 800 * 60 < joules < 990 * 60
