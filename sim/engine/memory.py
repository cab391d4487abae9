"""GPU memory a model deployment takes besides its KV cache, and the longest request it can hold.

vLLM sizes its KV pool as ``gpu_memory_utilization × memory − weights − peak
activation memory − non-torch memory`` (``vllm/v1/worker/gpu_worker.py``,
``determine_available_memory``), having measured the activation peak with a
dummy forward pass of ``max_num_batched_tokens`` tokens. mmsim cannot run that
pass, so it estimates the same peak from the architecture (see
:func:`activation_bytes`); every instance reserves it next to its weights.
"""

from __future__ import annotations

from sim.catalogue import ModelSpec

ACTIVATION_BYTES_PER_VALUE = 2
"""Activations are held at 16 bits (fp16/bf16), whatever the weights' dtype."""

LOGIT_BYTES_PER_VALUE = 4
"""The sampler upcasts logits to fp32."""

NON_TORCH_BYTES = 200 * 2**20
"""cuBLAS/NCCL workspaces and allocator slack outside torch's tensors: vLLM's start-up log reports ~0.19 GiB
("non_torch_memory takes 0.19GiB") for an 8B model on one GPU."""


def activation_bytes(spec: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int, tensor_parallel: int = 1) -> int:
    """Peak activation memory of a forward pass over a full token budget: per batched token, 4 hidden-sized
    tensors (residual stream, normed input, attention output, MLP output) and 4 FFN-sized ones (the SwiGLU MLP's
    fused gate+up output, its activated product and the allocator's copy of it), plus one fp32 row of logits
    per sequence. For Llama-3-8B at 8,192 tokens and 256 sequences this gives 1.25 GiB, where vLLM measures
    "PyTorch activation peak memory takes 1.19GiB". Under tensor parallelism each GPU holds the hidden-sized
    tensors whole and its share of the FFN-sized ones and of the vocabulary."""
    ffn = -(-spec.ffn_size // tensor_parallel)
    per_token = (4 * spec.hidden_size + 4 * ffn) * ACTIVATION_BYTES_PER_VALUE
    logits = max_num_seqs * -(-spec.vocab_size // tensor_parallel) * LOGIT_BYTES_PER_VALUE
    return max_num_batched_tokens * per_token + logits


def reserve_bytes(spec: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int, tensor_parallel: int = 1) -> int:
    """Memory one instance keeps on each of its GPUs apart from weights and KV blocks: its activation peak and
    non-torch memory."""
    return activation_bytes(spec, max_num_batched_tokens, max_num_seqs, tensor_parallel) + NON_TORCH_BYTES


def shard_fractions(spec: ModelSpec, tensor_parallel: int, pipeline_parallel: int) -> tuple[float, float]:
    """The shares of a model's weights and of its KV per token that each GPU of a TP x PP instance holds.

    Weights split evenly. KV heads split over the TP ranks, each rank keeping whole heads (replicated when
    there are fewer KV heads than ranks, as vLLM does), and layers over the PP stages (the largest stage)."""
    if tensor_parallel == 1 and pipeline_parallel == 1:
        return 1.0, 1.0
    heads = -(-spec.num_kv_heads // tensor_parallel)
    layers = -(-spec.num_layers // pipeline_parallel)
    return 1.0 / (tensor_parallel * pipeline_parallel), heads * layers / (spec.num_kv_heads * spec.num_layers)


def fitting_tokens(capacity_bytes: int, resident_bytes: int, block_bytes: int, block_size: int) -> int:
    """Tokens of KV (whole blocks) that fit in ``capacity_bytes`` beside ``resident_bytes`` of weights and reserve."""
    room = capacity_bytes - resident_bytes
    return max(0, room // block_bytes) * block_size
