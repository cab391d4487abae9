"""Cost model: what the engine charges for compute, KV transfers and weight movement.

One :class:`ModelCosts` answers every timing question about one model (at one
dtype) on one profile's hardware. Per-layer costs come from the profile when it
has the model (measured, published or derived; at another dtype than the
entry's, scaled by what the dtype changes: :func:`entry_at_dtype`) and from a
roofline estimate of the profile's GPU and CPU otherwise.

Decode of B sequences holding C context tokens in total, with n_gpu of the L
layers on the GPU (share g = n_gpu / L)::

    t = n_gpu * t_gpu(B, C) + n_cpu * t_cpu(B, C) + boundary (if split) + head

A measured offload curve, when the profile has one, replaces the split terms:
``t = t_all_gpu(B, C) / curve(g)``. Each step also pays the serving engine's CPU
overhead, ``fixed + per_seq * S`` for S sequences in the step. Per-layer decode
and head costs are affine in B, or, where the profile measured a batch grid,
interpolated between its batch sizes: either way every decode step time is
affine in C at a fixed batch size, so a run of k steps whose context grows by B
per step has a closed-form sum; the engine's fast-forward relies on that.

Prefill of several sequences in one step pays attention per sequence:
``sum_i (P_i^2 + 2 P_i C_i)`` for chunks of P_i tokens over C_i cached ones.

A layer on the CPU is never cheaper than on the GPU, term by term, unless the
profile measured the CPU: estimated or derived CPU costs are raised to the GPU's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim import profile as prof
from sim.catalogue import ModelSpec, bits_per_weight, default_kv_dtype, kv_bits
from sim.layer_costs import (ROOFLINE_NOTE, BatchCurve, PrefillLayer, cpu_figures, cpu_raised_to_gpu, estimate_layer_cost,
                             excess, gpu_figures, layer_at_dtype, layer_curves, streamed)

GIB = 2**30


@dataclass(frozen=True)
class StepCoefficients:
    """A decode step time ``base_s + per_context_token_s * C`` for a fixed batch size and placement."""

    base_s: float
    per_context_token_s: float

    def step_s(self, context_tokens: float) -> float:
        return self.base_s + self.per_context_token_s * context_tokens

    def steps_s(self, context_tokens: float, batch: int, steps: int) -> float:
        """Sum of ``steps`` consecutive steps, context growing by ``batch`` tokens per step."""
        # step_s(context_tokens), written out: this runs several times per simulated step.
        first_s = self.base_s + self.per_context_token_s * context_tokens
        return steps * first_s + self.per_context_token_s * batch * steps * (steps - 1) / 2


def entry_at_dtype(entry: prof.ModelCosts, dtype: str, profile: prof.Profile) -> prof.ModelCosts:
    """A profile's entry for a model, measured (or derived) at ``entry.dtype``, priced at weight dtype ``dtype``.

    Same weight and default KV widths (fp16 and bf16; fp8 and int8; int4 and q4): the same bytes move and the same
    FLOPs run, so the entry applies as it is. Otherwise each term changes by what the dtype changes: the weights'
    streaming (per-layer bases less their launch, the LM head's intercept, the measured reload and unload less the
    profile's fixed parts) by the weight bytes; context tokens' KV reads by the default KV cache's bytes (a KV
    dtype of its own is applied on top, by ``_kv_read_share``); compute (per-sequence and per-token terms) kept, which
    is conservative; the engine's step overhead, the offload curve, the hidden states' hand-off and the KV copies'
    fixed costs kept: no weights move in them."""
    weights = bits_per_weight(dtype) / bits_per_weight(entry.dtype)
    kv = kv_bits(default_kv_dtype(dtype)) / kv_bits(default_kv_dtype(entry.dtype))
    if weights == 1.0 and kv == 1.0:
        return entry
    note = f"scaled from {entry.dtype} to {dtype}: weight streaming x{weights:g}, KV reads x{kv:g}, compute kept"
    launch = profile.gpu_launch_overhead_s
    update: dict[str, object] = {"dtype": dtype, "gpu": layer_at_dtype(entry.gpu, weights, kv, launch, note)}
    if entry.cpu is not None:
        update["cpu"] = layer_at_dtype(entry.cpu, weights, kv, 0.0, note)  # a CPU layer has no kernel launch
    for device, head_launch in (("gpu", launch), ("cpu", 0.0)):
        # The head's intercept streams its weights (at every batch: the grid moves by as much); per sequence, compute.
        head_s: float = getattr(entry, f"head_{device}_s")
        shift = streamed(head_s, head_launch, weights) - head_s
        update[f"head_{device}_s"] = head_s + shift
        update[f"head_{device}_grid"] = [point.model_copy(update={"seconds": max(0.0, point.seconds + shift)})
                                         for point in getattr(entry, f"head_{device}_grid")]
    if entry.swap is not None:
        moved = profile.weights
        update["swap"] = entry.swap.model_copy(update={
            "reload_s": streamed(entry.swap.reload_s, moved.from_disk.fixed_s, weights),
            "unload_s": streamed(entry.swap.unload_s, moved.unload.fixed_s, weights),
            "note": f"{entry.swap.note}; {note}" if entry.swap.note else note})
    return entry.model_copy(update=update)


class ModelCosts:
    """Timing of one model (at one dtype) on one profile's hardware, on one GPU or split tensor- and
    pipeline-parallel over ``tensor_parallel`` x ``pipeline_parallel`` GPUs (see docs/parallel.md)."""

    def __init__(self, profile: prof.Profile, spec: ModelSpec, dtype: str = "fp16", kv_dtype: str | None = None,
                 tensor_parallel: int = 1, pipeline_parallel: int = 1, stages_cross_nodes: bool = False,
                 gpu_slowdown: float = 1.0):
        self.profile = profile
        # A MIG slice has a share of the GPU's SMs and memory bandwidth: the GPU's work (its layers and the head on
        # it) takes the inverse of that share longer. The CPU's (offloaded layers, the engine's per-step overhead)
        # and the links' do not.
        self._gpu_slowdown: float = gpu_slowdown
        self.spec = spec
        self.dtype = dtype
        entry = profile.models.get(spec.name)
        if entry is not None:
            entry = entry_at_dtype(entry, dtype, profile)
        self.entry = entry
        launch = profile.gpu_launch_overhead_s
        gpu_bw, gpu_flops = gpu_figures(profile)
        cpu_bw, cpu_flops = cpu_figures(profile)
        self.gpu = entry.gpu if entry else estimate_layer_cost(spec, dtype, gpu_bw, gpu_flops, launch, ROOFLINE_NOTE)
        cpu = (entry.cpu if entry and entry.cpu else
               estimate_layer_cost(spec, dtype, cpu_bw, cpu_flops, 0.0, ROOFLINE_NOTE))
        head_bytes = spec.vocab_size * spec.hidden_size * spec.weight_bytes(dtype) / spec.params
        head_gpu = (BatchCurve(entry.head_gpu_s, entry.head_gpu_per_seq_s, [(p.batch, p.seconds) for p in entry.head_gpu_grid])
                    if entry else BatchCurve(head_bytes / gpu_bw + launch, 0.0, []))
        head_cpu = (BatchCurve(entry.head_cpu_s, entry.head_cpu_per_seq_s, [(p.batch, p.seconds) for p in entry.head_cpu_grid])
                    if entry and entry.cpu else BatchCurve(head_bytes / cpu_bw, 0.0, []))
        self.boundary_s = entry.boundary_s if entry else 0.0
        self.gpu_decode = layer_curves(self.gpu)
        if entry is not None and entry.cpu is not None and entry.cpu.source == "measured":
            self.cpu, self.cpu_decode = cpu, layer_curves(cpu)
        else:
            # Unmeasured (estimated or derived) CPU costs: the GPU's curves plus the CPU's excess over them, term
            # by term, so a layer (and each sequence and context token in it) never costs less on the CPU; with
            # every layer there, the head there costs at least the GPU's head plus the hand-off it saves.
            self.cpu = cpu_raised_to_gpu(cpu, self.gpu)
            g, c = self.gpu, cpu
            base, context = self.gpu_decode
            self.cpu_decode = (base.raised(excess(c.decode_base_s, g.decode_base_s), excess(c.decode_per_seq_s, g.decode_per_seq_s)),
                               context.raised(excess(c.decode_per_context_token_s, g.decode_per_context_token_s), 0.0))
            head_cpu = head_gpu.raised(self.boundary_s + excess(head_cpu.intercept, head_gpu.intercept + self.boundary_s),
                                       excess(head_cpu.slope, head_gpu.slope))
        self.head_gpu, self.head_cpu = head_gpu, head_cpu
        self.head_gpu_s, self.head_cpu_s = head_gpu.at(0), head_cpu.at(0)
        self.head_gpu_per_seq_s = head_gpu.slope
        self.head_cpu_per_seq_s = head_cpu.slope + head_cpu.offset[1]
        overhead = (entry.step_overhead if entry and entry.step_overhead else profile.step_overhead)
        self.step_overhead_s: float = overhead.fixed_s if overhead else 0.0
        self.step_overhead_per_seq_s: float = overhead.per_seq_s if overhead else 0.0
        curve = entry.offload_curve if entry else None
        self._curve = (np.array([p.gpu_share for p in curve.points]), np.array([p.normalized_throughput for p in curve.points])) if curve else None
        if self._curve is not None:
            order = np.argsort(self._curve[0])
            self._curve = (self._curve[0][order], self._curve[1][order])
        self._coefficients: dict[int, StepCoefficients] = {}
        self._prefill_fixed: dict[int, float] = {}
        # Reload and unload seconds by GPU share (reloads from disk, from host RAM): policies price them for every
        # victim they weigh, and each price read the profile's models field by field.
        self._reload_from_disk_s: dict[float, float] = {}
        self._reload_from_host_s: dict[float, float] = {}
        self._unload_s: dict[float, float] = {}
        # The figures every step reads, copied out of the profile's models once (native fields when compiled).
        self._layers: int = spec.num_layers
        self.kv_dtype = kv_dtype or default_kv_dtype(dtype)
        self._kv_bytes_per_token: int = spec.kv_bytes_per_token(self.kv_dtype)
        # Sizes from the architecture, summed once: policies price reloads and unloads for every victim they weigh.
        self._weight_bytes: int = spec.weight_bytes(dtype)
        self._layer_weight_bytes: float = spec.layer_weight_bytes(dtype)
        self._init_parallel(profile, spec, dtype, tensor_parallel, pipeline_parallel, stages_cross_nodes)
        self._gpu_prefill = PrefillLayer(self.gpu)
        self._cpu_prefill = PrefillLayer(self.cpu)

    def _init_parallel(self, profile: prof.Profile, spec: ModelSpec, dtype: str, tensor_parallel: int,
                       pipeline_parallel: int, stages_cross_nodes: bool) -> None:
        self._tp: int = tensor_parallel
        self._pp: int = pipeline_parallel
        # A decode step reads each context token's KV: scaled by the KV dtype against the one the layer costs
        # were measured or estimated at, and by the share of KV heads a tensor-parallel rank keeps.
        heads = -(-spec.num_kv_heads // tensor_parallel)
        self._kv_read_share: float = (kv_bits(self.kv_dtype) / kv_bits(default_kv_dtype(dtype))) * heads / spec.num_kv_heads
        self._launch_s: float = profile.gpu_launch_overhead_s
        hardware = profile.hardware
        self._interconnect = hardware.interconnect or prof.DEFAULT_INTERCONNECT
        self._stage_link = (hardware.network or prof.DEFAULT_NETWORK) if stages_cross_nodes else self._interconnect
        self._activation_bytes_per_token: int = 2 * spec.hidden_size  # fp16/bf16 hidden states

    def _split(self, seconds: float) -> float:
        """One tensor-parallel rank's time for a GPU layer's (or the head's) work: the matrix work is divided
        among the ranks; the fixed launch cost is every rank's."""
        if self._tp == 1:
            return seconds
        launch = min(seconds, self._launch_s)
        return launch + (seconds - launch) / self._tp

    def parallel_comm_s(self, tokens: float) -> float:
        """Communication of one (micro-)batch of ``tokens`` tokens through the model: two ring all-reduces of their
        activations per layer across the tensor-parallel ranks (after attention and after the MLP), and one
        hand-off between each pair of consecutive pipeline stages."""
        if self._tp == 1 and self._pp == 1:
            return 0.0
        activation_bytes = tokens * self._activation_bytes_per_token
        seconds = 0.0
        if self._tp > 1:
            link, tp = self._interconnect, self._tp
            seconds += 2 * self._layers * (link.latency_s + 2 * (tp - 1) / tp * activation_bytes / link.bandwidth_bytes_per_s)
        if self._pp > 1:
            stage = self._stage_link
            seconds += (self._pp - 1) * (stage.latency_s + activation_bytes / stage.bandwidth_bytes_per_s)
        return seconds

    def _micro_batch(self, sequences: int, in_step: int) -> tuple[int, float]:
        """How many of a step's ``sequences`` decodes (or chunks) the largest of its ``min(pp, in_step)`` micro-batches
        in flight (vLLM's virtual engines, of whole sequences, as even as they allow) holds, and its share of them."""
        if self._pp == 1 or sequences == 0:
            return sequences, 1.0
        largest = -(-sequences // min(self._pp, in_step))
        return largest, largest / sequences

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self._layers

    def gpu_layers(self, gpu_share: float) -> int:
        if gpu_share == 1.0:  # nearly every call
            return self._layers
        return int(round(gpu_share * self._layers))

    @property
    def kv_bytes_per_token(self) -> int:
        return self._kv_bytes_per_token

    def weight_bytes(self) -> int:
        return self._weight_bytes

    def cpu_weight_bytes(self, gpu_share: float = 1.0) -> int:
        """Weights kept on the CPU, in host RAM, when ``gpu_share`` of the layers are on the GPU."""
        return self._weight_bytes - self.gpu_weight_bytes(gpu_share)

    def gpu_weight_bytes(self, gpu_share: float = 1.0) -> int:
        """Weights resident on the GPU when ``gpu_share`` of the layers are there: embeddings and head stay on the
        GPU with any layer, and with none (a share that rounds to no layer) run on the CPU, as the step prices them."""
        on_gpu = self.gpu_layers(gpu_share)
        layers = self._layer_weight_bytes * on_gpu
        rest = self._weight_bytes - self._layer_weight_bytes * self._layers
        return int(layers + (rest if on_gpu > 0 else 0))

    # -- compute -------------------------------------------------------------------------------
    def step_coefficients(self, batch: int, gpu_share: float = 1.0) -> StepCoefficients:
        """Decode step time for ``batch`` sequences as an affine function of total context (overhead included)."""
        n_gpu = self.gpu_layers(gpu_share)
        key = batch * (self._layers + 1) + n_gpu  # (batch, n_gpu) as one int: cheaper to hash than a tuple
        cached = self._coefficients.get(key)
        if cached is not None:
            return cached
        n_cpu = self._layers - n_gpu
        if self._curve is not None:
            factor = 1.0 / float(np.interp(n_gpu / self._layers, *self._curve))
            n_gpu, n_cpu, boundary = self._layers, 0, 0.0
        else:
            factor, boundary = 1.0, (self.boundary_s if 0 < n_gpu < self._layers else 0.0)
        micro, share = self._micro_batch(batch, batch)
        (g_base, g_context), (c_base, c_context) = self.gpu_decode, self.cpu_decode
        slow = self._gpu_slowdown
        base = (n_gpu * self._split(g_base.at(micro)) * slow + n_cpu * c_base.at(micro) + boundary
                + self._head_s(n_gpu > 0, micro) + self.parallel_comm_s(micro))
        # The largest micro-batch holds its share of the context (exactly 1 without a pipeline).
        per_context = (n_gpu * g_context.at(micro) * slow + n_cpu * c_context.at(micro)) * self._kv_read_share * share
        # The engine's CPU overhead does not move with the layers: the offload curve does not scale it.
        result = StepCoefficients(base * factor + self._overhead_s(batch), per_context * factor)
        self._coefficients[key] = result
        return result

    def _head_s(self, on_gpu: bool, batch: int) -> float:
        """LM head + sampling for one step of ``batch`` sequences, on the GPU or (all layers offloaded) the CPU."""
        return self._split(self.head_gpu.at(batch)) * self._gpu_slowdown if on_gpu else self.head_cpu.at(batch)

    def _overhead_s(self, sequences: int) -> float:
        """The serving engine's CPU time for one step holding ``sequences`` sequences, outside the forward pass."""
        return self.step_overhead_s + self.step_overhead_per_seq_s * sequences

    def decode_step_s(self, batch: int, context_tokens: float, gpu_share: float = 1.0) -> float:
        return self.step_coefficients(batch, gpu_share).step_s(context_tokens)

    def prefill_s(self, tokens: int, gpu_share: float = 1.0, context_before: int = 0) -> float:
        """A step with one prefill of ``tokens`` new tokens that attend to ``context_before`` cached ones."""
        return self._prefill_step_s(tokens, tokens * tokens + 2 * tokens * context_before, 1, gpu_share)

    def _prefill_step_s(self, tokens: int, quadratic: int, sequences: int, gpu_share: float) -> float:
        """A step of ``sequences`` prefill chunks, ``tokens`` in all, with attention term ``quadratic``."""
        if self._pp > 1:
            return self._pipelined_s(0, 0.0, tokens, quadratic, sequences)
        n_gpu = self.gpu_layers(gpu_share)
        n_cpu = self._layers - n_gpu
        boundary = self.boundary_s if 0 < n_gpu < self._layers else 0.0
        # Head and overhead depend on the chunk count alone: cached, since every prefill step asks.
        key = 2 * sequences + (n_gpu > 0)
        fixed = self._prefill_fixed.get(key)
        if fixed is None:
            fixed = self._prefill_fixed[key] = self._head_s(n_gpu > 0, sequences) + self._overhead_s(sequences)
        return (n_gpu * self._split(self._gpu_prefill.seconds(tokens, quadratic)) * self._gpu_slowdown
                + n_cpu * self._cpu_prefill.seconds(tokens, quadratic) + boundary + fixed + self.parallel_comm_s(tokens))

    def mixed_step_s(self, batch: int, context_tokens: float, prefill_tokens: int, prefill_quadratic: int,
                     prefills: int, gpu_share: float = 1.0) -> float:
        """One iteration holding ``batch`` decodes over ``context_tokens`` and ``prefills`` prefill chunks of
        ``prefill_tokens`` tokens in all, whose attention term is ``prefill_quadratic`` = sum of
        P_i^2 + 2 P_i C_i over the chunks (chunk P_i over C_i cached tokens): fixed costs are paid once."""
        if prefills == 0:
            return self.decode_step_s(batch, context_tokens, gpu_share)
        if self._pp > 1:
            mixed_s = self._pipelined_s(batch, context_tokens, prefill_tokens, prefill_quadratic, prefills)
            if batch == 0:
                return mixed_s
            decode_s = self.decode_step_s(batch, context_tokens, gpu_share)
        else:
            prefill_s = self._prefill_step_s(prefill_tokens, prefill_quadratic, prefills, gpu_share)
            if batch == 0:
                return prefill_s
            decode_s = self.decode_step_s(batch, context_tokens, gpu_share)
            overlap_s = self.step_coefficients(0, gpu_share).base_s  # an empty decode step: its context term is 0
            mixed_s = prefill_s + decode_s - overlap_s
        # A step with chunks added never costs less than its decodes alone (physics never inverts): fitted apart from
        # decode steps, a prefill's fixed cost can come out below the empty decode step the sum takes off, and a
        # pipeline's even shares of context move with the chunks.
        return mixed_s if mixed_s >= decode_s else decode_s

    def _pipelined_s(self, batch: int, context_tokens: float, prefill_tokens: int, prefill_quadratic: int,
                     prefills: int) -> float:
        """:meth:`mixed_step_s` under a pipeline: the pass through every stage of a micro-batch of as many decodes and
        chunks as the largest hold, with their shares of context and chunk tokens (docs/parallel.md); CPU overhead
        for every sequence. Parallel instances are never offloaded: every layer is on a GPU."""
        sequences = batch + prefills
        decodes, decode_share = self._micro_batch(batch, sequences)
        chunks, chunk_share = self._micro_batch(prefills, sequences)
        tokens = prefill_tokens * chunk_share
        base, context = self.gpu_decode
        split, head, comm = self._split, self.head_gpu.at, self.parallel_comm_s
        # The terms of mixed_step_s (a prefill step plus a decode step less what they share), per micro-batch.
        layer_s = (split(self._gpu_prefill.seconds(tokens, prefill_quadratic * chunk_share)) + split(base.at(decodes))
                   - split(base.at(0)) + context.at(decodes) * self._kv_read_share * context_tokens * decode_share)
        gpu_s = self._layers * layer_s + split(head(chunks)) + split(head(decodes)) - split(head(0))
        return gpu_s * self._gpu_slowdown + comm(tokens) + comm(decodes) - comm(0) + self._overhead_s(sequences)

    # -- movement ------------------------------------------------------------------------------
    def kv_transfer_s(self, tokens: int, direction: str) -> float:
        """Move ``tokens`` tokens of KV cache; direction is ``device_to_host`` or ``host_to_device``."""
        if tokens <= 0:
            return 0.0
        fit: prof.TransferFit = getattr(self.profile.link, direction)
        override = self.entry.kv_transfer if self.entry else None
        fixed = getattr(override, f"{direction}_s") if override else fit.latency_s + 2 * self._layers * fit.per_copy_latency_s
        return fixed + tokens * self.kv_bytes_per_token / fit.bandwidth_bytes_per_s

    def reload_s(self, gpu_share: float = 1.0, from_host: bool = False) -> float:
        """Load the GPU-resident part of the weights, from disk or from a host-RAM copy."""
        known = self._reload_from_host_s if from_host else self._reload_from_disk_s
        seconds = known.get(gpu_share)
        if seconds is None:
            seconds = known[gpu_share] = self._reload_seconds(gpu_share, from_host)
        return seconds

    def _reload_seconds(self, gpu_share: float, from_host: bool) -> float:
        fraction = self.gpu_weight_bytes(gpu_share) / self.weight_bytes()
        if fraction == 0:
            return 0.0
        fit = self.profile.weights.from_host if from_host else self.profile.weights.from_disk
        swap = self.entry.swap if self.entry else None
        if swap is not None and not from_host:
            fixed = min(fit.fixed_s, swap.reload_s)
            return fixed + (swap.reload_s - fixed) * fraction
        return fit.fixed_s + self.gpu_weight_bytes(gpu_share) / fit.bandwidth_bytes_per_s

    def unload_s(self, gpu_share: float = 1.0) -> float:
        seconds = self._unload_s.get(gpu_share)
        if seconds is None:
            seconds = self._unload_s[gpu_share] = self._unload_seconds(gpu_share)
        return seconds

    def _unload_seconds(self, gpu_share: float) -> float:
        fraction = self.gpu_weight_bytes(gpu_share) / self.weight_bytes()
        if fraction == 0:
            return 0.0
        fit = self.profile.weights.unload
        swap = self.entry.swap if self.entry else None
        if swap is not None:
            fixed = min(fit.fixed_s, swap.unload_s)
            return fixed + (swap.unload_s - fixed) * fraction
        return fit.fixed_s + fit.seconds_per_gib * self.gpu_weight_bytes(gpu_share) / GIB

    def swap_penalty_s(self) -> float:
        """Unload plus reload from disk: the paper's per-(model, hardware) preemption constant."""
        return self.unload_s() + self.reload_s()
