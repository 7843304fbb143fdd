"""flexcp as an attention implementation of Hugging Face transformers: registered in the
AttentionInterface, used by a randomly initialised small Llama (no weights are downloaded)
trained a few steps on packed documents. The document mask travels as a keyword argument of the
model's forward (`flexcp_mask=`), and RoPE restarts in each document through `position_ids`.
With `--compare`, the same steps with the `sdpa` implementation on a dense block-diagonal causal
mask: the losses and gradients agree.

    python examples/transformers/train.py --compare
"""
import argparse

import torch
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

import flexcp


def flexcp_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     flexcp_mask=None, **kwargs):
    """transformers' attention signature: query [B, Hq, T, D], key/value [B, Hk, T, D] (not
    repeated for GQA); returns [B, T, Hq, D] and no weights. The batch is one packed sequence."""
    if flexcp_mask is None:
        raise ValueError("flexcp attention: pass the packed batch's mask as flexcp_mask=")
    if query.shape[0] != 1:
        raise ValueError(f"flexcp attention: expected one packed sequence, got batch "
                         f"{query.shape[0]}")
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, H, D] views
    out, _ = flexcp.attention(q, k, v, flexcp_mask, scale=scaling)
    return out.unsqueeze(0), None


AttentionInterface.register("flexcp", flexcp_attention)


def packed_batch(doc_lens, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(doc_lens)
    ids = torch.randint(0, vocab, (1, total), generator=g)
    positions = torch.cat([torch.arange(n) for n in doc_lens]).unsqueeze(0)
    labels = ids.clone()
    starts = torch.cumsum(torch.tensor([0] + doc_lens[:-1]), 0)
    labels[0, starts] = -100  # transformers shifts labels; no token predicts a document's first
    return ids, positions, labels


def train(implementation, steps, doc_lens):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512)
    config._attn_implementation = implementation
    model = LlamaForCausalLM(config)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mask = flexcp.masks.varlen_causal(doc_lens)
    ids, positions, labels = packed_batch(doc_lens, config.vocab_size, 1)
    extra = ({"flexcp_mask": mask} if implementation == "flexcp"
             else {"attention_mask": mask.to_dense().view(1, 1, mask.seqlen_q, mask.seqlen_k)})
    losses, grads = [], None
    for _ in range(steps):
        out = model(input_ids=ids, position_ids=positions, labels=labels, **extra)
        opt.zero_grad()
        out.loss.backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(out.loss.item())
    return losses, grads


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--compare", action="store_true")
    a = p.parse_args()
    doc_lens = [37, 120, 5, 64, 30]
    losses, grads = train("flexcp", a.steps, doc_lens)
    for i, loss in enumerate(losses):
        print(f"flexcp step {i} loss {loss:.6f}")
    if a.compare:
        ref_losses, ref_grads = train("sdpa", a.steps, doc_lens)
        worst = max(abs(x - y) for x, y in zip(losses, ref_losses))
        grad_err = max((grads[n] - ref_grads[n]).abs().max().item() /
                       max(ref_grads[n].abs().max().item(), 1e-12) for n in grads)
        print(f"sdpa losses {' '.join(f'{x:.6f}' for x in ref_losses)}")
        print(f"max loss difference {worst:.2e}, max relative gradient difference {grad_err:.2e}")


if __name__ == "__main__":
    main()
