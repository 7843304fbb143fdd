"""Masks from a predicate or a matrix (flexcp.masks.from_dense, from_mask_mod, from_block_mask):
exact pair for pair, the builders' shapes found again, FlexAttention's own examples and block
masks, the same attention as FlexAttention computes, and every bad input named."""
import datetime
import os
import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flexcp
from flexcp import masks
from reference import attention, dense_mask, random_mask_slices

try:
    from torch.nn.attention import flex_attention as flex
except ImportError:  # torch < 2.5
    flex = None
needs_flex = pytest.mark.skipif(flex is None, reason="FlexAttention needs torch >= 2.5")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _documents(lengths):
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


DOCS = [300, 1, 517, 1, 1, 180]  # one-token documents beside longer ones
DOC = _documents(DOCS)
T = sum(DOCS)


# FlexAttention's examples as mask_mods, each with the builder that should give the same pairs.
def _causal(b, h, q, k):
    return q >= k


def _document_causal(b, h, q, k):
    return (DOC[q] == DOC[k]) & (q >= k)


def _document_window(b, h, q, k):
    return (DOC[q] == DOC[k]) & (q >= k) & (q - k < 64)


def _document_symmetric_window(b, h, q, k):
    return (DOC[q] == DOC[k]) & ((q - k).abs() < 16)


def _document_block_causal(b, h, q, k):
    return (DOC[q] == DOC[k]) & (q // 32 >= k // 32)


EXAMPLES = [
    ("causal", _causal, lambda: masks.causal(T)),
    ("documents", _document_causal, lambda: masks.varlen_causal(DOCS)),
    ("window", _document_window, lambda: masks.sliding_window(DOCS, 64)),
    ("symmetric window", _document_symmetric_window,
     lambda: masks.sliding_window(DOCS, 16, symmetric=True)),
]


@pytest.mark.parametrize("name,mask_mod,builder", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_mask_mods_give_the_builders_pairs_in_no_more_slices(name, mask_mod, builder):
    found, built = masks.from_mask_mod(mask_mod, T), builder()
    assert torch.equal(dense_mask(found), dense_mask(built))
    assert len(found.slices) <= len(built.slices)


def test_block_causal_by_position_is_exact():
    # Blocks counted from the sequence start, not the document's: no builder, so against the
    # predicate itself.
    found = masks.from_mask_mod(_document_block_causal, T)
    q, k = torch.arange(T).unsqueeze(1), torch.arange(T).unsqueeze(0)
    assert torch.equal(dense_mask(found), _document_block_causal(None, None, q, k))


def test_one_token_documents_stay_documents():
    # Two one-token documents in a row attend the same pairs as one 2 x 2 diagonal band, and may
    # come back as one; their documents are read from the pairs, so they stay apart.
    found = masks.from_mask_mod(_document_causal, T)
    assert {s[0] for s in found.slices} >= {0, 300, 301, 818, 820}
    assert torch.equal(found.document_ids(), DOC)


def test_random_matrices_come_back_exactly():
    gen = torch.Generator().manual_seed(3)
    for trial in range(60):
        tq, tk = (int(torch.randint(0, 40, (1,), generator=gen)) for _ in range(2))
        density = trial / 60
        attended = torch.rand(tq, tk, generator=gen) < density
        assert torch.equal(dense_mask(masks.from_dense(attended)), attended), trial


def test_runs_are_found_whether_transitions_are_sparse_or_dense():
    # Runs are found from 8-byte words that hold a transition (few, for ranges), or from every
    # byte where a quarter of the words hold one (a dense pattern): both ways exact, on lines
    # whose padded length is not a multiple of 8 and on a broadcast (stride 0) matrix.
    gen = torch.Generator().manual_seed(5)
    cols = torch.arange(1001)
    for trial in range(20):
        begins = torch.randint(0, 1001, (37, 3), generator=gen).sort(dim=1).values
        ends = begins + torch.randint(0, 200, (37, 3), generator=gen)
        sparse = ((cols >= begins[:, :1]) & (cols < ends[:, :1])) | \
                 ((cols >= begins[:, 2:]) & (cols < ends[:, 2:]))
        dense = torch.rand(37, 1001, generator=gen) < 0.5
        for attended in (sparse, dense, sparse[:1].expand(29, 1001)):
            assert torch.equal(dense_mask(masks.from_dense(attended)), attended), trial


def test_random_slice_unions_come_back_exactly():
    rng = random.Random(4)
    for trial in range(60):
        tq, tk = rng.randint(1, 50), rng.randint(1, 50)
        given = dense_mask(flexcp.Mask(random_mask_slices(rng, tq, tk), tq, tk))
        assert torch.equal(dense_mask(masks.from_dense(given)), given), trial
        assert torch.equal(dense_mask(masks.from_dense(given.numpy())), given), trial


def test_a_batch_is_packed_block_diagonally():
    prefix = torch.tensor([3, 0, 7])

    def prefix_lm(b, h, q, k):  # each sequence's own bidirectional prefix, then causal
        return (k <= q) | (k < prefix[b])

    found = masks.from_mask_mod(prefix_lm, 20, batch=3)
    assert (found.seqlen_q, found.seqlen_k) == (60, 60)
    assert torch.equal(dense_mask(found), dense_mask(masks.prefix_lm([20, 20, 20], [3, 0, 7])))


def test_cross_lengths_and_empty_masks():
    found = masks.from_mask_mod(lambda b, h, q, k: k <= q + 5, 7, 12)
    assert torch.equal(dense_mask(found), dense_mask(masks.causal(7, 12)))
    assert masks.from_mask_mod(lambda b, h, q, k: q < 0, 9).area() == 0
    assert masks.from_mask_mod(_causal, 0).area() == 0
    assert masks.from_dense(torch.zeros(0, 5, dtype=torch.bool)).seqlen_k == 5


def test_a_constant_mask_mod_broadcasts():
    def everything(b, h, q, k):  # FlexAttention's noop_mask returns a 0-d tensor
        return b.new_ones((), dtype=torch.bool)

    assert masks.from_mask_mod(everything, 30, 40).area() == 30 * 40


def test_attention_over_a_mask_mod_matches_the_reference():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(T, h, 64, generator=gen) for h in (4, 2, 2))
    mask = masks.from_mask_mod(_document_window, T)
    out, lse = flexcp.attention(q, k, v, mask)
    want, want_lse = attention(q.double(), k.double(), v.double(),
                               _document_window(None, None, torch.arange(T).unsqueeze(1),
                                                torch.arange(T).unsqueeze(0)))
    torch.testing.assert_close(out.double(), want, atol=2e-6, rtol=0)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-6, rtol=0)


