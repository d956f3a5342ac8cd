"""Stand-ins for the GPU tools a node has (``nvidia-smi``, ``dmesg``, ``dcgmi``), for hosts with no GPU.

Each is a small executable in a folder that goes first on one fake host's PATH, answering from a JSON
scenario file the test writes (``write_scenario``); without the file, nvidia-smi fails as it does
when no driver answers. ``nvidia-smi`` speaks the real one's query language as far as fsdpctl uses
it: ``--help-query-gpu`` / ``--help-query-compute-apps`` list the valid fields in its format, a
query with a field the "driver" lacks is refused whole (``Field "x" is not a valid field to query.``,
exit 2), ``--format=csv,noheader,nounits`` prints the values, ``[N/A]`` where the GPU has none.
The healthy values are an idle H100's as a real nvidia-smi 580 printed them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HEALTHY_GPU: dict[str, str] = {
    "index": "0", "pci.bus_id": "00000000:00:06.0", "name": "NVIDIA H100 80GB HBM3",
    "uuid": "GPU-ad534904-764e-e9f8-c1cb-0fa2ae372e33", "driver_version": "580.159.04",
    "ecc.mode.current": "Enabled", "ecc.errors.uncorrected.volatile.total": "0",
    "ecc.errors.uncorrected.aggregate.total": "0", "retired_pages.pending": "[N/A]",
    "retired_pages.double_bit.count": "[N/A]", "remapped_rows.pending": "No", "remapped_rows.failure": "No",
    "clocks_event_reasons.active": "0x0000000000000001", "clocks_event_reasons.hw_slowdown": "Not Active",
    "clocks_event_reasons.hw_thermal_slowdown": "Not Active",
    "clocks_event_reasons.hw_power_brake_slowdown": "Not Active",
    "clocks_event_reasons.sw_thermal_slowdown": "Not Active", "clocks_event_reasons.sw_power_cap": "Not Active",
    "clocks_event_reasons.gpu_idle": "Active", "power.limit": "700.00", "power.default_limit": "700.00",
    "power.draw": "71.10", "pcie.link.gen.current": "5", "pcie.link.gen.gpucurrent": "5", "pcie.link.gen.max": "5",
    "pcie.link.width.current": "16", "pcie.link.width.max": "16", "compute_mode": "Default",
    "temperature.gpu": "32", "clocks.sm": "345", "clocks.max.sm": "1980", "utilization.gpu": "0",
    "memory.used": "0", "memory.total": "81559",
}
# The names a field may also be asked by (nvidia-smi's help lists both).
ALIASES = {"clocks_throttle_reasons." + k.split(".", 1)[1]: k for k in HEALTHY_GPU
           if k.startswith("clocks_event_reasons.")}
APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_bus_id", "gpu_uuid", "gpu_name")

_NVIDIA_SMI = r'''#!{python} -S
"""A fake nvidia-smi (tests/testbed/fake_gpu.py) answering from {scenario}."""
import json, sys
try:
    with open({scenario!r}) as f:
        s = json.load(f)
except OSError:
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    sys.exit(9)
gpu_fields = [k for k in {healthy!r} if k not in s.get("drop_fields", [])]
aliases = {{a: k for a, k in {aliases!r}.items() if k in gpu_fields}}
args = sys.argv[1:]
if "--help-query-gpu" in args:
    print('List of valid properties to query for the switch "--query-gpu":\n')
    for k in gpu_fields:
        alias = next((a for a, t in aliases.items() if t == k), None)
        print('"%s"' % k + (' or "%s"' % alias if alias else ""))
        print("Some words about it.\n")
    sys.exit(0)
if "--help-query-compute-apps" in args:
    print('List of valid properties to query for the switch "--query-compute-apps":\n')
    for k in {apps!r}:
        print('"%s"\nWords.\n' % k)
    sys.exit(0)
query = next((a for a in args if a.startswith("--query-")), None)
if query is None:
    print("Fake NVIDIA-SMI: %d GPU(s)" % len(s.get("gpus", [])))
    sys.exit(0)
switch, fields = query[len("--query-"):].split("=", 1)
fields = fields.split(",")
valid = gpu_fields + list(aliases) if switch == "gpu" else list({apps!r})
for f in fields:
    if f not in valid:
        print('Field "%s" is not a valid field to query.\n' % f)
        sys.exit(2)
rows = s.get("gpus", []) if switch == "gpu" else s.get("apps", [])
for i, row in enumerate(rows):
    full = dict({healthy!r}, index=str(i), **row) if switch == "gpu" else row
    print(", ".join(str(full.get(aliases.get(f, f), "[N/A]")) for f in fields))
'''

_DMESG = '''#!{python} -S
import json, sys
try:
    with open({scenario!r}) as f:
        s = json.load(f)
except OSError:
    s = {{}}
if s.get("dmesg_refused"):
    sys.stderr.write("dmesg: read kernel buffer failed: Operation not permitted\\n")
    sys.exit(1)
for line in s.get("dmesg", []):
    print(line)
'''

_DCGMI = '''#!{python}
import json, sys
with open({scenario!r}) as f:
    s = json.load(f)
print(s.get("dcgmi_output", "Successfully ran diagnostic for group.\\n| Deployment | Pass |"))
sys.exit(s.get("dcgmi_status", 0))
'''


def install(bin_dir: Path, scenario: Path, dcgmi: bool = False) -> Path:
    """The fake tools in ``bin_dir`` (nvidia-smi and dmesg; dcgmi too when asked), answering from
    ``scenario``; returns ``bin_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tools = {"nvidia-smi": _NVIDIA_SMI.format(python=sys.executable, scenario=str(scenario),
                                              healthy=HEALTHY_GPU, aliases=ALIASES, apps=APP_FIELDS),
             "dmesg": _DMESG.format(python=sys.executable, scenario=str(scenario))}
    if dcgmi:
        tools["dcgmi"] = _DCGMI.format(python=sys.executable, scenario=str(scenario))
    for name, text in tools.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    return bin_dir


def gpu(bus: int, **fields: Any) -> dict[str, str]:
    """One GPU's values different from the healthy ones (its bus id from ``bus``)."""
    return {"pci.bus_id": f"00000000:{bus:02X}:00.0", "uuid": f"GPU-fake-{bus:02x}",
            **{k.replace("__", "."): str(v) for k, v in fields.items()}}


def write_scenario(path: Path, gpus: list[dict[str, str]], apps: list[dict[str, Any]] = (),
                   **more: Any) -> None:
    """What the fake tools answer: the GPUs (``gpu()``), the processes on them, and ``dmesg`` lines,
    ``drop_fields`` (an older driver), ``dcgmi_status``/``dcgmi_output``, ``dmesg_refused``."""
    path.write_text(json.dumps({"gpus": list(gpus), "apps": list(apps), **more}))
