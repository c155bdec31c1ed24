"""The server's device for its heavy maths (run-config ``server-device``): where the big matrix
products of the server rules run.

FedAMP, HeurFedAMP, CFL and FeSEM (``pairwise``), FedSaC and pFedGraph (Gram matrix and graph
mixing), MuPFL (cosine matrices; PKCF's matching runs there too) and FedMCSA (attention and mixing)
form m x m Gram matrices and m x d mixings of m client models of d parameters: at 1,000 clients of
206,922 parameters each such product takes seconds on two CPU cores and milliseconds on a GPU. The
server state stays numpy (checkpoints, wire); only those products go through torch here, and back
through ``fedcore.wire.to_host``.

``auto`` (the default) is CUDA where the machine has it, else the CPU. It does not change a CPU
machine's results: there ``auto`` is ``cpu``, the same torch products as an explicit ``cpu`` (which
differ from the numpy products they replaced only in float32 rounding: every earlier test of these
methods passes unchanged). On CUDA, float32 products stay in full float32 (torch's default: no
TF32), summed in float64 as on the CPU, so results agree with the CPU's to float32 rounding.

The device is one per server process, chosen at a run's start for its length (``using``), as the
server runs one experiment at a time; code that never selects one (unit tests, tools) gets the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np
import torch

from fedcore import wire

CHOICES = ("auto", "cpu", "cuda")
# On the CPU, a product of fewer floating-point operations than this runs on one thread: waking torch's
# OpenMP threads cost about 20 ms per operation on a busy 2-core machine (a 10 x 500 Gram product took
# 3-23 ms on 2 threads, 0.01 ms on one), and below ~1e9 operations one core takes about as long
# as that hand-off. Larger products (1,000 clients' column blocks: ~8e9) get the process's threads.
THREADED_FLOPS = 1 << 30
_device = torch.device("cpu")


def resolve(name: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` -> a torch device; RuntimeError naming the key for ``cuda`` on a
    machine without CUDA (the run stops at start, not in its first aggregation)."""
    if name not in CHOICES:
        raise ValueError(f"unknown server-device '{name}'; use {', '.join(CHOICES)}")
    from fedcore.models import pick_device

    return pick_device(name, key="server-device")


def select(name: str | torch.device) -> torch.device:
    """Make ``name`` (a ``server-device`` value or a torch device) this process's server device."""
    global _device
    _device = name if isinstance(name, torch.device) else resolve(name)
    return _device


def check(name: str) -> torch.device:
    """``resolve`` for a run's start: a device the machine lacks is a ``ConfigError`` naming the key."""
    from fedcore.config import ConfigError

    try:
        return resolve(name)
    except RuntimeError as err:
        raise ConfigError(f"'server-device': {err}") from None


def start(name: str) -> torch.device:
    """``select`` the run config's ``server-device`` at the start of a run (``check`` first)."""
    return select(check(name))


@contextmanager
def using(name: str):
    """``start`` for the length of a run, then the device before it again (runs in one process, as the
    tests' in-process runs, do not leak theirs into the next)."""
    before = current()
    try:
        yield start(name)
    finally:
        select(before)


def current() -> torch.device:
    """The server device the products run on now."""
    return _device


def describe(device: torch.device | None = None) -> str:
    """``cpu`` or ``cuda (<GPU name>)``: what timing tables record."""
    device = current() if device is None else device
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


@contextmanager
def threads_for(flops: float):
    """Torch's CPU threads for an operation of ``flops``: one below ``THREADED_FLOPS`` (no effect on CUDA,
    whose work does not run on the host's threads)."""
    if current().type == "cuda" or flops >= THREADED_FLOPS:
        yield
        return
    from fedcore.models import one_torch_thread

    with one_torch_thread():
        yield