@needs_flex
def test_block_masks_from_create_block_mask():
    for name, mask_mod, builder in EXAMPLES:
        block_mask = flex.create_block_mask(mask_mod, None, None, T, T, device="cpu")
        found = masks.from_block_mask(block_mask)
        assert torch.equal(dense_mask(found), dense_mask(builder())), name


@needs_flex
def test_a_block_mask_is_read_as_flex_reads_it():
    # Built from blocks by hand with a mask_mod that says yes everywhere: the blocks decide.
    # Blocks of 16 x 32 over 40 x 70: q block 0 sees key blocks 0 and 2 (2 partial), q block 1
    # key block 1 in full, q block 2 nothing.
    counts = torch.tensor([[[2, 0, 0]]], dtype=torch.int32)
    indices = torch.tensor([[[[0, 2, 0], [0, 0, 0], [0, 0, 0]]]], dtype=torch.int32)
    full_counts = torch.tensor([[[0, 1, 0]]], dtype=torch.int32)
    full_indices = torch.tensor([[[[0, 0, 0], [1, 0, 0], [0, 0, 0]]]], dtype=torch.int32)
    block_mask = flex.BlockMask.from_kv_blocks(counts, indices, full_counts, full_indices,
                                               BLOCK_SIZE=(16, 32),
                                               mask_mod=lambda b, h, q, k: (q + k) % 3 != 0,
                                               seq_lengths=(40, 70))
    want = torch.zeros(40, 70, dtype=torch.bool)
    q, kk = torch.arange(40).unsqueeze(1), torch.arange(70).unsqueeze(0)
    mod = (q + kk) % 3 != 0
    want[0:16, 0:32] = mod[0:16, 0:32]
    want[0:16, 64:70] = mod[0:16, 64:70]
    want[16:32, 32:64] = True
    found = masks.from_block_mask(block_mask, max_runs=10 ** 6)
    assert torch.equal(dense_mask(found), want)


