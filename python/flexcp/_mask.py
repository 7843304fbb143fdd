"""flexcp.Mask: a validated list of slices (docs/masks.md) over a packed sequence."""
import json
import os

import torch

from . import _flexcp
from ._args import integer

_TYPES = ("full", "causal", "inv_causal", "bi_causal")


class Mask:
    """A union of slices `(q_begin, q_end, k_begin, k_end, type)`, `type` one of "full",
    "causal", "inv_causal", "bi_causal" (docs/masks.md). Validated on construction: a slice out of
    bounds, or two slices covering the same (q, k) pair, raise ValueError naming them."""

    def __init__(self, slices, seqlen_q, seqlen_k=None):
        fn = "flexcp.Mask"
        seqlen_q = integer(fn, "seqlen_q", seqlen_q)
        seqlen_k = seqlen_q if seqlen_k is None else integer(fn, "seqlen_k", seqlen_k)
        if isinstance(slices, (str, bytes)) or not hasattr(slices, "__iter__"):
            raise ValueError(f"{fn}: slices must be a sequence of (q_begin, q_end, k_begin, "
                             f"k_end, type), got {type(slices).__name__}")
        rows = []
        for i, s in enumerate(slices):
            if isinstance(s, (str, bytes)) or not hasattr(s, "__len__") or len(s) != 5:
                raise ValueError(f"{fn}: slice {i} is {s!r}, expected "
                                 "(q_begin, q_end, k_begin, k_end, type)")
            *bounds, kind = s
            if kind not in _TYPES:
                raise ValueError(f"{fn}: slice {i} has type {kind!r}, expected one of "
                                 f"{', '.join(_TYPES)}")
            names = ("q_begin", "q_end", "k_begin", "k_end")
            rows.append(tuple(integer(fn, f"slice {i}'s {n}", b) for n, b in zip(names, bounds))
                        + (kind,))
        self._hold(_flexcp.Mask(rows, seqlen_q, seqlen_k))

    def _hold(self, cpp_mask):
        # What flexcp.attention reads is kept in plain Python attributes, so that torch.compile
        # traces it without calling into the compiled module: the lengths, and the slices as the
        # int64 [n, 5] tensor the torch ops take (their arguments are tensors and numbers).
        self._mask = cpp_mask
        self._seqlen_q = cpp_mask.seqlen_q
        self._seqlen_k = cpp_mask.seqlen_k
        self._slices = torch.from_numpy(cpp_mask.slice_array())

    @classmethod
    def _of(cls, cpp_mask):
        # A Mask around one the C++ side built (and validated).
        mask = cls.__new__(cls)
        mask._hold(cpp_mask)
        return mask

    @classmethod
    def from_json(cls, spec):
        """From a JSON spec (docs/masks.md): a path, a JSON string or a dict."""
        if isinstance(spec, dict):
            text = json.dumps(spec)
        elif isinstance(spec, (str, os.PathLike)) and os.path.exists(spec):
            with open(spec) as f:
                text = f.read()
        elif isinstance(spec, str):
            text = spec
        else:
            raise ValueError(f"flexcp.Mask.from_json: expected a path, a JSON string or a dict, "
                             f"got {type(spec).__name__}")
        return cls._of(_flexcp.Mask.from_json(text))

    def to_json(self):
        """The JSON spec, as a string."""
        return self._mask.to_json()

    def area(self, q=None, k=None):
        """Attended (q, k) pairs, in all or in the rectangle q x k (ranges (begin, end))."""
        if q is None and k is None:
            return self._mask.area()
        q = (0, self.seqlen_q) if q is None else q
        k = (0, self.seqlen_k) if k is None else k
        return self._mask.area_of(q[0], q[1], k[0], k[1])

    def attends(self, q, k):
        return self._mask.attends(q, k)

    def document_ids(self):
        """The document of each of the max(seqlen_q, seqlen_k) tokens (int64, numbered from 0
        in order): a new one starts at token i when no attended pair (q, k) has one end before i
        and the other at or after it. Read from the pairs, however the slices are drawn: e.g. for
        position ids that restart in every document."""
        return torch.from_numpy(_flexcp.masks.document_ids(self._mask))

    @property
    def seqlen_q(self):
        return self._seqlen_q

    @property
    def seqlen_k(self):
        return self._seqlen_k

    @property
    def slices(self):
        return self._mask.slices()

    def row_runs(self):
        """Every row's runs of attended keys as an int64 [n, 3] tensor (row, begin, end): sorted
        by row, then by key, maximal; rows that attend nothing left out."""
        return torch.from_numpy(_flexcp.masks.row_runs(self._mask))

    def to_dense(self, device="cpu"):
        """The mask as a bool [seqlen_q, seqlen_k] tensor, True where attended (e.g. for SDPA's
        attn_mask, where a dense matrix fits)."""
        runs = self.row_runs().to(device)
        edges = torch.zeros(self.seqlen_q, self.seqlen_k + 1, dtype=torch.int8, device=device)
        ones = torch.ones(runs.shape[0], dtype=torch.int8, device=device)
        edges.index_put_((runs[:, 0], runs[:, 1]), ones, accumulate=True)
        edges.index_put_((runs[:, 0], runs[:, 2]), -ones, accumulate=True)
        return edges.cumsum(1, dtype=torch.int8)[:, :-1] > 0

    def to_mask_mod(self, device="cpu"):
        """A FlexAttention mask_mod(b, h, q_idx, kv_idx) that attends this mask's pairs (for
        create_block_mask, e.g. to run FlexAttention where flexcp's GPU kernels do not go, or to
        compare). It looks each row's runs up in one table per run slot, indexed by q_idx only
        (as FlexAttention's FLASH backend requires), so its cost grows with the most runs any row
        has."""
        runs = self.row_runs()
        index = torch.int32 if self.seqlen_k < 2 ** 31 else torch.int64
        counts = torch.bincount(runs[:, 0], minlength=self.seqlen_q)
        slots = int(counts.max()) if runs.shape[0] else 0
        slot = torch.arange(runs.shape[0]) - (torch.cumsum(counts, 0) - counts)[runs[:, 0]]
        begin = torch.zeros(slots, self.seqlen_q, dtype=index)
        end = torch.zeros(slots, self.seqlen_q, dtype=index)  # begin == end: no key
        begin[slot, runs[:, 0]] = runs[:, 1].to(index)
        end[slot, runs[:, 0]] = runs[:, 2].to(index)
        tables = [(begin[j].to(device), end[j].to(device)) for j in range(slots)]

        def mask_mod(b, h, q_idx, kv_idx):
            attended = (q_idx < 0) & (kv_idx < 0)  # False, in the indices' shape
            for first, stop in tables:
                attended = attended | ((kv_idx >= first[q_idx]) & (kv_idx < stop[q_idx]))
            return attended

        return mask_mod

    def __or__(self, other):
        """The pairs either mask attends (flexcp.masks.union)."""
        if not isinstance(other, Mask):
            return NotImplemented
        return Mask._of(_flexcp.masks.unite([self._mask, other._mask]))

    def __and__(self, other):
        """The pairs both masks attend (flexcp.masks.intersection)."""
        if not isinstance(other, Mask):
            return NotImplemented
        return Mask._of(_flexcp.masks.intersect([self._mask, other._mask]))

    def __reduce__(self):
        # Pickled (and copied) as its slices and lengths, validated again when loaded: a mask
        # crosses DataLoader workers and is copied with the model that holds it.
        return (_from_slices, (self._slices.numpy().copy(), self.seqlen_q, self.seqlen_k))

    def __repr__(self):
        return (f"flexcp.Mask({len(self.slices)} slices, seqlen_q={self.seqlen_q}, "
                f"seqlen_k={self.seqlen_k}, area={self.area()})")


def _from_slices(array, seqlen_q, seqlen_k):
    return Mask._of(_flexcp.Mask.from_array(array, seqlen_q, seqlen_k))
