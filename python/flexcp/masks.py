"""Builders of the masks people train with (docs/masks.md), the C++ helpers under their names.
Document lengths are any sequence of ints (a list, a tuple, a 1-D integer tensor)."""
from . import _flexcp
from ._args import integer, integers
from ._mask import Mask
from ._predicate import from_block_mask, from_dense, from_mask_mod

__all__ = ["full", "causal", "batch", "varlen", "varlen_full", "varlen_causal",
           "from_cu_seqlens", "sliding_window", "block_causal", "prefix_lm", "shared_question",
           "pack_lengths", "read_lengths_file", "pack", "union", "intersection", "from_dense",
           "from_mask_mod", "from_block_mask"]


def _ints(name, values):
    return integers("flexcp.masks", name, values)


def _int(name, value):
    return integer("flexcp.masks", name, value)


def full(seqlen_q, seqlen_k=None):
    seqlen_q = _int("seqlen_q", seqlen_q)
    return Mask._of(_flexcp.masks.full(
        seqlen_q, seqlen_q if seqlen_k is None else _int("seqlen_k", seqlen_k)))


def causal(seqlen_q, seqlen_k=None):
    """Bottom-right aligned causal (FlashAttention 2's convention when seqlen_q != seqlen_k)."""
    seqlen_q = _int("seqlen_q", seqlen_q)
    return Mask._of(_flexcp.masks.causal(
        seqlen_q, seqlen_q if seqlen_k is None else _int("seqlen_k", seqlen_k)))


def batch(num_seqs, seqlen, type="causal"):
    """`num_seqs` sequences of `seqlen` tokens packed, each attending to itself."""
    return Mask._of(_flexcp.masks.batch(_int("num_seqs", num_seqs), _int("seqlen", seqlen), type))


def varlen(doc_lens, type):
    return Mask._of(_flexcp.masks.varlen(_ints("doc_lens", doc_lens), type))


def varlen_full(doc_lens):
    return Mask._of(_flexcp.masks.varlen_full(_ints("doc_lens", doc_lens)))


def varlen_causal(doc_lens):
    return Mask._of(_flexcp.masks.varlen_causal(_ints("doc_lens", doc_lens)))


def from_cu_seqlens(cu_seqlens_q, cu_seqlens_k=None, causal=True, window=None):
    """FlashAttention's varlen convention: document d's queries are
    [cu_seqlens_q[d], cu_seqlens_q[d+1]) and attend its keys [cu_seqlens_k[d], cu_seqlens_k[d+1])
    (bottom-right aligned when causal). With `window`, each token sees the `window` tokens up to
    itself (causal) or `window - 1` on each side (not causal); needs cu_seqlens_k == cu_seqlens_q."""
    q = _ints("cu_seqlens_q", cu_seqlens_q)
    k = q if cu_seqlens_k is None else _ints("cu_seqlens_k", cu_seqlens_k)
    if window is None:
        return Mask._of(_flexcp.masks.from_cu_seqlens(q, k, "causal" if causal else "full"))
    if k != q:
        raise ValueError("flexcp.masks.from_cu_seqlens: window needs cu_seqlens_k equal to "
                         "cu_seqlens_q (self-attention)")
    if len(q) < 1 or q[0] != 0:
        raise ValueError(f"flexcp.masks.from_cu_seqlens: cu_seqlens_q must start at 0, got {q[:3]}")
    lens = [b - a for a, b in zip(q, q[1:])]
    window = integer("flexcp.masks.from_cu_seqlens", "window", window)
    return Mask._of(_flexcp.masks.sliding_window(lens, window, not causal))


def sliding_window(doc_lens, window, symmetric=False):
    return Mask._of(_flexcp.masks.sliding_window(_ints("doc_lens", doc_lens),
                                                 _int("window", window), symmetric))


def block_causal(doc_lens, block):
    return Mask._of(_flexcp.masks.block_causal(_ints("doc_lens", doc_lens), _int("block", block)))


def prefix_lm(doc_lens, prefix_lens):
    return Mask._of(_flexcp.masks.prefix_lm(_ints("doc_lens", doc_lens),
                                            _ints("prefix_lens", prefix_lens)))


def shared_question(question_len, answer_lens):
    return Mask._of(_flexcp.masks.shared_question(_int("question_len", question_len),
                                                  _ints("answer_lens", answer_lens)))


def _cpp_masks(fn, masks):
    masks = list(masks) if hasattr(masks, "__iter__") else masks
    if not isinstance(masks, list):
        raise ValueError(f"flexcp.masks.{fn}: masks must be a sequence of flexcp.Mask, got "
                         f"{type(masks).__name__}")
    for i, m in enumerate(masks):
        if not isinstance(m, Mask):
            raise ValueError(f"flexcp.masks.{fn}: masks[{i}] has type {type(m).__name__}, "
                             "expected a flexcp.Mask")
    return [m._mask for m in masks]


def pack(masks):
    """Masks laid end to end, each over its own queries and keys: a packed batch of samples that
    each bring their own mask (text, an image block, a prompt with answers), none attending
    another."""
    return Mask._of(_flexcp.masks.pack(_cpp_masks("pack", masks)))


def union(*masks):
    """The pairs any of the masks attends (same lengths), as the fewest slices; also `a | b`.
    E.g. causal text with a bidirectional image block inside:
    `causal(T) | flexcp.Mask([(i0, i1, i0, i1, "full")], T)`."""
    return Mask._of(_flexcp.masks.unite(_cpp_masks("union", masks)))


def intersection(*masks):
    """The pairs every mask attends (same lengths), as the fewest slices; also `a & b`."""
    return Mask._of(_flexcp.masks.intersect(_cpp_masks("intersection", masks)))


def pack_lengths(lengths, total, max_len):
    return _flexcp.masks.pack_lengths(_ints("lengths", lengths), _int("total", total),
                                      _int("max_len", max_len))


def read_lengths_file(path):
    return _flexcp.masks.read_lengths_file(str(path))
