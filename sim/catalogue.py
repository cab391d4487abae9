"""Model catalogue: architectures of common open LLMs and the sizes that follow from them.

A :class:`ModelSpec` is one architecture (from the model's published config);
sizes that depend on the numeric format (weight bytes, KV bytes per token) take
a dtype. Quantised formats store weights at ``bits_per_weight``; the KV cache
stays in 16-bit unless a KV dtype is given (as in vLLM and llama.cpp defaults).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources

import yaml

from sim.errors import MmsimError

BITS_PER_WEIGHT = {"fp32": 32.0, "fp16": 16.0, "bf16": 16.0, "fp8": 8.0, "int8": 8.0, "int4": 4.5, "q4": 4.5}
"""Effective storage bits per weight; 4-bit formats carry ~0.5 bit of scales (GGUF Q4_K, AWQ)."""

KV_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8}


@dataclass(frozen=True)
class ModelSpec:
    """The architecture of one decoder-only transformer."""

    name: str
    hf_id: str
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention, SwiGLU MLP, norms)."""
        h, q_dim, kv_dim = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = h * q_dim + 2 * h * kv_dim + q_dim * h
        if self.qkv_bias:
            attention += q_dim + 2 * kv_dim
        if self.qk_norm:
            attention += 2 * self.head_dim
        mlp = 3 * h * self.ffn_size
        return attention + mlp + 2 * h

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        return self.embedding_params + self.num_layers * self.layer_params + self.hidden_size + self.lm_head_params

    def weight_bytes(self, dtype: str = "fp16") -> int:
        return int(round(self.params * bits_per_weight(dtype) / 8))

    def layer_weight_bytes(self, dtype: str = "fp16") -> float:
        return self.layer_params * bits_per_weight(dtype) / 8

    def kv_bytes_per_token(self, kv_dtype: str = "fp16") -> int:
        """Bytes of K and V cached per token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_bits(kv_dtype) // 8

    def kv_bytes_per_token_per_layer(self, kv_dtype: str = "fp16") -> int:
        return self.kv_bytes_per_token(kv_dtype) // self.num_layers

    @property
    def flops_per_token(self) -> int:
        """Matmul FLOPs per generated token at zero context (2 per weight, LM head included)."""
        return 2 * (self.num_layers * self.layer_params + self.vocab_size * self.hidden_size)

    @property
    def attention_flops_per_token_per_context_token(self) -> int:
        """Extra FLOPs per generated token for each token already in context (QK^T and AV)."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    def describe(self, dtype: str = "fp16", kv_dtype: str = "fp16") -> dict:
        """A JSON-ready description for the given weight and KV dtypes."""
        data = asdict(self)
        data.update(
            dtype=dtype,
            kv_dtype=kv_dtype,
            params=self.params,
            weight_bytes=self.weight_bytes(dtype),
            weight_gib=round(self.weight_bytes(dtype) / 2**30, 3),
            kv_bytes_per_token=self.kv_bytes_per_token(kv_dtype),
            kv_mib_per_token=round(self.kv_bytes_per_token(kv_dtype) / 2**20, 5),
            flops_per_token=self.flops_per_token,
            attention_flops_per_token_per_context_token=self.attention_flops_per_token_per_context_token,
        )
        return data


def bits_per_weight(dtype: str) -> float:
    try:
        return BITS_PER_WEIGHT[dtype]
    except KeyError:
        raise MmsimError(f"unknown dtype {dtype!r}; expected one of {', '.join(BITS_PER_WEIGHT)}") from None


def kv_bits(kv_dtype: str) -> int:
    try:
        return KV_BITS[kv_dtype]
    except KeyError:
        raise MmsimError(f"unknown KV dtype {kv_dtype!r}; expected one of {', '.join(KV_BITS)}") from None


@lru_cache(maxsize=1)
def catalogue() -> dict[str, ModelSpec]:
    """All built-in models by name."""
    text = resources.files("sim").joinpath("data/models.yaml").read_text()
    return {name: ModelSpec(name=name, **fields) for name, fields in yaml.safe_load(text).items()}


def get_model(name: str) -> ModelSpec:
    """The catalogue entry for ``name``; an unknown name is a user error listing the known ones."""
    models = catalogue()
    if name not in models:
        raise MmsimError(f"unknown model {name!r}; known models: {', '.join(sorted(models))}")
    return models[name]
