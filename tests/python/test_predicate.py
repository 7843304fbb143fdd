"""Masks from a predicate or a matrix (flexcp.masks.from_dense, from_mask_mod, from_block_mask):
exact pair for pair, the builders' shapes found again, FlexAttention's own examples and block
masks, the same attention as FlexAttention computes, and every bad input named."""
import random

import pytest
import torch

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


@needs_cuda
def test_on_the_gpu_the_same_slices():
    doc = DOC.cuda()

    def document_window(b, h, q, k):
        return (doc[q] == doc[k]) & (q >= k) & (q - k < 64)

    on_gpu = masks.from_mask_mod(document_window, T, device="cuda")
    assert on_gpu.slices == masks.from_mask_mod(_document_window, T).slices
    attended = dense_mask(on_gpu).cuda()
    assert masks.from_dense(attended).slices == on_gpu.slices
