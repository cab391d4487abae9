"""The speed a real engine ran a replay at, against its profile, and the profile at that speed.

On a shared machine the same step runs 10-20% slower or faster from one minute to the next, and not alike
for all work: with other processes on the machine, this 2-core VM's decode steps (short, bound by memory
and per-step overhead) slowed by 17-24% while steps holding prefills (long, compute-bound) slowed by 1-8%.
Errors against a calibration made minutes earlier mix that drift with the simulator's own. Two numbers
from the replay's own steps take it out: how much slower (> 1) or faster than the profile prices them the
engine ran its decode work, and its prefill work. The simulator at those speeds is then wrong only where
its batching, queueing or the shape of its costs is: ``validate vllm`` reports both errors.
"""

from __future__ import annotations

from calibrate.vllm_calibrate import predicted_step_s, step_sample
from calibrate.vllm_engine import StepRecord
from sim.catalogue import ModelSpec
from sim.costs import ModelCosts
from sim.profile import parse_profile

NOT_STEP_COSTS = ("swap", "kv_transfer", "samples")
"""What a model's entry holds besides step costs: reload and KV-transfer times (they move no step) and the
samples, kept as measured."""


def scaled_step_costs(entry, factor: float, prefill_factor: float | None = None):
    """A profile section with every step-cost time in it (keys ending ``_s``, a head grid's ``seconds``)
    multiplied by ``factor``, the prefill terms of its layer costs (``prefill_*``) by ``prefill_factor``
    (``factor`` if not given)."""
    prefill_factor = factor if prefill_factor is None else prefill_factor
    if isinstance(entry, list):
        return [scaled_step_costs(item, factor, prefill_factor) for item in entry]
    if not isinstance(entry, dict):
        return entry
    scaled = {}
    for key, value in entry.items():
        if key in NOT_STEP_COSTS:
            scaled[key] = value
        elif isinstance(value, float) and (key.endswith("_s") or key == "seconds"):
            scaled[key] = value * (prefill_factor if key.startswith("prefill_") else factor)
        else:
            scaled[key] = scaled_step_costs(value, factor, prefill_factor)
    return scaled


def with_step_costs_scaled(data: dict, model: str, decode_factor: float, prefill_factor: float) -> dict:
    """Profile ``data`` with ``model``'s step costs scaled (:func:`scaled_step_costs`), and the profile's own
    per-step overhead, which prices the model's steps where it has none of its own."""
    scaled = dict(data, models={**data["models"], model: scaled_step_costs(data["models"][model], decode_factor,
                                                                            prefill_factor)})
    if data.get("step_overhead"):
        scaled["step_overhead"] = scaled_step_costs(data["step_overhead"], decode_factor)
    return scaled


def replay_speed(steps: list[StepRecord], data: dict, spec: ModelSpec, dtype: str) -> tuple[float, float]:
    """How many times the profile's price the engine took for the replay's decode work and for its prefill work.

    Decode: the decode-only steps' seconds over their price. Prefill: what the steps holding prefills took
    beyond the rest of their price at the decode speed, over the price of their prefill terms. Together they
    account for every second of the replay's steps."""
    costs = ModelCosts(parse_profile(data, "replay speed"), spec, dtype)
    doubled = ModelCosts(parse_profile(with_step_costs_scaled(data, spec.name, 1.0, 2.0), "replay speed"), spec, dtype)
    decode_wall = decode_price = prefill_wall = prefill_rest = prefill_price = 0.0
    for step in steps:
        sample = step_sample(step)
        whole = predicted_step_s(costs, sample)
        # The rest of the price, from the price with prefill terms doubled (it is linear in them): not from them
        # priced at 0, where a step with chunks is held to its decodes' price alone (physics never inverts).
        rest = 2 * whole - predicted_step_s(doubled, sample)
        if step.prefills:
            prefill_wall += step.wall_s
            prefill_rest += rest
            prefill_price += whole - rest
        else:
            decode_wall += step.wall_s
            decode_price += whole
    decode = decode_wall / decode_price if decode_price else 1.0
    prefill = (prefill_wall - decode * prefill_rest) / prefill_price if prefill_price else decode
    return decode, max(prefill, 0.0)
