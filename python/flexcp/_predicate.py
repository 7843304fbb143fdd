"""Masks given pair by pair (a boolean matrix, or FlexAttention's mask_mod) turned into slices.

The matrix is read a block of rows at a time on the device it lives on (or the one asked for);
each row's runs of attended keys come back to the host as (row, begin, end), and the C++ side
(flexcp::masks::from_row_runs) joins the runs of consecutive rows into the fewest slices whose
ends move by 0 or 1 per row. The result attends exactly the given pairs."""
import torch
import torch.distributed as dist
import torch.utils._pytree as pytree

from . import _flexcp
from ._args import integer
from ._dist import _collective
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
_NOT_RANGES = ("this mask is not made of ranges of keys (a strided or random pattern?), and as "
               "slices it would need about one per run; raise max_runs to build it anyway")


def _edges(attended: torch.Tensor):
    """Where each run of True along the last dimension starts and ends (one past), as the
    indices of nonzero(): every dimension, the last one's the run's start / end."""
    *lines, cols = attended.shape
    if attended.numel() == 0:
        none = torch.zeros(0, attended.dim(), dtype=torch.int64, device=attended.device)
        return none, none
    # t marks the transitions of each line padded with False on both sides: a line's marks
    # alternate start, end, so in row-major order the 2i-th mark starts the run the 2i+1-th ends.
    width = cols + 1
    n = attended.numel() // cols * width
    words = -(-n // 8)
    flat = torch.empty(words * 8, dtype=torch.bool, device=attended.device)
    flat[n:] = False
    t = flat[:n].view(*lines, width)
    t[..., 0] = attended[..., 0]
    t[..., cols] = attended[..., cols - 1]
    torch.ne(attended[..., 1:], attended[..., :-1], out=t[..., 1:cols])
    # nonzero over 8-byte words first: a mask of ranges has few transitions, so the second pass
    # reads only the words that hold one (nonzero over every byte was most of the time). Where
    # a quarter of the words hold one, the bytes once are cheaper.
    hit = flat.view(torch.int64).nonzero().squeeze(1)
    if 4 * hit.numel() > words:
        at = flat[:n].nonzero().squeeze(1)
    else:
        sub = flat.view(words, 8)[hit].nonzero()
        at = hit[sub[:, 0]] * 8 + sub[:, 1]
    index = torch.stack([*torch.unravel_index(at // width, lines), at % width], dim=1)
    return index[0::2], index[1::2]


def _runs(attended: torch.Tensor, first_row: int, first_col: int) -> torch.Tensor:
    """(row, begin, end) of each run of True in a [rows, keys] boolean block, row-major."""
    starts, ends = _edges(attended)
    return torch.stack([starts[:, 0] + first_row, starts[:, 1] + first_col,
                        ends[:, 1] + first_col], dim=1).cpu()


class _RunCollector:
    """Runs of a packed mask, collected block by block in (row, begin) order, with the limit."""

    def __init__(self, fn, seqlen_q, seqlen_k, max_runs):
        self.fn, self.seqlen_q, self.seqlen_k = fn, seqlen_q, seqlen_k
        if max_runs is None:
            self.max_runs = max(_MIN_RUN_LIMIT, _RUNS_PER_ROW * seqlen_q)
        else:
            self.max_runs = integer(fn, "max_runs", max_runs)
            if self.max_runs < 0:
                raise ValueError(f"{fn}: max_runs is {self.max_runs}, expected >= 0")
        self.parts, self.count = [], 0

    def add(self, attended, first_row, first_col=0):
        self.add_runs(_runs(attended, first_row, first_col))

    def add_runs(self, runs):
        """(row, begin, end) rows on the host, after every run added so far in (row, begin)."""
        self.count += runs.shape[0]
        if self.count > self.max_runs:
            raise ValueError(
                f"{self.fn}: more than {self.max_runs} runs of attended keys by row "
                f"{int(runs[-1, 0]) + 1} of {self.seqlen_q} (max_runs): {_NOT_RANGES}")
        self.parts.append(runs)

    def runs(self):
        return torch.cat(self.parts) if self.parts else torch.zeros(0, 3, dtype=torch.int64)

    def mask(self, runs=None):
        runs = self.runs() if runs is None else runs
        return Mask._of(_flexcp.masks.from_row_runs(self.seqlen_q, self.seqlen_k,
                                                    runs.contiguous().numpy()))


def _collected(fn, group, collect):
    """The mask of the runs collect() gathers (it checks the arguments, then returns a filled
    _RunCollector). With a group, every check and evaluation runs before the ranks meet, so
    that an error on any rank, or ranks given other lengths or limits, raise on every rank
    instead of leaving the others waiting; then every rank's runs, in rank order."""
    if group is None:
        return collect().mask()
    collector, failure = None, None
    try:
        collector = collect()
    except Exception as e:  # noqa: BLE001 (raised again below, and named on every other rank)
        failure = e
    on = torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend(group) == "nccl" else torch.device("cpu")
    mine = collector.runs() if collector else torch.zeros(0, 3, dtype=torch.int64)
    shape = (collector.seqlen_q, collector.seqlen_k, collector.max_runs) if collector else (0,) * 3
    world = dist.get_world_size(group)
    status = torch.tensor([int(failure is not None), mine.shape[0], *shape], dtype=torch.int64,
                          device=on)
    every = [torch.empty_like(status) for _ in range(world)]
    _collective(dist.all_gather, every, status, group=group)
    every = [x.cpu().tolist() for x in every]
    if failure is not None:
        raise failure
    failed = [r for r, x in enumerate(every) if x[0]]
    if failed:
        raise ValueError(f"{fn}: rank {failed[0]} of the group failed (its error is raised "
                         "there)")
    for r, x in enumerate(every):
        if x[2:] != every[0][2:]:
            raise ValueError(f"{fn}: rank {r} of the group was given a mask of {x[2]} x {x[3]} "
                             f"with max_runs {x[4]}, rank 0 one of {every[0][2]} x "
                             f"{every[0][3]} with max_runs {every[0][4]}: every rank must pass "
                             "the same")
    counts = [x[1] for x in every]
    if sum(counts) > collector.max_runs:
        raise ValueError(f"{fn}: {sum(counts)} runs of attended keys over the group's ranks, "
                         f"more than {collector.max_runs} (max_runs): {_NOT_RANGES}")
    padded = torch.zeros(max(max(counts), 1), 3, dtype=torch.int64, device=on)
    padded[:mine.shape[0]] = mine.to(on)
    parts = [torch.empty_like(padded) for _ in range(world)]
    _collective(dist.all_gather, parts, padded, group=group)
    return collector.mask(torch.cat([p[:n].cpu() for p, n in zip(parts, counts)]))


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
                  max_runs=None, group=None) -> Mask:
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
    is the same for every head (using h raises).

    With `group` (a torch.distributed group; collective), each rank evaluates its share of the
    rows, and every rank gets the whole mask (as DistAttention needs it): a long mask in 1/N of
    the time. Every rank passes the same arguments; an error on any rank raises on all."""
    fn = "flexcp.masks.from_mask_mod"

    def collect():
        q = integer(fn, "seqlen_q", seqlen_q)
        k = q if seqlen_k is None else integer(fn, "seqlen_k", seqlen_k)
        batches = 1 if batch is None else integer(fn, "batch", batch)
        _check_lengths(fn, mask_mod, q, k, batches)
        runs = _RunCollector(fn, q * batches, k * batches, max_runs)
        first, last = _share(q * batches, group)  # packed row b * q + r: row r of sequence b
        _evaluate_rows(fn, mask_mod, q, k, torch.device(device), first, last, runs)
        return runs

    return _collected(fn, group, collect)


def _check_lengths(fn, mask_mod, seqlen_q, seqlen_k, batches):
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


def _share(total, group):
    """This rank's [first, last) of `total` items (all of them without a group)."""
    if group is None:
        return 0, total
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    return total * rank // world, total * (rank + 1) // world


def _evaluate_rows(fn, mask_mod, seqlen_q, seqlen_k, device, first, last, runs):
    """Packed rows [first, last), a block of rows of one sequence at a time, into `runs`."""
    kv_idx = torch.arange(seqlen_k, device=device).unsqueeze(0)
    head = torch.zeros((), dtype=torch.int64, device=device)
    step = _rows_per_block(device, seqlen_k)
    row = first
    while row < last:
        b, r = divmod(row, seqlen_q)
        end = min(r + step, seqlen_q, r + last - row)
        b_idx = torch.full((), b, dtype=torch.int64, device=device)
        q_idx = torch.arange(r, end, device=device).unsqueeze(1)
        runs.add(_call(fn, mask_mod, b_idx, head, q_idx, kv_idx), row, b * seqlen_k)
        row += end - r


def _call(fn, mask_mod, b_idx, head, q_idx, kv_idx):
    # Only the mask_mod's own operations are watched for the head index: the mode sees every
    # torch call made under it, and the runs' search after it is a fifth of the time on its own.
    with _HeadIndexRefused(fn, head):
        out = mask_mod(b_idx, head, q_idx, kv_idx)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
        got = out.dtype if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"{fn}: mask_mod returned {got}, expected a torch.bool tensor")
    shape = torch.broadcast_shapes(q_idx.shape, kv_idx.shape)
    try:
        return torch.broadcast_to(out, shape)
    except RuntimeError:
        raise ValueError(
            f"{fn}: mask_mod returned shape {tuple(out.shape)} for q_idx of shape "
            f"{tuple(q_idx.shape)} and kv_idx of shape {tuple(kv_idx.shape)}, expected one that "
            f"broadcasts to {tuple(shape)} (elementwise operations on them)") from None


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


def from_block_mask(block_mask, device=None, max_runs=None, group=None) -> Mask:
    """The mask a FlexAttention BlockMask stands for: the pairs of its full blocks, and the pairs
    of its partial blocks that its mask_mod attends (a batch of B > 1 packed, and `group` used,
    as in from_mask_mod). Evaluated on the block mask's device unless `device` says otherwise."""
    fn = "flexcp.masks.from_block_mask"

    def collect():
        needed = ("mask_mod", "seq_lengths", "kv_num_blocks", "kv_indices", "BLOCK_SIZE")
        if not all(hasattr(block_mask, a) for a in needed):
            raise ValueError(f"{fn}: expected a torch.nn.attention.flex_attention.BlockMask, got "
                             f"{type(block_mask).__name__}")
        seqlen_q, seqlen_k = (integer(fn, "seq_lengths", n) for n in block_mask.seq_lengths)
        sizes = (seqlen_q, seqlen_k) + tuple(integer(fn, "BLOCK_SIZE", n)
                                             for n in block_mask.BLOCK_SIZE)
        on = block_mask.kv_num_blocks.device if device is None else torch.device(device)
        full, partial = _block_grids(fn, block_mask, sizes, on)
        batches = partial.shape[0]
        _check_lengths(fn, block_mask.mask_mod, seqlen_q, seqlen_k, batches)
        runs = _RunCollector(fn, seqlen_q * batches, seqlen_k * batches, max_runs)
        first, last = _share(batches * partial.shape[1], group)
        _evaluate_blocks(fn, block_mask.mask_mod, sizes, full, partial, first, last, runs)
        return runs

    return _collected(fn, group, collect)


def _block_grids(fn, block_mask, sizes, device):
    """The block mask's full and partial blocks as [B, q blocks, key blocks] grids on `device`,
    cut to its lengths; a block listed both ways is refused."""
    seqlen_q, seqlen_k, q_block, k_block = sizes
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
    partial = grids[0][:, :q_blocks, :k_blocks].to(device)
    full = grids[1][:, :q_blocks, :k_blocks].to(device) if len(grids) > 1 else \
        torch.zeros_like(partial)
    both = (full & partial).nonzero()
    if both.shape[0]:
        b, g, kb = both[0].tolist()
        raise ValueError(f"{fn}: block ({g}, {kb}) (q block, key block) of batch entry {b} is "
                         "listed both as full and as partial")
    return full, partial


def _evaluate_blocks(fn, mask_mod, sizes, full, partial, first, last, runs):
    """Packed q blocks [first, last) (block g of sequence b is b * q_blocks + g) into `runs`: a
    full block's pairs as whole ranges, the mask_mod evaluated on the partial blocks' pairs only
    (so a document mask costs its partial blocks, not the whole matrix)."""
    seqlen_q, seqlen_k, q_block, k_block = sizes
    q_blocks = full.shape[1]
    blocks_at_once = max(1, _BLOCK_ENTRIES["cuda" if full.device.type == "cuda" else "cpu"] //
                         (q_block * k_block))
    head = torch.zeros((), dtype=torch.int64, device=full.device)
    g = first
    while g < last:
        b, g0 = divmod(g, q_blocks)
        g1 = min(g0 + blocks_at_once, q_blocks, g0 + last - g)
        found = torch.cat([_full_block_runs(full[b, g0:g1], g0, sizes),
                           _partial_block_runs(fn, mask_mod, b, head, partial[b, g0:g1], g0,
                                               sizes, blocks_at_once)])
        found[:, 0] += b * seqlen_q
        found[:, 1:] += b * seqlen_k
        order = torch.argsort(found[:, 0] * (seqlen_k * (b + 1) + 1) + found[:, 1])
        runs.add_runs(found[order].cpu())
        g += g1 - g0


def _full_block_runs(full, g0, sizes):
    """(row, begin, end) over every row of q blocks g0.. for their stretches of full key blocks."""
    seqlen_q, seqlen_k, q_block, k_block = sizes
    starts, ends = _edges(full)  # (q block, first key block), (q block, one past the last)
    rows = (g0 + starts[:, :1]) * q_block + torch.arange(q_block, device=full.device)
    keep = rows < seqlen_q
    begins = (starts[:, 1:] * k_block).expand_as(rows)
    stops = (ends[:, 1:] * k_block).clamp(max=seqlen_k).expand_as(rows)
    return torch.stack([rows[keep], begins[keep], stops[keep]], dim=1)


def _partial_block_runs(fn, mask_mod, b, head, partial, g0, sizes, blocks_at_once):
    """(row, begin, end) of the mask_mod's runs inside the partial blocks of q blocks g0..: it is
    evaluated on those blocks' pairs only, `blocks_at_once` blocks a call (indices past the
    lengths clamped for the call, their result dropped). A run cut by a block edge comes out in
    pieces, which from_row_runs joins."""
    seqlen_q, seqlen_k, q_block, k_block = sizes
    device = partial.device
    listed = partial.nonzero()  # (q block from g0, key block) of each partial block
    found = [torch.zeros(0, 3, dtype=torch.int64, device=device)]
    b_idx = torch.full((), b, dtype=torch.int64, device=device)
    rows_in, cols_in = (torch.arange(n, device=device) for n in (q_block, k_block))
    for i in range(0, listed.shape[0], blocks_at_once):
        g, kb = listed[i:i + blocks_at_once].unbind(1)
        q_idx = ((g0 + g) * q_block).view(-1, 1, 1) + rows_in.view(1, -1, 1)  # [n, q_block, 1]
        kv_idx = (kb * k_block).view(-1, 1, 1) + cols_in.view(1, 1, -1)  # [n, 1, k_block]
        attended = _call(fn, mask_mod, b_idx, head, q_idx.clamp(max=max(seqlen_q - 1, 0)),
                         kv_idx.clamp(max=max(seqlen_k - 1, 0)))
        attended = attended & (q_idx < seqlen_q) & (kv_idx < seqlen_k)
        starts, ends = _edges(attended)  # (block, row in it, key in it)
        rows = (g0 + g[starts[:, 0]]) * q_block + starts[:, 1]
        base = kb[starts[:, 0]] * k_block
        found.append(torch.stack([rows, base + starts[:, 2], base + ends[:, 2]], dim=1))
    return torch.cat(found)
