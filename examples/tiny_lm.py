"""A tiny causal LM for the examples: one pre-norm transformer block over packed sequences.

Attention is the plain reference: causal within each sequence slot of ``cu_seqlens_padded``
(a sample's padding comes after its real tokens, so no real token ever attends to padding), never
across slots. ``attend`` takes the queries' and keys' positions in the packed buffer, so the same
function serves a whole buffer and a context-parallel share whose keys were gathered from its group.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 512       # the byte tokenizer's 256 ids, the image placeholder 256, room to spare
MAX_POSITION = 8192


def attend(q, k, v, q_index, k_index, cu_seqlens_padded):
    """Reference attention of queries at buffer positions ``q_index`` over keys at ``k_index``:
    [tokens, heads, head_dim] each; a query sees the keys of its own slot at or before it."""
    bounds = cu_seqlens_padded.to(torch.long)
    q_slot = torch.searchsorted(bounds, q_index, right=True)
    k_slot = torch.searchsorted(bounds, k_index, right=True)
    allowed = (q_slot[:, None] == k_slot[None, :]) & (k_index[None, :] <= q_index[:, None])
    scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


class TinyLM(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(VOCAB, dim)
        self.position = nn.Embedding(MAX_POSITION, dim)
        self.norm1, self.norm2, self.norm_out = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, VOCAB)

    def qkv_of(self, input_ids, position_ids):
        """The block's input ``x`` and its q, k, v [tokens, heads, head_dim] (per token: no attention yet)."""
        x = self.embed(input_ids.long()) + self.position(position_ids.long().clamp(max=MAX_POSITION - 1))
        q, k, v = self.qkv(self.norm1(x)).view(len(x), 3, self.heads, -1).unbind(dim=1)
        return x, q, k, v

    def finish(self, x, attended):
        """Logits from the block's input and its attention output."""
        x = x + self.proj(attended.reshape(len(x), -1))
        x = x + self.mlp(self.norm2(x))
        return self.head(self.norm_out(x))

    def forward(self, input_ids, position_ids, cu_seqlens_padded):
        """Logits of a whole packed buffer (every position of ``cu_seqlens_padded``)."""
        x, q, k, v = self.qkv_of(input_ids, position_ids)
        index = torch.arange(len(x))
        return self.finish(x, attend(q, k, v, index, index, cu_seqlens_padded))


def loss_sum(logits, labels):
    """Summed next-token cross entropy over the labelled positions (label -100: ignored)."""
    return F.cross_entropy(logits.float(), labels.long(), ignore_index=-100, reduction="sum")


def weights_digest(model: nn.Module) -> str:
    """A digest of every parameter and buffer, by name: two runs' final weights compared bit for bit."""
    import hashlib
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if isinstance(tensor, torch.Tensor):
            digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
