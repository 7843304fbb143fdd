"""flexcp.Mask and flexcp.masks: validation, JSON in and out, areas against the definition, and
the builders in FlashAttention's cu_seqlens convention."""
import copy
import json
import pickle
import random

import pytest
import torch

import flexcp
from reference import dense_mask, document_ids, random_mask_slices


def test_slices_json_and_area():
    m = flexcp.Mask([(0, 4, 0, 4, "causal"), (4, 8, 0, 8, "full")], seqlen_q=8)
    assert m.seqlen_q == 8 and m.seqlen_k == 8
    assert m.area() == 10 + 32 == int(dense_mask(m).sum())
    assert m.area(q=(4, 6), k=(0, 3)) == 6
    assert m.attends(3, 3) and not m.attends(2, 3)
    spec = json.loads(m.to_json())
    assert spec["version"] == 1 and len(spec["slices"]) == 2
    for source in (spec, m.to_json()):
        assert flexcp.Mask.from_json(source).slices == m.slices


def test_json_from_a_file(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(flexcp.masks.varlen_causal([3, 5]).to_json())
    assert flexcp.Mask.from_json(str(path)).area() == 6 + 15
    assert flexcp.Mask.from_json(path).area() == 21


def test_validation_names_the_slices():
    with pytest.raises(ValueError, match="slices 0 and 1 both cover the pair"):
        flexcp.Mask([(0, 4, 0, 4, "full"), (2, 3, 1, 2, "full")], 4)
    with pytest.raises(ValueError, match="ends past seqlen_k 4"):
        flexcp.Mask([(0, 4, 0, 5, "full")], 4)
    with pytest.raises(ValueError, match="slice 0 has type 'diagonal'"):
        flexcp.Mask([(0, 4, 0, 4, "diagonal")], 4)
    with pytest.raises(ValueError, match="expected \\(q_begin, q_end, k_begin, k_end, type\\)"):
        flexcp.Mask([(0, 4, 0, 4)], 4)


def test_lengths_and_bounds_are_integers_never_truncated():
    # A float with no fraction (a float tensor's tolist()) is its integer; 4.5 is an error.
    assert flexcp.masks.varlen_causal(torch.tensor([4.0, 2.0])).seqlen_q == 6
    with pytest.raises(ValueError, match="flexcp.masks: doc_lens\\[1\\] is 2.5, expected an "
                                         "integer"):
        flexcp.masks.varlen_causal([4, 2.5])
    with pytest.raises(ValueError, match="prefix_lens\\[0\\] is '2', expected an integer"):
        flexcp.masks.prefix_lm([6], ["2"])
    with pytest.raises(ValueError, match="flexcp.Mask: slice 0's q_end is 4.5, expected an "
                                         "integer"):
        flexcp.Mask([(0, 4.5, 0, 4, "full")], 8)
    with pytest.raises(ValueError, match="flexcp.Mask: seqlen_q is 8.5, expected an integer"):
        flexcp.Mask([(0, 4, 0, 4, "full")], 8.5)
    with pytest.raises(ValueError, match="slices must be a sequence of \\(q_begin, q_end, "
                                         "k_begin, k_end, type\\), got NoneType"):
        flexcp.Mask(None, 8)
    with pytest.raises(ValueError, match="slice 0 is 'abcde', expected"):
        flexcp.Mask(["abcde"], 8)
    with pytest.raises(ValueError, match="from_cu_seqlens: window is 2.5, expected an integer"):
        flexcp.masks.from_cu_seqlens([0, 6, 10], window=2.5)
    # Every builder's scalar arguments too, each named (not a binding's TypeError).
    for build, name in ((lambda: flexcp.masks.causal(7.5), "seqlen_q is 7.5"),
                        (lambda: flexcp.masks.full(4, "8"), "seqlen_k is '8'"),
                        (lambda: flexcp.masks.batch(2.5, 4), "num_seqs is 2.5"),
                        (lambda: flexcp.masks.sliding_window([9], 3.5), "window is 3.5"),
                        (lambda: flexcp.masks.block_causal([9], None), "block is None"),
                        (lambda: flexcp.masks.shared_question(1.5, [2]), "question_len is 1.5"),
                        (lambda: flexcp.masks.pack_lengths([3], 9, 4.5), "max_len is 4.5")):
        with pytest.raises(ValueError, match=f"flexcp.masks: {name}, expected an integer"):
            build()
    assert flexcp.masks.causal(torch.tensor(7), 7.0).seqlen_q == 7
    # Past int64: named, not wrapped or refused by the binding.
    for build, name in ((lambda: flexcp.masks.causal(2**70), "seqlen_q"),
                        (lambda: flexcp.Mask([(0, 2**64, 0, 4, "full")], 8), "slice 0's q_end"),
                        (lambda: flexcp.masks.varlen_causal([2, -2**63 - 1]), "doc_lens\\[1\\]")):
        with pytest.raises(ValueError, match=f"{name} is -?[0-9]+, expected an integer within "
                                             "int64"):
            build()


def test_totals_past_the_longest_mask_are_named():
    # The C++ builders' check, carried through: not a wrapped int64 named as a negative seqlen.
    with pytest.raises(ValueError, match="doc_lens\\[1\\] is 4611686018427387904 after 5 "
                                         "tokens, past the most a mask holds"):
        flexcp.masks.varlen_causal([5, 2**62, 2**62])


@pytest.mark.parametrize("builder", [
    lambda: flexcp.masks.full(5, 7),
    lambda: flexcp.masks.causal(7, 5),
    lambda: flexcp.masks.batch(3, 4, "causal"),
    lambda: flexcp.masks.varlen([3, 1, 4], "bi_causal"),
    lambda: flexcp.masks.varlen_full(torch.tensor([2, 5])),
    lambda: flexcp.masks.sliding_window([9, 4], 3),
    lambda: flexcp.masks.sliding_window([9, 4], 3, symmetric=True),
    lambda: flexcp.masks.block_causal([10, 3], 4),
    lambda: flexcp.masks.prefix_lm([6, 4], [2, 0]),
    lambda: flexcp.masks.shared_question(3, [4, 2]),
])
def test_builders_give_valid_masks_with_the_right_area(builder):
    m = builder()
    assert m.area() == int(dense_mask(m).sum())


def test_from_cu_seqlens():
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    causal = flexcp.masks.from_cu_seqlens(cu, cu)
    assert causal.slices == flexcp.masks.varlen_causal([3, 0, 5]).slices
    full = flexcp.masks.from_cu_seqlens([0, 3, 8], [0, 4, 6], causal=False)
    assert full.seqlen_q == 8 and full.seqlen_k == 6 and full.area() == 3 * 4 + 5 * 2
    window = flexcp.masks.from_cu_seqlens([0, 6, 10], window=2)
    assert window.slices == flexcp.masks.sliding_window([6, 4], 2).slices
    with pytest.raises(ValueError, match="window needs cu_seqlens_k equal to cu_seqlens_q"):
        flexcp.masks.from_cu_seqlens([0, 6], [0, 5], window=2)
    with pytest.raises(ValueError, match="must be a sequence of integers"):
        flexcp.masks.varlen_causal("abc")


@pytest.mark.parametrize("make", [
    lambda: flexcp.masks.varlen_causal([30, 1, 70, 12]),
    lambda: flexcp.Mask([(0, 5, 0, 9, "bi_causal"), (5, 9, 2, 9, "inv_causal")], 9, 9),
    lambda: flexcp.masks.causal(0),
])
def test_masks_pickle_and_copy_as_their_slices(make):
    # DataLoader workers send masks by pickle; copy.deepcopy(model) copies the mask it holds.
    # (Masks made in the test: pytest keeps parameters past the module's teardown.)
    mask = make()
    for f in (copy.copy, copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))):
        got = f(mask)
        assert isinstance(got, flexcp.Mask) and got is not mask
        assert (got.slices, got.seqlen_q, got.seqlen_k) == (mask.slices, mask.seqlen_q,
                                                            mask.seqlen_k)
        assert got.area() == mask.area() and torch.equal(got._slices, mask._slices)