def product(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """left @ right (2-D tensors on the server device), on as many CPU threads as its size earns."""
    with threads_for(2.0 * left.shape[0] * left.shape[1] * right.shape[-1]):
        return left @ right


SYMMETRIC_ROWS = 256  # fewer rows: one product (the upper blocks' saving is smaller than their overhead)
SYMMETRIC_CHUNKS = 4  # row chunks of a symmetric product: (k + 1) / 2k of the full product's flops (5/8; measured ~0.7x)


def symmetric_product(a: torch.Tensor) -> torch.Tensor:
    """a @ a.T computing only the blocks on and above the diagonal (row chunk i against the rows from chunk i on)
    and copying each one's transpose below it: 5/8 of the full product's flops with 4 chunks (about 0.7x its CPU time at 1,000 rows), the same dot
    products (each entry is still one row of ``a`` against another over all of its columns), and a result exactly
    symmetric off the diagonal blocks."""
    n = a.shape[0]
    if n < SYMMETRIC_ROWS:
        return product(a, a.T)
    out = torch.empty((n, n), dtype=a.dtype, device=a.device)
    step = -(-n // SYMMETRIC_CHUNKS)
    for start in range(0, n, step):
        stop = min(start + step, n)
        out[start:stop, start:] = product(a[start:stop], a[start:].T)
        with threads_for(0):
            out[stop:, start:stop] = out[start:stop, stop:].T
    return out


def tensor(array: np.ndarray, dtype=torch.float32) -> torch.Tensor:
    """A small array (a reference vector, a weight matrix) on the server device, as a new tensor."""
    return torch.tensor(np.asarray(array), dtype=dtype, device=current())


class Uploader:
    """Host rows -> one (n, w) float32 tensor on the server device per call.

    On the CPU the rows are stacked into one of two float32 buffers the uploader reuses (a fresh 64 MB block
    per call cost its page faults on every block) and used in place (``torch.from_numpy``). On CUDA they are stacked
    straight into one of two pinned staging buffers and copied without blocking, so the host stacks
    the next block while the device copies and multiplies this one (a pageable copy of a 1,000 x
    206,922 matrix took 85 ms, ten times the product); a buffer is reused only once its copy is done.
    """

    def __init__(self, capacity: int):
        self.device = current()
        self.cuda = self.device.type == "cuda"
        self._buffers: list[torch.Tensor] = []
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._next = 0
        self._host: list[np.ndarray | None] = [None, None]
        self.capacity = capacity
        if self.cuda:
            self._buffers = [torch.empty(capacity, dtype=torch.float32, pin_memory=True) for _ in range(2)]

    def rows(self, arrays: Sequence[np.ndarray] | np.ndarray) -> torch.Tensor:
        """The rows ``arrays`` (flat arrays of one length, or a 2-D array) stacked as float32 on the device:
        modifying it in place changes no state, and it holds its rows until the call after next (two buffers)."""
        if not self.cuda:
            if isinstance(arrays, np.ndarray):
                return torch.from_numpy(np.array(arrays, dtype=np.float32))
            n, w = len(arrays), int(np.asarray(arrays[0]).size)
            k, self._next = self._next, self._next ^ 1
            if self._host[k] is None or self._host[k].size < n * w:
                self._host[k] = np.empty(max(n * w, self.capacity), dtype=np.float32)
            out = self._host[k][:n * w].reshape(n, w)
            np.stack(arrays, out=out, casting="same_kind")
            return torch.from_numpy(out)
        n, w = len(arrays), int(np.asarray(arrays[0]).size)
        k, self._next = self._next, self._next ^ 1
        if self._events[k] is not None:  # this buffer's last copy must be done before it is written again
            self._events[k].synchronize()
        if n * w > self._buffers[k].numel():
            self._buffers[k] = torch.empty(n * w, dtype=torch.float32, pin_memory=True)
        host = self._buffers[k][:n * w].view(n, w)
        if isinstance(arrays, np.ndarray):
            np.copyto(host.numpy(), arrays, casting="same_kind")
        else:  # numpy takes out= or dtype=, not both: out's float32 casts the rows
            np.stack(arrays, out=host.numpy(), casting="same_kind")
        out = host.to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._events[k] = event
        return out


class GramSum:
    """G = sum over column blocks of A_b B_b^T (B = A: symmetric), each block's product in float32 on the
    server device (the models are float32, and float32 products are the fast ones) and the sum in
    float64 there; ``result`` brings G back to numpy. FedAMP's, CFL's, FeSEM's (``pairwise.gram``),
    FedSaC's and MuPFL's Gram matrices are all this."""

    def __init__(self, rows: int, cols: int | None = None, capacity: int = 0):
        self.upload = Uploader(capacity)
        self.out = torch.zeros((rows, rows if cols is None else cols), dtype=torch.float64, device=self.upload.device)

    def add(self, rows, others=None, minus: torch.Tensor | None = None) -> None:
        """G += (A - m)(B - m)^T for the block rows ``rows`` (and ``others``; None: B = A) of one tensor;
        ``minus`` (from ``tensor``): the block's reference values, subtracted from every row."""
        a = self.upload.rows(rows)
        b = a if others is None else self.upload.rows(others)
        with threads_for(0):  # element-wise work of the block's size: one thread on the CPU
            if minus is not None:
                a -= minus
                if others is not None:
                    b -= minus
        block = product(a, b.T) if others is not None else symmetric_product(a)
        with threads_for(0):
            self.out += block.double()

    def result(self) -> np.ndarray:
        return to_host(self.out)


def put(array: np.ndarray) -> torch.Tensor:
    """One array on the server device in its own dtype (through pinned memory on CUDA), as a new tensor."""
    array = np.asarray(array)
    if current().type != "cuda":  # shares a writable array's memory (products do not write), copies a wire view
        return torch.from_numpy(np.ascontiguousarray(array) if array.flags.writeable else np.array(array, order="C"))
    host = torch.empty(array.shape, dtype=torch.from_numpy(np.empty(0, array.dtype)).dtype, pin_memory=True)
    np.copyto(host.numpy(), array)
    return host.to(current(), non_blocking=True)


def matmul(left: np.ndarray, right: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """left @ right on the server device in the arrays' own dtype (float32 stays float32, float64 stays
    float64): the mixing products W @ Theta of whole stacked tensors (FedSaC, pFedGraph, FedMCSA). ``out``: a
    C-contiguous host array of the result's shape and dtype to write it into (on the CPU the product writes there
    itself: a caller reusing one for many blocks faults no new pages per block)."""
    if out is None:
        return to_host(product(put(left), put(right)))
    if current().type == "cuda":
        out[...] = to_host(product(put(left), put(right)))
        return out
    a, b = put(left), put(right)
    with threads_for(2.0 * a.shape[0] * a.shape[1] * b.shape[-1]):
        torch.matmul(a, b, out=torch.from_numpy(out))
    return out


def gram(x: np.ndarray | torch.Tensor, dtype: torch.dtype | None = None) -> np.ndarray:
    """X X^T of the rows of ``x`` (an array, or a tensor from ``put``) on the server device, in ``dtype``
    (None: x's own), returned as float64 (one upload: no transposed copy)."""
    t = put(x) if isinstance(x, np.ndarray) else x
    t = t if dtype is None else t.to(dtype)
    return to_host(product(t, t.T)).astype(np.float64)


def to_host(value: torch.Tensor) -> np.ndarray:
    """A result back to numpy (float64 sums stay float64): the project's one conversion, ``wire.to_host``."""
    return wire.to_host(value)
