"""Deterministic kernels by choice (run config ``deterministic``): what makes a CUDA run repeat bit
for bit, and a resumed run equal the uninterrupted one.

On CUDA, cuBLAS splits reductions by a workspace whose layout varies unless
``CUBLAS_WORKSPACE_CONFIG`` fixes it (read when cuBLAS first starts in a process, so it is set
before any CUDA work), cuDNN picks convolution algorithms by timing them (``benchmark``) and some
of them add in a varying order, and a few torch kernels use atomic adds. ``deterministic = true``
fixes all three and keeps float32 convolutions and matrix products in full float32 (no TF32, which
Ampere and later GPUs would otherwise use for cuDNN's convolutions: repeatable, but about 1e-3 apart
from float32); ``false`` lets cuDNN benchmark and pick the fastest kernels and allows TF32, whose
results may differ in the last digits from run to run. On the CPU, torch's kernels already repeat for a fixed thread
count (``client-threads``), so torch's flags are left as they are there (nothing costs time on CPU).
"""

from __future__ import annotations

import os

import torch

CUBLAS_WORKSPACE = ":4096:8"  # NVIDIA's documented setting for reproducible cuBLAS results


def apply(deterministic: bool, device: torch.device | str | None = None) -> None:
    """Set this process's kernels for ``device`` (``None``: CUDA where this machine has it).

    Torch operations without a deterministic CUDA kernel warn instead of failing
    (``warn_only``): a run never stops for one, and the warning names the operation."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)  # a user's own setting wins
    cuda = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if not cuda:
        return
    torch.use_deterministic_algorithms(bool(deterministic), warn_only=True)
    torch.backends.cudnn.deterministic = bool(deterministic)
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.allow_tf32 = not deterministic
    torch.backends.cuda.matmul.allow_tf32 = not deterministic