def test_an_unpickled_mask_is_validated_again():
    mask = flexcp.masks.causal(10)
    reduce, (array, seqlen_q, seqlen_k) = mask.__reduce__()
    array[0, 1] = 11  # past seqlen_q: what a corrupted pickle would carry
    with pytest.raises(ValueError, match="10"):
        reduce(array, seqlen_q, seqlen_k)


def test_document_ids_follow_the_attended_pairs():
    rng = random.Random(8)
    for trial in range(40):
        tq, tk = rng.randint(0, 30), rng.randint(0, 30)
        mask = flexcp.Mask(random_mask_slices(rng, tq, tk), tq, tk)
        assert torch.equal(mask.document_ids(), document_ids(dense_mask(mask))), trial
    lengths = [rng.randint(1, 9) for _ in range(30)]
    for mask in (flexcp.masks.varlen_causal(lengths), flexcp.masks.sliding_window(lengths, 2),
                 flexcp.masks.varlen(lengths, "inv_causal")):
        assert torch.equal(mask.document_ids(), document_ids(dense_mask(mask)))
    # Drawn differently, the same pairs: a diagonal band is one-token documents.
    diagonal = flexcp.Mask([(0, 5, 0, 5, "bi_causal")], 5)
    assert diagonal.document_ids().tolist() == [0, 1, 2, 3, 4]


