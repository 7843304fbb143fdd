"""A small transformer trained for a few steps with context parallelism: the packed sequence of
documents is split over the ranks by flexcp's plan, each rank embeds its own tokens, attends over
the whole varlen causal mask through flexcp.DistAttention, and takes its next-token labels from
flexcp's roll (no label crosses a document). Run on one process, or on several with

    torchrun --nproc-per-node 2 examples/torch_native/train.py

(gloo on CPU). It prints one loss per step; every world size prints the same losses.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist

import flexcp


def rope(x, positions, base=10000.0):
    """Rotary position embedding of x [T, H, D] at global token positions [T]."""
    d = x.shape[-1]
    freq = base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    angle = positions.float().unsqueeze(1) * freq  # [T, D/2]
    cos, sin = angle.cos().unsqueeze(1), angle.sin().unsqueeze(1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def all_reduce_sum(tensors):
    """Sums the tensors over the ranks, in place, in one all-reduce of a flat copy (as DDP's buckets
    do). It returns once gloo's worker thread let go of the copy: under torch 2.15 a worker that
    drops a tensor takes the GIL, and one still doing so when the interpreter exits aborts the
    process ("terminate called without an active exception")."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    uses, refs = flat._use_count(), sys.getrefcount(flat)
    dist.all_reduce(flat)
    while flat._use_count() > uses or sys.getrefcount(flat) > refs:
        time.sleep(0)  # hands the GIL to the worker waiting for it
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


class Block(torch.nn.Module):
    def __init__(self, dim, heads, heads_kv):
        super().__init__()
        self.heads, self.heads_kv, self.head_dim = heads, heads_kv, dim // heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * heads_kv * self.head_dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x, positions, attend):
        t = x.shape[0]
        h = self.norm1(x)
        q = rope(self.q(h).view(t, self.heads, self.head_dim), positions)
        k, v = self.kv(h).view(t, 2, self.heads_kv, self.head_dim).unbind(1)
        out, _ = attend(q, rope(k, positions), v)
        x = x + self.o(out.reshape(t, -1))
        return x + self.mlp(self.norm2(x))


class Model(torch.nn.Module):
    def __init__(self, vocab=97, dim=64, heads=4, heads_kv=2, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads, heads_kv) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, ids, positions, attend):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, positions, attend)
        return self.head(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--tokens", type=int, default=1024)
    a = p.parse_args()
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)  # the same model and data on every rank
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    docs = flexcp.masks.pack_lengths([300, 41, 129, 260, 77], a.tokens, a.tokens // 2)
    mask = flexcp.masks.varlen_causal(docs)
    ids = torch.randint(0, 97, (a.tokens,))
    if distributed:
        attn = flexcp.DistAttention(mask, heads_q=4, heads_kv=2, head_dim=16)
        ids_local, positions = attn.dispatch(ids), attn.position_ids
        labels = attn.roll(ids_local, -1, within_documents=True, fill=-100)
        attend = attn
    else:
        ids_local, positions = ids, torch.arange(a.tokens)
        labels = torch.roll(ids, -1)
        last = torch.cumsum(torch.tensor(docs), 0) - 1  # a document's last token has no label
        labels[last] = -100
        # One plan for every layer and step (the mask is the same): a call only runs it.
        plan = flexcp.AttentionPlan(mask, heads_q=4, heads_kv=2, head_dim=16, dtype=torch.float32)
        attend = lambda q, k, v: flexcp.attention(q, k, v, plan)  # noqa: E731
    count = torch.tensor(float((labels != -100).sum()))
    if distributed:
        all_reduce_sum([count])
    for step in range(a.steps):
        logits = model(ids_local, positions, attend)
        loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100,
                                                 reduction="sum") / count
        opt.zero_grad()
        loss.backward()
        total = loss.detach().clone()
        if distributed:  # what DDP does: one model, every rank's tokens
            all_reduce_sum([total] + [param.grad for param in model.parameters()])
        opt.step()
        if rank == 0:
            print(f"step {step} loss {total.item():.6f} ranks {world}", flush=True)
        assert math.isfinite(total.item())
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
