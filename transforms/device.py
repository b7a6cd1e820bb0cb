"""Where the torch math runs: `--device auto|cpu|cuda`, resolved once per worker in setup().

auto takes the GPU when torch sees one. Moving data: a bucket's light columns are built on the
host once, copied once (from pinned memory when the target is a GPU, so the copy can run
asynchronously) and the results come back once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rescore.errors import DeviceError
from rescore.transforms.rows.tensors import to_device  # noqa: F401  (the shells' import; the row layer's home)

if TYPE_CHECKING:
    import torch

# torch is imported where a device is resolved or used, not with this module: the launcher
# (option parsing, --help, planning, job submission) never needs it.

CHOICES = ("auto", "cpu", "cuda")
LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner")


def _no_cuda_reason() -> str:
    import torch

    built = torch.version.cuda
    if built is None:
        return f"torch {torch.__version__} is a CPU-only build (install the CUDA build, see README: GPU)"
    return f"torch {torch.__version__} (CUDA {built}) sees no GPU: check the driver and CUDA_VISIBLE_DEVICES"


def resolve(choice: str) -> torch.device:
    """The device for `choice`; raises DeviceError for cuda without a visible GPU."""
    if choice not in CHOICES:
        raise ValueError(f"--device must be one of {', '.join(CHOICES)}, got {choice!r}")
    import torch

    if choice != "cpu" and torch.cuda.is_available():
        return torch.device("cuda")
    if choice == "cuda":
        raise DeviceError(f"--device cuda: no CUDA device is available here; {_no_cuda_reason()}")
    release_gpu_pages(choice)
    return torch.device("cpu")


_GPU_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg", "/proc/driver/nvidia/gpus/*")
"""What a GPU torch could see leaves on this machine: NVIDIA's device files and driver entries,
ROCm's kfd, WSL's dxg. Without any of them torch.cuda.is_available() is False."""


def host_only(choice: str) -> bool:
    """The math of a `choice` run is on the CPU, decided without importing torch: cpu, or auto
    where no GPU device exists (_GPU_NODES; where torch is imported already, torch decides).
    False for cuda, and for auto on a machine with a GPU device."""
    import glob
    import sys

    if choice == "cpu":
        return True
    if choice != "auto":
        return False
    torch = sys.modules.get("torch")
    if torch is not None:
        return not torch.cuda.is_available()
    return not any(glob.glob(pattern) for pattern in _GPU_NODES)


def release_gpu_pages(choice: str) -> None:
    """Where the torch math of a `choice` run is on the CPU (cpu, or auto without a GPU), the
    CUDA libraries torch loaded stay mapped but leave the resident set (transforms/memory.py;
    ~136 MB with torch's CUDA build; nothing changes otherwise), unless something in this
    process (the model stage) works on a GPU already. Nothing where torch is not imported yet
    (the step that resolves the device does it then). The read step calls it first, so that
    its memory plan and its peak count without those pages."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or choice not in ("cpu", "auto") or torch.cuda.is_initialized():
        return
    if choice == "auto" and torch.cuda.is_available():
        return
    from rescore.transforms.memory import release_gpu_library_pages

    release_gpu_library_pages()


