"""blasst: Skip-Softmax sparse attention (BLASST) over a C++/CUDA core.

    import blasst
    out = blasst.attention(q, k, v, causal=True, skip=blasst.SkipSoftmax(threshold=1e-3))
    out = blasst.decode(q, k_cache, v_cache, page_table=pt, seqlens=lens, max_seqlen_k=4096)

Tensors: torch, numpy or cupy (DLPack) in the layout Q [B, Lq, Hq, d], K/V [B, Lk, Hk, d]. CPU
tensors run the reference engine, CUDA tensors the sm_90a kernels on the current stream.
torch is optional: it is imported only when torch tensors are used. See docs/python.md.
"""
import sys as _sys

from . import _core
from . import calibration, diffusion
from ._api import attention, decode
from ._calls import built_with_cuda, cuda_available, cuda_device_name, set_num_threads
from ._skip import SkipSoftmax, SkipStats, SparseAttentionConfig, load_config, load_model_configs

__version__ = _core.__version__

__all__ = [
    "attention", "decode", "SkipSoftmax", "SkipStats", "SparseAttentionConfig", "load_config",
    "load_model_configs", "cuda_available", "cuda_device_name", "built_with_cuda",
    "set_num_threads", "diffusion", "calibration",
]


def __getattr__(name):
    # blasst.DecodePlan takes torch tensors: its module (and torch) load on first use, so that
    # `import blasst` stays free of torch for NumPy callers.
    if name == "DecodePlan":
        from ._plan import DecodePlan

        return DecodePlan
    raise AttributeError(f"module 'blasst' has no attribute {name!r}")


# With torch already loaded, register the custom ops now so that torch.compile finds them.
if _sys.modules.get("torch") is not None:
    from ._api import _load_torch_ops as _lto

    _lto()
    del _lto
