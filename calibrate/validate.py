"""Check a profile against reality: a real torch decode loop vs. what the simulator's cost model predicts.

The loop runs the first ``layers`` decoder layers of a catalogue model (random
weights, the profile's dtype), the last ``cpu_layers`` of them on the CPU when
asked (hidden states hop device -> CPU -> device as in layer offloading), with a
real KV cache that grows every step, plus the LM head and greedy sampling. The
prediction is ``sim.costs.ModelCosts`` on the same architecture cut to
``layers`` layers: the very code path the simulator charges decode steps with
(``step_coefficients`` summed over the growing context), and ``prefill_s`` for
the prompt.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from calibrate.layers import DecoderLayer, KVCache, LmHead, Rope, torch_dtype
from calibrate.timing import Timing, configured, synchronize, wall_time
from sim.catalogue import ModelSpec, get_model
from sim.costs import ModelCosts
from sim.errors import MmsimError
from sim.profile import Profile

TARGET_ERROR_PCT = 10.0
CPU = torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class LoopShape:
    """What the decode loop runs."""

    layers: int
    cpu_layers: int
    batch: int
    prompt_tokens: int
    new_tokens: int

    @property
    def gpu_share(self) -> float:
        return (self.layers - self.cpu_layers) / self.layers


class PartialModel:
    """The first layers of a model, some possibly on the CPU, with its LM head on the main device."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device, shape: LoopShape):
        on_device = shape.layers - shape.cpu_layers
        self.head_device = device if on_device > 0 else CPU
        self.spec, self.dtype = spec, dtype
        self.devices = [device] * on_device + [CPU] * shape.cpu_layers
        self.layers = [DecoderLayer(spec, dtype, d, seed=10 * i) for i, d in enumerate(self.devices)]
        positions = shape.prompt_tokens + shape.new_tokens
        self.ropes = {d: Rope(spec.head_dim, positions, dtype, d) for d in set(self.devices)}
        self.head = LmHead(spec, dtype, self.head_device)

    def caches(self, batch: int, tokens: int) -> list[KVCache]:
        return [KVCache(self.spec, batch, tokens, self.dtype, d) for d in self.devices]

    def forward(self, x: torch.Tensor, caches: list[KVCache], start: int) -> torch.Tensor:
        for layer, cache, device in zip(self.layers, caches, self.devices):
            x = layer.forward(x.to(device), cache, start, self.ropes[device])
        return x.to(self.head_device)

    def prefill(self, prompt: torch.Tensor, caches: list[KVCache]) -> torch.Tensor:
        """Run the prompt [batch, tokens] and return the first sampled tokens [batch, 1]."""
        return self.head.sample(self.forward(self.head.embed(prompt), caches, 0))

    def decode(self, tokens: torch.Tensor, caches: list[KVCache], start: int, steps: int) -> list[float]:
        """``steps`` greedy decode steps from position ``start`` (the KV cache grows by one token per step); seconds of each."""
        times = []
        for step in range(steps):
            begin = time.perf_counter()
            tokens = self.head.sample(self.forward(self.head.embed(tokens), caches, start + step))
            self.synchronize()
            times.append(time.perf_counter() - begin)
        return times

    def synchronize(self) -> None:
        for device in set(self.devices) | {self.head_device}:
            synchronize(device)


def predict(profile: Profile, spec: ModelSpec, dtype: str, shape: LoopShape) -> tuple[float, float]:
    """(decode seconds for the whole loop, prefill seconds of one prompt) from the simulator's cost model."""
    costs = ModelCosts(profile, dataclasses.replace(spec, num_layers=shape.layers), dtype)
    coefficients = costs.step_coefficients(shape.batch, shape.gpu_share)
    decode = coefficients.steps_s(shape.batch * shape.prompt_tokens, shape.batch, shape.new_tokens)
    return decode, costs.prefill_s(shape.prompt_tokens, shape.gpu_share)


def measure_loop(spec: ModelSpec, dtype: str, device: torch.device, shape: LoopShape, repeats: int,
                 threads: int | None = None) -> dict:
    """Seconds of the decode loop and of one prompt's prefill over ``repeats`` runs.

    The loop's time is the sum over steps of each step's typical time across
    runs (the statistic calibration uses), so a burst of load from another
    process spoils one step of one run, not the whole comparison.
    """
    with configured(device, threads), torch.inference_mode():
        model = PartialModel(spec, torch_dtype(dtype), device, shape)
        generator = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, spec.vocab_size, (shape.batch, shape.prompt_tokens), generator=generator)
        prompt = prompt.to(model.head_device)
        prefill_runs = _time_prefill(model, prompt[:1], repeats)
        caches = model.caches(shape.batch, shape.prompt_tokens + shape.new_tokens)
        first = model.prefill(prompt, caches)
        model.decode(first, caches, shape.prompt_tokens, min(2, shape.new_tokens))  # warm-up
        runs = [model.decode(first, caches, shape.prompt_tokens, shape.new_tokens) for _ in range(repeats)]
        torch_threads = torch.get_num_threads()
    steps = [Timing.of([run[i] for run in runs], device) for i in range(shape.new_tokens)]
    prefill = Timing.of(prefill_runs, device)
    return {"decode_runs_s": [sum(run) for run in runs], "prefill_runs_s": prefill_runs, "statistic": prefill.statistic,
            "torch_threads": torch_threads,
            "decode_s": sum(step.typical_s for step in steps), "prefill_s": prefill.typical_s}


