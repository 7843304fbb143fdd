"""Masks given pair by pair (a boolean matrix, or FlexAttention's mask_mod) turned into slices.

The matrix is read a block of rows at a time on the device it lives on (or the one asked for);
each row's runs of attended keys come back to the host as (row, begin, end), and the C++ side
(flexcp::masks::from_row_runs) joins the runs of consecutive rows into the fewest slices whose
ends move by 0 or 1 per row. The result attends exactly the given pairs."""
import torch
import torch.utils._pytree as pytree

from . import _flexcp
from ._args import integer
from ._mask import Mask

# Entries of the boolean matrix evaluated at once: the mask_mod's temporaries are a few times
# this in bytes (int64 index arithmetic), so 2^22 keeps a CPU block in cache-friendly tens of MB
# and 2^26 a GPU block in hundreds of MB.
_BLOCK_ENTRIES = {"cpu": 1 << 22, "cuda": 1 << 26}

# More runs than this (16 per row on average, at least 2^20) means the mask is not made of
# ranges: a strided or random pattern has a run per attended key, and as slices it would be one
# slice per key, far slower than any dense kernel. Refused before it fills the host's memory.
_RUNS_PER_ROW = 16
_MIN_RUN_LIMIT = 1 << 20


def _runs(attended: torch.Tensor, first_row: int, first_col: int) -> torch.Tensor:
    """(row, begin, end) of each run of True in a [rows, keys] boolean block, row-major."""
    edges = torch.nn.functional.pad(attended.to(torch.int8), (1, 1)).diff(dim=1)
    starts = (edges == 1).nonzero()
    ends = (edges == -1).nonzero()
    return torch.stack([starts[:, 0] + first_row, starts[:, 1] + first_col,
                        ends[:, 1] + first_col], dim=1).cpu()


class _RunCollector:
    def __init__(self, fn, seqlen_q, seqlen_k, max_runs):
        self.fn, self.seqlen_q, self.seqlen_k = fn, seqlen_q, seqlen_k
        self.max_runs = max(_MIN_RUN_LIMIT, _RUNS_PER_ROW * seqlen_q) if max_runs is None else \
            integer(fn, "max_runs", max_runs)
        self.parts, self.count = [], 0

    def add(self, attended, first_row, first_col=0):
        runs = _runs(attended, first_row, first_col)
        self.count += runs.shape[0]
        if self.count > self.max_runs:
            raise ValueError(
                f"{self.fn}: more than {self.max_runs} runs of attended keys by row "
                f"{first_row + attended.shape[0]} of {self.seqlen_q} (max_runs): this mask is not "
                "made of ranges of keys (a strided or random pattern?), and as slices it would "
                "need about one per run; raise max_runs to build it anyway")
        self.parts.append(runs)

    def mask(self):
        runs = torch.cat(self.parts) if self.parts else torch.zeros(0, 3, dtype=torch.int64)
        return Mask._of(_flexcp.masks.from_row_runs(self.seqlen_q, self.seqlen_k,
                                                    runs.contiguous().numpy()))


