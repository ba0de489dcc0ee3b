"""The peak memory a real run uses, to hold the memory estimate against, measured two ways:

- ``PeakStorage`` watches every aten op torch dispatches and counts the storages their results
  hold: exact and fast, in process, but blind to what a kernel allocates and frees inside itself
  (softmax's copy of a non-contiguous input, einsum's intermediates, sdpa's per-thread buffers);
- ``allocated_peaks`` runs pipelines in a child process whose allocator maps every block of 64 KiB
  or more on its own and returns it when freed (``MALLOC_MMAP_THRESHOLD_``), so the growth of its
  peak resident memory (VmHWM after ``clear_refs``) is the peak of what the run allocated,
  kernels' insides included, to within the pages of small blocks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakStorage(TorchDispatchMode):
    """Bytes of distinct storages alive at once; a storage counts from the op that makes it until it is freed."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.running = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                self._track(tensor.untyped_storage())
        return out

    def _track(self, storage) -> None:
        key = storage.data_ptr()
        if key and key not in self.live:
            self.live[key] = storage.nbytes()
            self.running += storage.nbytes()
            self.peak = max(self.peak, self.running)
            weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.running -= self.live.pop(key, 0)


def measured_peak(pipeline, **run) -> int:
    """The peak of a fresh real run of ``pipeline`` (its cached tensors are dropped first)."""
    pipeline._tensors.clear()
    with PeakStorage() as mode:
        pipeline.run(**run)
    return mode.peak


_CHILD = """
import json, sys
import tracer

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

found = []
for text in json.load(sys.stdin):
    pipeline = tracer.loads(text, "measured.yaml")
    pipeline.run(max_memory=1 << 40)  # warm up: torch's own first-use allocations are not the run's
    pipeline._tensors.clear()  # the measured run creates its inputs and params again
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    base = status("VmRSS")
    pipeline.run(max_memory=1 << 40)
    found.append((pipeline.check().peak_bytes, status("VmHWM") - base))
print(json.dumps(found))
"""


def allocated_peaks(texts: list[str]) -> list[tuple[int, int]]:
    """(estimated peak, measured peak) of a real run of each pipeline text, in one child process."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    done = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(texts), capture_output=True, text=True, env=env, timeout=300)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return [tuple(pair) for pair in json.loads(done.stdout)]