def _random_block_mask(rng, batch, seqlen_q, seqlen_k, q_block, k_block):
    """A BlockMask made by hand: each block empty, partial or full at random, its index lists
    shuffled (FlexAttention keeps them sorted; a hand-made one need not), and the dense pairs it
    stands for, by FlexAttention's reading."""
    nq, nk = -(-seqlen_q // q_block), -(-seqlen_k // k_block)
    kind = torch.tensor([[[rng.choice((0, 0, 1, 2)) for _ in range(nk)] for _ in range(nq)]
                         for _ in range(batch)])

    def ordered(which):
        counts = (kind == which).sum(-1).unsqueeze(1).to(torch.int32)
        indices = torch.zeros(batch, 1, nq, nk, dtype=torch.int32)
        for b in range(batch):
            for g in range(nq):
                listed = [kb for kb in range(nk) if kind[b, g, kb] == which]
                rng.shuffle(listed)
                indices[b, 0, g, :len(listed)] = torch.tensor(listed, dtype=torch.int32)
        return counts, indices

    offset = rng.randint(0, 5)

    def mask_mod(b, h, q, k):
        return (q + 2 * k + b + offset) % 5 < 2

    q, k = torch.arange(seqlen_q).unsqueeze(1), torch.arange(seqlen_k).unsqueeze(0)
    want = torch.zeros(batch * seqlen_q, batch * seqlen_k, dtype=torch.bool)
    for b in range(batch):
        block_kind = kind[b][q // q_block, k // k_block]
        want[b * seqlen_q:(b + 1) * seqlen_q, b * seqlen_k:(b + 1) * seqlen_k] = \
            (block_kind == 2) | ((block_kind == 1) & mask_mod(b, None, q, k))
    block_mask = flex.BlockMask.from_kv_blocks(*ordered(1), *ordered(2),
                                               BLOCK_SIZE=(q_block, k_block), mask_mod=mask_mod,
                                               seq_lengths=(seqlen_q, seqlen_k))
    return block_mask, want


@needs_flex
def test_random_block_masks_evaluate_only_their_partial_blocks_exactly():
    rng = random.Random(9)
    for trial in range(25):
        batch = rng.randint(1, 3)
        q_block, k_block = rng.choice((4, 8, 16)), rng.choice((4, 8, 16))
        seqlen_q, seqlen_k = rng.randint(1, 60), rng.randint(1, 60)
        block_mask, want = _random_block_mask(rng, batch, seqlen_q, seqlen_k, q_block, k_block)
        found = masks.from_block_mask(block_mask, max_runs=10 ** 6)
        assert torch.equal(dense_mask(found), want), trial


@needs_flex
def test_a_block_listed_full_and_partial_is_named():
    one = torch.ones(1, 1, 1, dtype=torch.int32)
    zero = torch.zeros(1, 1, 1, 1, dtype=torch.int32)
    block_mask = flex.BlockMask.from_kv_blocks(one, zero, one, zero, BLOCK_SIZE=(8, 8),
                                               mask_mod=_causal, seq_lengths=(8, 8))
    with pytest.raises(ValueError, match=r"block \(0, 0\) \(q block, key block\) of batch "
                       "entry 0 is listed both as full and as partial"):
        masks.from_block_mask(block_mask)


def _document_blocks(lengths, block):
    """The full and partial blocks of a document-causal mask, as [1, 1, n, n] grids."""
    n = -(-sum(lengths) // block)
    full = torch.zeros(1, 1, n, n, dtype=torch.bool)
    partial = torch.zeros_like(full)
    start = 0
    for length in lengths:
        end = start + length
        for qb in range(start // block, (end - 1) // block + 1):
            rows = (max(qb * block, start), min((qb + 1) * block, end))
            for kb in range(start // block, (rows[1] - 1) // block + 1):
                cols = (kb * block, (kb + 1) * block)
                whole = cols[0] >= start and cols[1] - 1 <= rows[0] and rows == (qb * block,
                                                                                  (qb + 1) * block)
                (full if whole else partial)[0, 0, qb, kb] = True
        start = end
    return full, partial


@needs_flex
def test_a_long_block_mask_costs_its_partial_blocks():
    # 256K tokens of documents: the whole matrix is 6.9e10 pairs (minutes on a CPU); the partial
    # blocks along the diagonals a few million.
    lengths = [5000 + 977 * (i % 7) for i in range(30)]
    lengths.append(262144 - sum(lengths))
    doc = _documents(lengths)

    def document_causal(b, h, q, k):
        return (doc[q] == doc[k]) & (q >= k)

    def ordered(grid):
        counts = grid.sum(-1).to(torch.int32)
        return counts, torch.argsort((~grid).to(torch.int8), dim=-1, stable=True).to(torch.int32)

    full, partial = _document_blocks(lengths, 128)
    block_mask = flex.BlockMask.from_kv_blocks(*ordered(partial), *ordered(full),
                                               BLOCK_SIZE=(128, 128), mask_mod=document_causal,
                                               seq_lengths=(262144, 262144))
    found = masks.from_block_mask(block_mask)
    assert found.slices == masks.varlen_causal(lengths).slices


@needs_flex
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flexcp_and_flex_attention_agree_on_a_block_mask():
    gen = torch.Generator().manual_seed(6)
    n = 256
    doc = _documents([100, 1, 90, 65])
    block_mask = flex.create_block_mask(
        lambda b, h, q, k: (doc[q] == doc[k]) & (q >= k) & (q - k < 40), None, None, n, n,
        device="cpu")
    q, k, v = (torch.randn(1, 4, n, 64, generator=gen, dtype=torch.float64) for _ in range(3))
    want = flex.flex_attention(q, k, v, block_mask=block_mask)
    out, _ = flexcp.attention(*(t[0].transpose(0, 1).float() for t in (q, k, v)),
                              masks.from_block_mask(block_mask))
    torch.testing.assert_close(out.double(), want[0].transpose(0, 1), atol=2e-6, rtol=0)


@needs_flex
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_runs_a_flexcp_mask():
    # The other way: a flexcp mask (a prompt with answers, packed beside causal text with an
    # image block) as FlexAttention's mask_mod, for where flexcp's GPU kernels do not go.
    n = 200
    text = flexcp.masks.causal(120) | flexcp.Mask([(30, 70, 30, 70, "full")], 120)
    mask = masks.pack([masks.shared_question(20, [30, 30]), text])
    assert mask.seqlen_q == n
    block_mask = flex.create_block_mask(mask.to_mask_mod(), None, None, n, n, device="cpu",
                                        BLOCK_SIZE=32)
    assert torch.equal(dense_mask(masks.from_block_mask(block_mask)), dense_mask(mask))
    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 4, n, 64, generator=gen, dtype=torch.float64) for _ in range(3))
    want = flex.flex_attention(q, k, v, block_mask=block_mask)
    out, _ = flexcp.attention(*(t[0].transpose(0, 1).float() for t in (q, k, v)), mask)
    torch.testing.assert_close(out.double(), want[0].transpose(0, 1), atol=2e-6, rtol=0)


@needs_flex
def test_per_head_block_masks_are_refused():
    block_mask = flex.create_block_mask(lambda b, h, q, k: (q >= k) | (h == 0), None, 2, 64, 64,
                                        device="cpu", BLOCK_SIZE=16)
    with pytest.raises(ValueError, match="differ between heads|reads the head index"):
        masks.from_block_mask(block_mask)
    with pytest.raises(ValueError, match="expected a torch.nn.attention.flex_attention.BlockMask"):
        masks.from_block_mask(masks.causal(4))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="reads the head index h"):
        masks.from_mask_mod(lambda b, h, q, k: (q >= k) & (h < 4), 16)
    with pytest.raises(ValueError, match="reads the head index h"):
        masks.from_mask_mod(lambda b, h, q, k: q >= k if int(h) == 0 else q < k, 16)
    with pytest.raises(ValueError, match="mask_mod must be callable, got int"):
        masks.from_mask_mod(3, 16)
    with pytest.raises(ValueError, match="returned torch.int64, expected a torch.bool tensor"):
        masks.from_mask_mod(lambda b, h, q, k: q - k, 16)
    with pytest.raises(ValueError, match="returned bool, expected a torch.bool tensor"):
        masks.from_mask_mod(lambda b, h, q, k: True, 16)
    with pytest.raises(ValueError, match=r"returned shape \(3,\)"):
        masks.from_mask_mod(lambda b, h, q, k: torch.ones(3, dtype=torch.bool), 16)
    with pytest.raises(ValueError, match="seqlen_q is -1, expected >= 0"):
        masks.from_mask_mod(_causal, -1)
    with pytest.raises(ValueError, match="batch is 0, expected >= 1"):
        masks.from_mask_mod(_causal, 8, batch=0)
    with pytest.raises(ValueError, match="seqlen_k is 2.5, expected an integer"):
        masks.from_mask_mod(_causal, 8, 2.5)
    with pytest.raises(ValueError, match="pack to more than the most a mask holds"):
        masks.from_mask_mod(_causal, 2 ** 30, batch=4)
    with pytest.raises(ValueError, match="dtype torch.float32, expected torch.bool"):
        masks.from_dense(torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"shape \(3,\), expected \[seqlen_q, seqlen_k\]"):
        masks.from_dense(torch.ones(3, dtype=torch.bool))


def test_masks_that_are_not_ranges_are_refused_before_they_fill_memory():
    def strided(b, h, q, k):
        return (k % 2 == 0) & (k <= q)

    with pytest.raises(ValueError, match=r"more than 100 runs .*\(max_runs\).*strided or random"):
        masks.from_mask_mod(strided, 64, max_runs=100)
    # Raised on request, the same mask builds (one slice per column pair it could not join).
    found = masks.from_mask_mod(strided, 64, max_runs=10 ** 4)
    q, k = torch.arange(64).unsqueeze(1), torch.arange(64).unsqueeze(0)
    assert torch.equal(dense_mask(found), strided(None, None, q, k))


def group_worker(rank, world, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        group = dist.group.WORLD
        # Each rank its share of the rows; every rank the one process's mask.
        for mask_mod, batch in ((_document_window, None), (_document_causal, 3)):
            alone = masks.from_mask_mod(mask_mod, T, batch=batch)
            together = masks.from_mask_mod(mask_mod, T, batch=batch, group=group)
            assert together.slices == alone.slices
        if flex is not None:
            block_mask = flex.create_block_mask(_document_window, None, None, T, T, device="cpu")
            assert masks.from_block_mask(block_mask, group=group).slices == \
                masks.from_block_mask(block_mask).slices
        # A rank whose mask_mod fails: its error there, named on every other rank.
        def fails_on_the_last_rank(b, h, q, k):
            if rank == world - 1:
                raise KeyError("the last rank's own error")
            return q >= k

        with pytest.raises(KeyError if rank == world - 1 else ValueError,
                           match="the last rank's own error" if rank == world - 1 else
                           f"rank {world - 1} of the group failed \\(its error is raised there"):
            masks.from_mask_mod(fails_on_the_last_rank, 64, group=group)
        # A bad argument on one rank only: that rank's error, and the others are told, not left
        # waiting for it.
        last = rank == world - 1
        with pytest.raises(ValueError, match="seqlen_q is -1, expected >= 0" if last else
                           f"rank {world - 1} of the group failed"):
            masks.from_mask_mod(_causal, -1 if last else 64, group=group)
        if world > 1:
            with pytest.raises(ValueError, match="rank 1 of the group was given a mask of 65 x 65 "
                               "with max_runs 1048576, rank 0 one of 64 x 64 with max_runs "
                               "1048576: every rank must pass the same"):
                masks.from_mask_mod(_causal, 64 + min(rank, 1), group=group)
            with pytest.raises(ValueError, match="with max_runs 100, rank 0 one of 64 x 64 with "
                               "max_runs 1048576"):
                masks.from_mask_mod(_causal, 64, max_runs=100 if rank else None, group=group)
        # Past max_runs over all ranks together, though no rank's share is: refused on all.
        with pytest.raises(ValueError, match=r"runs of attended keys over the group's ranks, "
                           r"more than 30 \(max_runs\)" if world > 1 else r"more than 30 runs"):
            masks.from_mask_mod(lambda b, h, q, k: k <= q, 31, max_runs=30, group=group)
        # Still in step: a collective after the refusals completes.
        assert masks.from_mask_mod(_causal, 9, group=group).slices == [(0, 9, 0, 9, "causal")]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_group_splits_the_rows_and_gets_the_same_mask(world, tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(group_worker, args=(world, str(tmp_path / "init")), nprocs=world, join=True)


@needs_cuda
def test_on_the_gpu_the_same_slices():
    doc = DOC.cuda()

    def document_window(b, h, q, k):
        return (doc[q] == doc[k]) & (q >= k) & (q - k < 64)

    on_gpu = masks.from_mask_mod(document_window, T, device="cuda")
    assert on_gpu.slices == masks.from_mask_mod(_document_window, T).slices
    attended = dense_mask(on_gpu).cuda()
    assert masks.from_dense(attended).slices == on_gpu.slices
