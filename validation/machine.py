"""What a measurement records about the machine and run it came from (`run_metadata`, `device_name`, `cpu_model`).

Called on a rank after its process group started (validation.spawn.launch); torch is imported here, never by
simdist.
"""

from __future__ import annotations

import datetime
import os

__all__ = ["cpu_model", "device_name", "run_metadata", "start_rank"]


def start_rank(rank: int, world_size: int, backend: str, command: str) -> tuple[object, dict[str, str]]:
    """What every harness rank does first: (its torch device, the run's metadata on rank 0, handed to the parent
    with validation.spawn.report as ``("meta", meta)``, else {})."""
    import torch

    from validation.spawn import doing, report

    gpu = backend == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    doing("collecting the run's metadata")
    meta = run_metadata(backend, world_size, command) if rank == 0 else {}
    if rank == 0:
        report(("meta", meta))
    return device, meta


def run_metadata(backend: str, world_size: int, command: str) -> dict[str, str]:
    """What a measurement CSV records about its run (call on a rank, after the group started)."""
    import platform
    import shutil
    import subprocess

    import torch

    meta = {"command": command, "torch_version": torch.__version__, "backend": backend,
            "world_size": str(world_size), "python": platform.python_version(),
            "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    meta["host_count"] = str(max(1, world_size // max(1, local)))
    meta["launcher"] = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "validation.spawn"
    meta["cpu_model"] = cpu_model()
    meta["cpu_count"] = str(os.cpu_count())
    if hasattr(os, "getloadavg"):  # other work on the host skews CPU timings: record how busy it was
        meta["load_average_1m"] = f"{os.getloadavg()[0]:.2f}"
    if torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name(torch.cuda.current_device())
        meta["cuda_version"] = str(torch.version.cuda)
        nccl = torch.cuda.nccl.version()
        meta["nccl_version"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    if shutil.which("nvidia-smi"):
        try:
            query = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=20)
            if query.returncode == 0 and query.stdout.strip():
                meta["driver_version"] = query.stdout.split()[0]
        except (OSError, subprocess.SubprocessError):
            pass
        try:
            topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
            if topo.returncode == 0 and topo.stdout.strip():
                meta["nvidia_smi_topo_m"] = topo.stdout.rstrip()
        except (OSError, subprocess.SubprocessError):
            pass
    return meta


def device_name(backend: str) -> str:
    """The GPU name on the NCCL path, else the CPU model."""
    import torch

    if backend == "nccl" and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return cpu_model()


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform.processor()."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
