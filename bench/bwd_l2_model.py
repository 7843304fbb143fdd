#!/usr/bin/env python3
"""How often the sm90 backward's q blocks would miss L2, for a few ways of cutting and ordering its
work: a model, not a measurement (bench/results/h200-backward-2026-12-04.md section 13).

The SMs run in lockstep, one q block of one q head per step each; the next unit goes to the SM
that frees first (the kernel's persistent scheduler); L2 is one LRU cache of (q head, q block)
entries of 64 KB (Q and dO in bf16, the fp32 dQ accumulator, 64 rows at head dim 128). A visit
that finds its entry gone is a miss. What it leaves out: the K/V loads, the two L2 partitions
(`--l2-mb 25` for one), HBM's own order, and time (a miss costs energy and maybe a wait, not a
step). Pure Python; causal 32K takes ~10 s a layout.

  bench/bwd_l2_model.py --seqlen 32768 --mask causal --l2-mb 40 25

The plan's own copy, for any mask and the plan's real units, is C++: src/kernels/worklist/bwd_l2.h
(it samples the entries past 2^14 visits; the two agree on causal 8K and documents of 2048).
"""
import argparse
from collections import OrderedDict

BLOCK_ROWS, TILE_KEYS, ENTRY_KB = 64, 128, 64


def tile_blocks(seqlen, mask, tile, doc_len=0, window=0):
    """The q blocks a key tile's walk visits (one q head), in walk order (from its first row): all
    of them (full), those from the tile's first row (causal), those from it to the last row whose
    window of `window` keys (itself included) reaches the tile (swa), or, for documents of doc_len
    tokens packed (varlen-causal), those from the row to the end of each document the tile
    touches."""
    if mask == "full":
        return list(range(seqlen // BLOCK_ROWS))
    if mask == "causal":
        return list(range(tile * TILE_KEYS // BLOCK_ROWS, seqlen // BLOCK_ROWS))
    if mask == "swa":
        last_row = min((tile + 1) * TILE_KEYS - 1 + window - 1, seqlen - 1)
        return list(range(tile * TILE_KEYS // BLOCK_ROWS, last_row // BLOCK_ROWS + 1))
    blocks, k0, k1 = [], tile * TILE_KEYS, (tile + 1) * TILE_KEYS
    for start in range(k0 - k0 % doc_len, k1, doc_len):
        end = min(start + doc_len, seqlen)
        first = max(start, k0)
        blocks += [b for b in range(first // BLOCK_ROWS, -(-end // BLOCK_ROWS))
                   if not blocks or b > blocks[-1]]
    return blocks


def layouts(seqlen, mask, heads_kv, group, doc_len, window):
    """Each layout: its units in scheduler order, a unit being its list of (q head, block) visits."""
    def tile_blocks_(t):
        return tile_blocks(seqlen, mask, t, doc_len, window)

    tiles = sorted(range(seqlen // TILE_KEYS), key=lambda t: -len(tile_blocks_(t)))

    def items(order, walk):
        pairs = [(t, kv) for kv in range(heads_kv) for t in tiles]  # kv head by kv head
        if order == "across-kv":  # busiest first across kv heads
            pairs.sort(key=lambda p: -len(tile_blocks_(p[0])))
        units = []
        for t, kv in pairs:
            qb = tile_blocks_(t)
            if walk == "heads-outer":
                units.append([(kv * group + j, b) for j in range(group) for b in qb])
            else:  # from the last block, the group's heads innermost
                units.append([(kv * group + j, b) for b in reversed(qb) for j in range(group)])
        return units

    def heads(n=1):  # n q heads of a group per unit, sweeps over all tiles (BwdUnitKind::kHeads)
        return [[(kv * group + j, b) for j in range(j0, min(j0 + n, group))
                 for b in tile_blocks_(t)]
                for kv in range(heads_kv) for j0 in range(0, group, n) for t in tiles]

    return {
        "items, kv head by kv head, heads-outer walk (BwdUnitKind::kItems)":
            lambda: items("by-kv", "heads-outer"),
        "items, kv head by kv head, from-last walk": lambda: items("by-kv", "from-last"),
        "items, busiest first across kv heads, heads-outer walk":
            lambda: items("across-kv", "heads-outer"),
        "head units, q head by q head (BwdUnitKind::kHeads)": heads,
        "head units of two q heads each": lambda: heads(2),
    }


def miss_rate(units, sms, capacity):
    lru, visits, misses = OrderedDict(), 0, 0
    running = []  # (unit, next visit) per busy SM, stepped in turn
    pending = iter(units)
    for _ in range(sms):
        u = next(pending, None)
        if u:
            running.append([u, 0])
    while running:
        still = []
        for slot in running:
            u, i = slot
            key = u[i]
            visits += 1
            if key in lru:
                lru.move_to_end(key)
            else:
                misses += 1
                lru[key] = None
                if len(lru) > capacity:
                    lru.popitem(last=False)
            slot[1] += 1
            if slot[1] == len(u):
                nxt = next(pending, None)
                if nxt:
                    still.append([nxt, 0])
            else:
                still.append(slot)
        running = still
    return misses / max(visits, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlen", type=int, default=32768)
    ap.add_argument("--mask", choices=["full", "causal", "varlen-causal", "swa"], default="causal")
    ap.add_argument("--doc-len", type=int, default=2048, help="varlen-causal: tokens a document")
    ap.add_argument("--window", type=int, default=4096, help="swa: keys a row sees, its own included")
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--group", type=int, default=8, help="q heads per kv head")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--l2-mb", type=float, nargs="+", default=[40.0])
    args = ap.parse_args()
    for name, make in layouts(args.seqlen, args.mask, args.heads_kv, args.group,
                              args.doc_len, args.window).items():
        units = make()
        rates = [miss_rate(units, args.sms, int(mb * 1024 / ENTRY_KB)) for mb in args.l2_mb]
        label = args.mask + (f" (documents of {args.doc_len})" if args.mask == "varlen-causal" else
                             f" (window {args.window})" if args.mask == "swa" else "")
        print(f"{label} {args.seqlen}: {name}: misses " +
              ", ".join(f"{r:.3f} at {mb:g} MB" for r, mb in zip(rates, args.l2_mb)), flush=True)


if __name__ == "__main__":
    main()
