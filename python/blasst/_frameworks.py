"""Framework adapters: what blasst needs from the tensors of each framework, one entry each.

An adapter tells its tensors apart (by the module of their type), says whether one lives in CUDA
memory and which stream its framework has current there, hands tensors to blasst._core as DLPack
views, and allocates outputs and int32 index arrays like a given tensor. _ADAPTERS is the table;
a new framework is one more adapter in it. Objects of no listed framework go to the generic DLPack
fallback (CPU memory only, viewed as numpy arrays). A framework is imported only once one of its
tensors is seen: torch and cupy stay optional.
"""
from __future__ import annotations

import contextlib
import importlib


class Adapter:
    """The defaults: CPU memory, no stream, tensors reach C++ as they are (nanobind's DLPack)."""

    name = ""
    module = ""  # type(x).__module__ of its tensors starts with this

    def owns(self, x) -> bool:
        return type(x).__module__.startswith(self.module)

    def adopt(self, q):
        """(adapter, tensor) that serve a call whose query is q."""
        return self, q

    def joins(self, q_adapter: "Adapter") -> bool:
        """May a tensor of this framework join a call whose q is of q_adapter's?"""
        return self is q_adapter

    def is_cuda(self, x) -> bool:
        return False

    def stream(self, x) -> int:
        """The caller's current stream (cudaStream_t) for x's device; 0 for CPU memory."""
        return 0

    def device_guard(self, x):
        """Kernels launch on the current device: a context that makes it x's device."""
        return contextlib.nullcontext()

    def export(self, x):
        return x

    def empty(self, like, shape, same_dtype: bool):
        """Uninitialised output next to `like`: its dtype, or float32 (lse)."""
        raise NotImplementedError

    def int32(self, like, values):
        """A Python sequence as an int32 array next to `like` (offsets, lengths, page tables)."""
        raise NotImplementedError

    def empty_int32(self, like, n: int):
        """Uninitialised int32 [n] next to `like` (the skip set's words, SPEC §9)."""
        raise NotImplementedError


class _ArrayModule(Adapter):
    """numpy, and the base of cupy: one array API, in the module of the framework's name."""

    def __init__(self, module: str):
        self.name = self.module = module

    def _xp(self):
        return importlib.import_module(self.module)

    def empty(self, like, shape, same_dtype):
        xp = self._xp()
        return xp.empty(shape, dtype=like.dtype if same_dtype else xp.float32)

    def int32(self, like, values):
        xp = self._xp()
        return xp.asarray(values, dtype=xp.int32)

    def empty_int32(self, like, n):
        xp = self._xp()
        return xp.empty((n,), dtype=xp.int32)


class _Torch(Adapter):
    name = module = "torch"

    def is_cuda(self, x):
        return x.is_cuda

    def stream(self, x):
        if not x.is_cuda:
            return 0
        import torch
        return int(torch.cuda.current_stream(x.device).cuda_stream)

    def device_guard(self, x):
        if x.is_cuda:
            import torch
            if x.device.index != torch.cuda.current_device():
                return torch.cuda.device(x.device)
        return contextlib.nullcontext()

    def export(self, x):
        # A DLPack capsule made without __dlpack__'s stream handshake: that handshake records an
        # event on the current stream and makes the default stream wait on it, which breaks CUDA
        # graph capture. The kernels run on the current stream anyway.
        import torch.utils.dlpack as tdl
        return tdl.to_dlpack(x.detach())

    def empty(self, like, shape, same_dtype):
        import torch
        return torch.empty(shape, dtype=like.dtype if same_dtype else torch.float32,
                           device=like.device)

    def int32(self, like, values):
        import torch
        return torch.tensor(values, dtype=torch.int32, device=like.device)

    def empty_int32(self, like, n):
        import torch
        return torch.empty((n,), dtype=torch.int32, device=like.device)


class _Cupy(_ArrayModule):
    def is_cuda(self, x):
        return True

    def stream(self, x):
        return int(self._xp().cuda.get_current_stream().ptr)


NUMPY = _ArrayModule("numpy")
_ADAPTERS = (_Torch(), NUMPY, _Cupy("cupy"))


class _DLPack(Adapter):
    """Any other object: CPU memory through DLPack, as zero-copy numpy views (numpy allocates)."""

    name = "other"

    def owns(self, x):
        return True

    def adopt(self, q):
        if not hasattr(q, "__dlpack__"):
            raise TypeError(f"q: expected a torch/numpy/cupy tensor or a DLPack-capable array, "
                            f"got {type(q).__name__}")
        import numpy as np
        try:
            view = np.from_dlpack(q)  # zero-copy view of CPU memory
        except Exception as e:  # noqa: BLE001 - report what the producer said
            raise TypeError(f"q: {type(q).__name__} is not a CPU DLPack array; pass torch or "
                            f"cupy tensors for device memory ({e})") from None
        return NUMPY, view

    def joins(self, q_adapter):
        return q_adapter is NUMPY

    def export(self, x):
        import numpy as np
        return np.from_dlpack(x)


_FALLBACK = _DLPack()


def adapter_of(x) -> Adapter:
    for adapter in _ADAPTERS:
        if adapter.owns(x):
            return adapter
    return _FALLBACK


class Frame:
    """The framework of one call, chosen by its query: exports the call's tensors to C++ and
    allocates its outputs."""

    __slots__ = ("adapter", "like", "cuda")

    def __init__(self, q):
        self.adapter, self.like = adapter_of(q).adopt(q)
        self.cuda = self.adapter.is_cuda(self.like)

    def device_guard(self):
        return self.adapter.device_guard(self.like)

    def export(self, x, name: str):
        adapter = adapter_of(x)
        if not adapter.joins(self.adapter):
            raise ValueError(f"{name}: a {adapter.name} tensor cannot be mixed with a "
                             f"{self.adapter.name} q; pass all tensors from one framework")
        return adapter.export(x)

    def index(self, x, name: str):
        """int32 offsets / lengths / page tables; a Python sequence becomes an array of q's
        framework."""
        if x is None:
            return None
        if hasattr(x, "shape"):
            return self.export(x, name)
        return self.adapter.export(self.adapter.int32(self.like, x))  # a plain sequence of ints

    def empty(self, shape, same_dtype: bool):
        return self.adapter.empty(self.like, shape, same_dtype)

    def empty_int32(self, n: int):
        return self.adapter.empty_int32(self.like, n)

    def stream(self) -> int:
        return self.adapter.stream(self.like)