def _time_prefill(model: PartialModel, prompt: torch.Tensor, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` prefills of one prompt (after a warm-up), into caches of its own."""
    caches = model.caches(1, prompt.shape[1])
    model.prefill(prompt, caches)

    def prefill() -> None:  # wall_time synchronises one device; the model may span two
        model.prefill(prompt, caches)
        model.synchronize()

    runs = []
    for _ in range(repeats):
        model.synchronize()
        runs.append(wall_time(prefill, CPU))
    return runs


def choose_model(profile: Profile, name: str | None) -> ModelSpec:
    """The named catalogue model, or else the smallest one whose device costs the profile measured."""
    if name is not None:
        return get_model(name)
    measured = [get_model(n) for n, costs in profile.models.items() if costs.gpu.source == "measured"]
    if not measured:
        raise MmsimError(f"profile {profile.name!r} has no measured model; pass --model")
    return min(measured, key=lambda spec: spec.params)


def profile_threads(profile: Profile) -> int | None:
    """The torch CPU thread count the profile was measured with, if it says."""
    recorded = profile.hardware.software.get("torch_threads", "")
    return int(recorded) if recorded.isdigit() else None


def validate(profile: Profile, spec: ModelSpec, device: torch.device, shape: LoopShape, repeats: int,
             threads: int | None = None) -> dict:
    """Run the loop, predict it, and compare: tokens/s both ways and the signed error in percent.

    The loop runs with ``threads`` CPU threads, by default as many as the profile was measured with.
    """
    if not 0 <= shape.cpu_layers <= shape.layers or shape.layers < 1:
        raise MmsimError(f"need 1 <= layers and 0 <= cpu-layers <= layers (got {shape.layers} and {shape.cpu_layers})")
    if min(shape.batch, shape.prompt_tokens, shape.new_tokens, repeats) < 1:
        raise MmsimError("batch, prompt tokens, new tokens and repeats must be at least 1")
    if shape.layers > spec.num_layers:
        raise MmsimError(f"{spec.name} has {spec.num_layers} layers; --layers {shape.layers} is too many")
    entry = profile.models.get(spec.name)
    dtype = entry.dtype if entry else "fp16"
    predicted_decode, predicted_prefill = predict(profile, spec, dtype, shape)
    threads = threads or profile_threads(profile)
    try:
        measured = measure_loop(spec, dtype, device, shape, repeats, threads)
    except (torch.OutOfMemoryError, RuntimeError) as failure:
        if not isinstance(failure, torch.OutOfMemoryError) and "can't allocate memory" not in str(failure):
            raise
        raise MmsimError(f"the loop does not fit in {device}'s memory: {shape.batch} sequences of "
                         f"{shape.prompt_tokens} + {shape.new_tokens} tokens over {shape.layers} layers; "
                         "give a smaller --batch, --prompt-tokens, --new-tokens or --layers") from None
    tokens = shape.batch * shape.new_tokens
    measured_rate, predicted_rate = tokens / measured["decode_s"], tokens / predicted_decode
    error = (predicted_rate - measured_rate) / measured_rate * 100
    return {
        "profile": profile.name, "model": spec.name, "dtype": dtype, "device": str(device),
        "model_costs_source": entry.gpu.source if entry else "estimated (roofline of the profile's hardware)",
        **dataclasses.asdict(shape), "gpu_share": shape.gpu_share, "repeats": repeats,
        "measured_tokens_per_s": measured_rate, "predicted_tokens_per_s": predicted_rate, "error_pct": error,
        "within_target": abs(error) <= TARGET_ERROR_PCT, "target_pct": TARGET_ERROR_PCT,
        "measured_decode_s": measured["decode_s"], "predicted_decode_s": predicted_decode,
        "measured_prefill_s": measured["prefill_s"], "predicted_prefill_s": predicted_prefill,
        "prefill_error_pct": (predicted_prefill - measured["prefill_s"]) / measured["prefill_s"] * 100,
        "decode_runs_s": measured["decode_runs_s"], "prefill_runs_s": measured["prefill_runs_s"],
        "statistic": measured["statistic"], "torch_threads": measured["torch_threads"],
    }