def test_pack_lays_masks_end_to_end():
    rng = random.Random(9)
    parts = [flexcp.Mask(random_mask_slices(rng, tq, tk), tq, tk)
             for tq, tk in ((5, 7), (0, 3), (9, 9), (4, 0), (6, 2))]
    packed = flexcp.masks.pack(parts)
    want = torch.block_diag(*(dense_mask(m).to(torch.int8) for m in parts)).bool()
    assert torch.equal(dense_mask(packed), want)
    # A sample's own mask beside plain text: a prompt with two answers, then a causal document.
    batch = flexcp.masks.pack([flexcp.masks.shared_question(4, [3, 2]), flexcp.masks.causal(6)])
    assert batch.seqlen_q == 15 and batch.document_ids().tolist() == [0] * 9 + [1] * 6
    assert flexcp.masks.pack([]).seqlen_q == 0
    with pytest.raises(ValueError, match=r"masks\[1\] has type list, expected a flexcp.Mask"):
        flexcp.masks.pack([parts[0], [(0, 1, 0, 1, "full")]])
    with pytest.raises(ValueError, match="masks must be a sequence of flexcp.Mask, got int"):
        flexcp.masks.pack(3)
    with pytest.raises(ValueError, match=r"masks\[1\] \(4 x 2\) after 2147483645 x 1 tokens"):
        flexcp.masks.pack([flexcp.masks.full(2 ** 31 - 3, 1), flexcp.masks.causal(4, 2)])


def test_union_and_intersection_pair_by_pair():
    rng = random.Random(10)
    for trial in range(30):
        tq, tk = rng.randint(0, 25), rng.randint(0, 25)
        a, b, c = (flexcp.Mask(random_mask_slices(rng, tq, tk), tq, tk) for _ in range(3))
        da, db, dc = (dense_mask(m) for m in (a, b, c))
        assert torch.equal(dense_mask(a | b), da | db), trial
        assert torch.equal(dense_mask(a & b), da & db), trial
        assert torch.equal(dense_mask(flexcp.masks.union(a, b, c)), da | db | dc), trial
        assert torch.equal(dense_mask(flexcp.masks.intersection(a, b, c)), da & db & dc), trial
    # Causal text with a bidirectional image block inside.
    image = flexcp.Mask([(40, 70, 40, 70, "full")], 100)
    mixed = flexcp.masks.causal(100) | image
    want = dense_mask(flexcp.masks.causal(100))
    want[40:70, 40:70] = True
    assert torch.equal(dense_mask(mixed), want)
    with pytest.raises(ValueError, match=r"masks\[1\] is 4 x 5 and masks\[0\] 4 x 4, expected "
                       "the same lengths"):
        flexcp.masks.causal(4) | flexcp.masks.causal(4, 5)
    with pytest.raises(ValueError, match="no masks, expected at least one"):
        flexcp.masks.union()
    with pytest.raises(TypeError):
        flexcp.masks.causal(4) | 3
    with pytest.raises(ValueError, match=r"masks\[0\] has type int, expected a flexcp.Mask"):
        flexcp.masks.intersection(3)


def test_row_runs_dense_and_mask_mod_give_the_mask_back():
    rng = random.Random(11)
    for trial in range(30):
        tq, tk = rng.randint(0, 25), rng.randint(0, 25)
        mask = flexcp.Mask(random_mask_slices(rng, tq, tk), tq, tk)
        want = dense_mask(mask)
        runs = mask.row_runs()
        assert runs.dtype == torch.int64 and runs.shape[1] == 3
        assert torch.equal(mask.to_dense(), want), trial
        mod = mask.to_mask_mod()
        q, k = torch.arange(tq).unsqueeze(1), torch.arange(tk).unsqueeze(0)
        assert torch.equal(torch.broadcast_to(mod(None, None, q, k), (tq, tk)), want), trial
        again = flexcp.masks.from_mask_mod(mod, tq, tk)
        assert torch.equal(dense_mask(again), want), trial
