"""A stand-in ``nvidia-smi`` (SIMULATED: no driver, no GPU): answers as the NVIDIA driver's tool does, from
a case file, for the node-fleet rehearsal (``simulated/node_fleet.py``) and the pre-flight's tests.

Installed as an executable named ``nvidia-smi`` in a directory put first on ``PATH``; it reads the case
file beside it, ``nvidia-smi.json``::

    {"driver_version": "580.95.05",
     "failure": null,                      # or {"exit_code": 18, "message": "Failed to initialize NVML: ..."}
     "gpus": [{"index": 0, "uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3",
               "memory_total_mib": 81559, "memory_used_mib": 0,
               "mig_devices": [{"profile": "3g.40gb", "uuid": "MIG-..."}]}]}   # the key only in MIG mode

It answers the forms the real tool answers and the project asks: ``--query-gpu=<fields>
--format=csv[,noheader][,nounits]`` (fields: index, uuid, name, memory.total, memory.used, memory.free,
driver_version, mig.mode.current, count) and ``-L``; an unknown field or argument fails as the real one
does (exit 2). Only the standard library: it runs under any Python.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CASE_FILE = "nvidia-smi.json"
_UNITS = {"memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB"}
FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "memory.free", "driver_version", "mig.mode.current",
          "count")


def _field(case: dict[str, Any], gpu: dict[str, Any], name: str) -> str:
    total, used = gpu["memory_total_mib"], gpu["memory_used_mib"]
    values: dict[str, Any] = {
        "index": gpu["index"], "uuid": gpu["uuid"], "name": gpu["name"], "memory.total": total, "memory.used": used,
        "memory.free": total - used, "driver_version": case["driver_version"], "count": len(case["gpus"]),
        # A GPU that cannot run MIG answers [N/A]; one that can, Enabled or Disabled.
        "mig.mode.current": ("Enabled" if "mig_devices" in gpu else "Disabled" if gpu.get("mig_capable") else "[N/A]"),
    }
    return str(values[name])


def _query(case: dict[str, Any], fields: list[str], options: set[str]) -> int:
    for name in fields:
        if name not in FIELDS:
            print(f'Field "{name}" is not a valid field to query.')
            return 2
    units = "nounits" not in options
    if "noheader" not in options:
        print(", ".join(f"{name} [{_UNITS[name]}]" if units and name in _UNITS else name for name in fields))
    for gpu in case["gpus"]:
        cells = []
        for name in fields:
            value = _field(case, gpu, name)
            cells.append(f"{value} {_UNITS[name]}" if units and name in _UNITS else str(value))
        print(", ".join(cells))
    return 0


def _list(case: dict[str, Any]) -> int:
    for gpu in case["gpus"]:
        print(f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})")
        for number, device in enumerate(gpu.get("mig_devices", [])):
            print(f"  MIG {device['profile']:<11} Device {number:>2}: (UUID: {device['uuid']})")
    return 0


def answer(case: dict[str, Any], args: list[str]) -> int:
    """Print what nvidia-smi prints for ``args`` on the node ``case`` describes; the exit status."""
    failure = case.get("failure")
    if failure:
        print(failure["message"])
        return int(failure["exit_code"])
    if args == ["-L"]:
        return _list(case)
    query = [arg for arg in args if arg.startswith("--query-gpu=")]
    formats = [arg for arg in args if arg.startswith("--format=")]
    if len(query) == 1 and len(formats) == 1 and len(args) == 2:
        options = set(formats[0].removeprefix("--format=").split(","))
        if "csv" in options and options <= {"csv", "noheader", "nounits"}:
            return _query(case, query[0].removeprefix("--query-gpu=").split(","), options)
    print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
    return 2


def main(argv: list[str] | None = None) -> int:
    """Answer from the case file beside this executable."""
    case = json.loads((Path(sys.argv[0]).resolve().parent / CASE_FILE).read_text())
    return answer(case, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
