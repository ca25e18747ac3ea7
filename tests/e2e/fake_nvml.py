"""A stand-in for `pynvml` (tests only): `SLUICE_NVML_MODULE` names this file and
`FAKE_NVML_STATE` a JSON file it answers from, read again on every call so a test can
change what the devices show while Sluice runs:

    {"devices": [{"uuid": "GPU-0", "memory_total": 17179869184, "memory_used": 5368709120,
                  "utilization": 40, "processes": [{"pid": 123, "used": 2147483648}]}]}

Only the calls `sluice.control.accelerators` makes are here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


def _devices() -> list[dict[str, Any]]:
    path = os.environ.get("FAKE_NVML_STATE", "")
    if not path or not Path(path).exists():
        return []
    return list(json.loads(Path(path).read_text())["devices"])


def nvmlInit() -> None:  # pynvml's names, camelCase
    pass


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_devices())


def nvmlDeviceGetHandleByIndex(i: int) -> int:
    return i


def _device(h: int) -> dict[str, Any]:
    return _devices()[h]


def nvmlDeviceGetUUID(h: int) -> str:
    return str(_device(h).get("uuid", f"GPU-fake-{h}"))


def nvmlDeviceGetMemoryInfo(h: int) -> SimpleNamespace:
    d = _device(h)
    total, used = int(d["memory_total"]), int(d["memory_used"])
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(h: int) -> SimpleNamespace:
    d = _device(h)
    if d.get("utilization") is None:
        raise NVMLError("Not Supported")
    return SimpleNamespace(gpu=d["utilization"], memory=0)


def nvmlDeviceGetComputeRunningProcesses(h: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(pid=int(p["pid"]), usedGpuMemory=p.get("used"))
        for p in _device(h).get("processes") or ()
    ]