def _rows_per_block(device: torch.device, seqlen_k: int) -> int:
    entries = _BLOCK_ENTRIES["cuda" if device.type == "cuda" else "cpu"]
    return max(1, entries // max(1, seqlen_k))


def from_dense(attended, max_runs=None) -> Mask:
    """The mask that attends (q, k) where `attended[q, k]` is True: a 2-D boolean tensor (any
    device; or a NumPy array or nested lists), seqlen_q x seqlen_k."""
    fn = "flexcp.masks.from_dense"
    if not isinstance(attended, torch.Tensor):
        attended = torch.as_tensor(attended)
    if attended.dtype != torch.bool:
        raise ValueError(f"{fn}: attended has dtype {attended.dtype}, expected torch.bool")
    if attended.dim() != 2:
        raise ValueError(f"{fn}: attended has shape {tuple(attended.shape)}, expected "
                         "[seqlen_q, seqlen_k]")
    seqlen_q, seqlen_k = attended.shape
    runs = _RunCollector(fn, seqlen_q, seqlen_k, max_runs)
    step = _rows_per_block(attended.device, seqlen_k)
    for r in range(0, seqlen_q, step):
        runs.add(attended[r:r + step], r)
    return runs.mask()


class _HeadIndexRefused(torch.overrides.TorchFunctionMode):
    """Raises when an operation touches the head index: a flexcp mask is shared by every head,
    so a mask_mod that depends on h has no exact translation (and h = 0 for all would be
    silently wrong for the others)."""

    def __init__(self, fn, head):
        super().__init__()
        self.fn, self.head = fn, head

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(x is self.head for x in pytree.tree_leaves((args, kwargs))):
            raise ValueError(
                f"{self.fn}: mask_mod reads the head index h, but a flexcp mask is the same for "
                "every head; give a mask_mod of (b, h, q_idx, kv_idx) that does not use h (per-"
                "head masks are not supported)")
        return func(*args, **kwargs)


def from_mask_mod(mask_mod, seqlen_q, seqlen_k=None, batch=None, device="cpu",
                  max_runs=None) -> Mask:
    """The mask of a FlexAttention mask_mod(b, h, q_idx, kv_idx) -> bool tensor: (q, k) is
    attended where it returns True. It is evaluated on every pair, a block of rows at a time:
    q_idx comes as a column [rows, 1] and kv_idx as a row [1, seqlen_k] (int64, on `device`), b
    and h as 0-d tensors, and the result broadcast to [rows, seqlen_k]; a mask_mod written with
    elementwise operations and indexing, as FlexAttention's are, works unchanged. Cost: one
    evaluation of every pair, as FlexAttention's create_block_mask; device="cuda" is much faster
    on long sequences.

    With `batch` = B, the mask_mod's b runs over 0..B-1 and the B masks are packed one after the
    other (seqlen_q * B by seqlen_k * B, block diagonal): q of FlexAttention's [B, H, S, D] is
    flexcp's q.transpose(1, 2).reshape(B * S, H, D). The mask_mod must not use h: a flexcp mask
    is the same for every head (using h raises)."""
    fn = "flexcp.masks.from_mask_mod"
    seqlen_q = integer(fn, "seqlen_q", seqlen_q)
    seqlen_k = seqlen_q if seqlen_k is None else integer(fn, "seqlen_k", seqlen_k)
    batches = 1 if batch is None else integer(fn, "batch", batch)
    return _evaluate(fn, mask_mod, seqlen_q, seqlen_k, batches, torch.device(device), max_runs)


def _evaluate(fn, mask_mod, seqlen_q, seqlen_k, batches, device, max_runs, blocks=None):
    """The packed mask of mask_mod over `batches` sequences. With `blocks` (a BlockMask's grids
    and block sizes), a pair is attended when its block is full, or partial and mask_mod says so,
    as FlexAttention reads a BlockMask."""
    if not callable(mask_mod):
        raise ValueError(f"{fn}: mask_mod must be callable, got {type(mask_mod).__name__}")
    for name, value, least in (("seqlen_q", seqlen_q, 0), ("seqlen_k", seqlen_k, 0),
                               ("batch", batches, 1)):
        if value < least:
            raise ValueError(f"{fn}: {name} is {value}, expected >= {least}")
    limit = _flexcp.max_seqlen
    if max(seqlen_q, seqlen_k) * batches > limit:
        raise ValueError(f"{fn}: {batches} sequences of {seqlen_q} x {seqlen_k} tokens pack to "
                         f"more than the most a mask holds ({limit} tokens a side)")
    runs = _RunCollector(fn, seqlen_q * batches, seqlen_k * batches, max_runs)
    kv_idx = torch.arange(seqlen_k, device=device).unsqueeze(0)
    head = torch.zeros((), dtype=torch.int64, device=device)
    step = _rows_per_block(device, seqlen_k)
    with _HeadIndexRefused(fn, head):
        for b in range(batches):
            b_idx = torch.full((), b, dtype=torch.int64, device=device)
            for r in range(0, seqlen_q, step):
                q_idx = torch.arange(r, min(r + step, seqlen_q), device=device).unsqueeze(1)
                attended = _call(fn, mask_mod, b_idx, head, q_idx, kv_idx)
                if blocks is not None:
                    full, partial, q_block, k_block = blocks
                    qb, kb = q_idx // q_block, kv_idx // k_block
                    attended = full[b][qb, kb] | (partial[b][qb, kb] & attended)
                runs.add(attended, b * seqlen_q + r, b * seqlen_k)
    return runs.mask()


def _call(fn, mask_mod, b_idx, head, q_idx, kv_idx):
    out = mask_mod(b_idx, head, q_idx, kv_idx)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
        got = out.dtype if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"{fn}: mask_mod returned {got}, expected a torch.bool tensor")
    shape = (q_idx.shape[0], kv_idx.shape[1])
    try:
        return torch.broadcast_to(out, shape)
    except RuntimeError:
        raise ValueError(
            f"{fn}: mask_mod returned shape {tuple(out.shape)} for q_idx of shape "
            f"{tuple(q_idx.shape)} and kv_idx of shape {tuple(kv_idx.shape)}, expected one that "
            f"broadcasts to {shape} (elementwise operations on them)") from None


