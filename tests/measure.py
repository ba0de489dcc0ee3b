"""The peak bytes of tensor storage a real run holds, measured by watching every aten op torch
dispatches (kernels' internal copies included), to hold the memory estimate against."""

from __future__ import annotations

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
