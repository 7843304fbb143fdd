"""flexcp.Mask and flexcp.masks: validation, JSON in and out, areas against the definition, and
the builders in FlashAttention's cu_seqlens convention."""
import json

import pytest
import torch

import flexcp
from reference import dense_mask


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