def _block_grid(fn, name, counts, indices):
    """A BlockMask's [B, H, q blocks] counts and [..., key blocks] key-block indices (the first
    `count` of each row valid) as a dense [B, q blocks, key blocks] grid, the same for every head
    (else refused)."""
    columns = indices.shape[-1]
    entries = torch.arange(columns, device=indices.device)
    cols = torch.where(entries < counts.unsqueeze(-1), indices.long(), columns)
    grid = torch.zeros(*indices.shape[:-1], columns + 1, dtype=torch.bool,
                       device=indices.device)
    grid.scatter_(-1, cols, True)
    grid = grid[..., :columns]
    if grid.shape[1] > 1 and not bool((grid == grid[:, :1]).all()):
        raise ValueError(f"{fn}: the block mask's {name} differ between heads, but a flexcp mask "
                         "is the same for every head")
    return grid[:, 0]


def from_block_mask(block_mask, device=None, max_runs=None) -> Mask:
    """The mask a FlexAttention BlockMask stands for: the pairs of its full blocks, and the pairs
    of its partial blocks that its mask_mod attends (a batch of B > 1 packed as in
    from_mask_mod). Evaluated on the block mask's device unless `device` says otherwise."""
    fn = "flexcp.masks.from_block_mask"
    needed = ("mask_mod", "seq_lengths", "kv_num_blocks", "kv_indices", "BLOCK_SIZE")
    if not all(hasattr(block_mask, a) for a in needed):
        raise ValueError(f"{fn}: expected a torch.nn.attention.flex_attention.BlockMask, got "
                         f"{type(block_mask).__name__}")
    seqlen_q, seqlen_k = (integer(fn, "seq_lengths", n) for n in block_mask.seq_lengths)
    q_block, k_block = (integer(fn, "BLOCK_SIZE", n) for n in block_mask.BLOCK_SIZE)
    device = block_mask.kv_num_blocks.device if device is None else torch.device(device)
    q_blocks, k_blocks = -(-seqlen_q // q_block), -(-seqlen_k // k_block)
    grids = [_block_grid(fn, "partial blocks", block_mask.kv_num_blocks, block_mask.kv_indices)]
    if block_mask.full_kv_num_blocks is not None:
        grids.append(_block_grid(fn, "full blocks", block_mask.full_kv_num_blocks,
                                 block_mask.full_kv_indices))
    for g in grids:
        if g.shape[1] < q_blocks or g.shape[2] < k_blocks:
            raise ValueError(f"{fn}: the block mask has {g.shape[1]} x {g.shape[2]} blocks of "
                             f"{q_block} x {k_block}, too few for its lengths {seqlen_q} x "
                             f"{seqlen_k}")
    partial = grids[0][:, :q_blocks, :k_blocks]
    full = grids[1][:, :q_blocks, :k_blocks] if len(grids) > 1 else torch.zeros_like(partial)
    return _evaluate(fn, block_mask.mask_mod, seqlen_q, seqlen_k, partial.shape[0], device,
                     max_runs, (full.to(device), partial.to(device), q_block, k_block))
