"""flexcp: exact attention over packed sequences with arbitrary masks, for PyTorch.

    import flexcp
    mask = flexcp.masks.varlen_causal([4096, 1000, 3096])
    out, lse = flexcp.attention(q, k, v, mask)   # q [T, Hq, D], k/v [T, Hk, D]
    plan = flexcp.AttentionPlan(mask, heads_q=Hq, heads_kv=Hk, head_dim=D, device="cuda")
    out, lse = flexcp.attention(q, k, v, plan)   # planned once: layers, steps, CUDA graphs

The compiled core (`flexcp._flexcp`) exchanges tensors through DLPack and does not link against
libtorch, so one build works with any PyTorch from 2.4 on.
"""
from . import _flexcp
from . import masks
from ._attention import attention
from ._dist import DistAttention
from ._mask import Mask
from ._plan import AttentionPlan

__version__ = _flexcp.version()
built_with_cuda = _flexcp.built_with_cuda

__all__ = ["Mask", "masks", "attention", "AttentionPlan", "DistAttention", "built_with_cuda",
           "__version__"]
