"""A real transformer decoder layer in torch, built from a catalogue architecture with random weights.

The layer is what vLLM-style engines run per decoder block: RMSNorm, fused QKV
projection (with Qwen2's biases or Qwen3's per-head q/k norms when the
architecture has them), rotary embeddings, grouped-query attention over a
preallocated KV cache, output projection, RMSNorm and a SwiGLU MLP with fused
gate/up projection. :class:`LmHead` is the rest of a decode step: embedding
lookup, final norm, LM head and greedy sampling. No weights are downloaded:
values are random in the requested dtype; only shapes and dtype matter for time.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sim.catalogue import ModelSpec
from sim.errors import MmsimError

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
ROPE_THETA = 1_000_000.0  # Qwen2.5 and Qwen3 use 1e6; the value does not change the cost
RANDOM_BLOCK = 1 << 20  # random values generated per tensor; larger tensors repeat the block (fast to fill)


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype for a catalogue dtype name; quantised formats cannot be benchmarked with plain torch."""
    try:
        return TORCH_DTYPES[dtype]
    except KeyError:
        raise MmsimError(f"calibration supports dtypes {', '.join(TORCH_DTYPES)}, not {dtype!r}") from None


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, scale: float = 1.0,
                  seed: int = 0) -> torch.Tensor:
    """Normal(0, scale) values; past one block the block repeats, since drawing gigabytes of randoms is slow."""
    count = math.prod(shape)
    generator = torch.Generator().manual_seed(seed)
    block = (torch.randn(min(count, RANDOM_BLOCK), generator=generator) * scale).to(device=device, dtype=dtype)
    repeats = -(-count // block.numel())
    return block.repeat(repeats)[:count].view(shape)


class Rope:
    """Rotary position embedding tables for positions ``0 .. max_positions-1``."""

    def __init__(self, head_dim: int, max_positions: int, dtype: torch.dtype, device: torch.device):
        inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.cos = angles.cos().to(device=device, dtype=dtype)
        self.sin = angles.sin().to(device=device, dtype=dtype)

    def apply(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Rotate ``x`` of shape [batch, heads, tokens, head_dim] for positions ``start ..``."""
        tokens = x.shape[2]
        cos, sin = self.cos[start:start + tokens], self.sin[start:start + tokens]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


class KVCache:
    """Preallocated K and V of one layer: [batch, kv_heads, max_tokens, head_dim] each."""

    def __init__(self, spec: ModelSpec, batch: int, max_tokens: int, dtype: torch.dtype, device: torch.device):
        shape = (batch, spec.num_kv_heads, max_tokens, spec.head_dim)
        self.k = random_tensor(shape, dtype, device, seed=1)
        self.v = random_tensor(shape, dtype, device, seed=2)


class DecoderLayer:
    """One decoder layer's weights on one device, and its forward pass."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device, seed: int = 0):
        h, d = spec.hidden_size, spec.head_dim
        q_dim, kv_dim = spec.num_heads * d, spec.num_kv_heads * d
        self.spec = spec
        ones = lambda n: torch.ones(n, dtype=dtype, device=device)  # noqa: E731
        self.input_norm, self.post_norm = ones(h), ones(h)
        self.qkv = random_tensor((q_dim + 2 * kv_dim, h), dtype, device, h ** -0.5, seed)
        self.qkv_bias = random_tensor((q_dim + 2 * kv_dim,), dtype, device, 0.02, seed + 1) if spec.qkv_bias else None
        self.q_norm: torch.Tensor | None = ones(d) if spec.qk_norm else None
        self.k_norm: torch.Tensor | None = ones(d) if spec.qk_norm else None
        self.o = random_tensor((h, q_dim), dtype, device, q_dim ** -0.5, seed + 2)
        self.gate_up = random_tensor((2 * spec.ffn_size, h), dtype, device, h ** -0.5, seed + 3)
        self.down = random_tensor((h, spec.ffn_size), dtype, device, spec.ffn_size ** -0.5, seed + 4)

    @property
    def nbytes(self) -> int:
        tensors = [self.input_norm, self.post_norm, self.qkv, self.o, self.gate_up, self.down,
                   self.qkv_bias, self.q_norm, self.k_norm]
        return sum(t.nbytes for t in tensors if t is not None)

    def forward(self, x: torch.Tensor, cache: KVCache, start: int, rope: Rope) -> torch.Tensor:
        """``x``: [batch, tokens, hidden] for positions ``start ..``; writes their K/V into ``cache``.

        Several tokens at once (prefill) must start at position 0: the causal mask is the plain one.
        """
        batch, tokens, _ = x.shape
        if tokens > 1 and start != 0:
            raise ValueError("a multi-token forward pass must start at position 0")
        spec = self.spec
        eps = 1e-6
        q_dim, kv_dim = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        qkv = F.linear(F.rms_norm(x, (spec.hidden_size,), self.input_norm, eps), self.qkv, self.qkv_bias)
        q, k, v = qkv.split([q_dim, kv_dim, kv_dim], dim=-1)
        q = q.view(batch, tokens, spec.num_heads, spec.head_dim).transpose(1, 2)
        k = k.view(batch, tokens, spec.num_kv_heads, spec.head_dim).transpose(1, 2)
        v = v.view(batch, tokens, spec.num_kv_heads, spec.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q = F.rms_norm(q, (spec.head_dim,), self.q_norm, eps)
            k = F.rms_norm(k, (spec.head_dim,), self.k_norm, eps)
        q, k = rope.apply(q, start), rope.apply(k, start)
        end = start + tokens
        cache.k[:, :, start:end] = k
        cache.v[:, :, start:end] = v
        attention = F.scaled_dot_product_attention(q, cache.k[:, :, :end], cache.v[:, :, :end],
                                                   is_causal=tokens > 1, enable_gqa=True)
        x = x + F.linear(attention.transpose(1, 2).reshape(batch, tokens, q_dim), self.o)
        gate, up = F.linear(F.rms_norm(x, (spec.hidden_size,), self.post_norm, eps), self.gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.down)


class LmHead:
    """Everything in a decode step outside the decoder layers: embedding, final norm, LM head, greedy sampling."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device, seed: int = 10):
        self.spec = spec
        self.embedding = random_tensor((spec.vocab_size, spec.hidden_size), dtype, device, 0.02, seed)
        # tied models (Qwen2.5-3B) read the embedding matrix as the LM head
        self.weight = self.embedding if spec.tied_embeddings else random_tensor(
            (spec.vocab_size, spec.hidden_size), dtype, device, spec.hidden_size ** -0.5, seed + 1)
        self.norm = torch.ones(spec.hidden_size, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        extra = 0 if self.spec.tied_embeddings else self.weight.nbytes
        return self.embedding.nbytes + extra + self.norm.nbytes

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids [batch, n] to hidden states [batch, n, hidden]."""
        return F.embedding(tokens, self.embedding)

    def sample(self, hidden: torch.Tensor) -> torch.Tensor:
        """Greedy next token [batch, 1] from the last position of ``hidden`` [batch, n, hidden]."""
        last = F.rms_norm(hidden[:, -1:], (self.spec.hidden_size,), self.norm, 1e-6)
        return F.linear(last, self.weight).argmax(dim=-1)

    def step(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's share of one decode step: sample from ``hidden`` and embed the sampled tokens."""
        return self.embed(self.sample(hidden))


def rotation_count(layer_bytes: float, cache_bytes: int, limit: int) -> int:
    """How many distinct layers to cycle through so their weights do not stay in the last-level cache.

    A real model never reuses a layer's weights within a step; timing one layer
    in a loop would find them cached and read too fast.
    """
    return max(1, min(limit, max(2, math.ceil(2 * cache_bytes / max(layer_bytes, 1.0)))))


def last_level_cache_bytes(device: torch.device) -> int:
    """Size of the cache in front of the device's memory: GPU L2, or the CPU's largest cache level."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).L2_cache_size)
    sizes = [0]
    for level in range(8):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{level}/size") as handle:
                text = handle.read().strip()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes) or 32 * 2**20
