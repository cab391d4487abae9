"""The probes ``calibrate --engine vllm`` runs through a real engine, and the step samples they yield.

A probe is a set of requests submitted together and run to completion:

- decode: B requests with prompts of ``context`` tokens and a few output tokens; once their prefills are
  done, every step is a pure decode step of B sequences (the steps while they prefill mix decodes with a
  prefill chunk: they are kept as mixed samples);
- prefill: one request of P prompt tokens and one output token (prompts longer than the token budget run
  in chunks over the part already cached: the ``2PC`` term);
- mixed: B decoding requests, then one prompt of P tokens joining them.

Each step is classified by its composition as the scheduler planned it. Per probe and kind, the steps'
times are summarised by their median (the replay in ``validate vllm`` sees the same noise as these probes).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from calibrate.vllm_engine import StepRecord, VllmEngine

Tick = Callable[[str], None]
WARMUP_STEPS = 2  # the first decode steps of a batch shape pay one-off kernel set-up


@dataclass(frozen=True)
class ProbePlan:
    """The probe grid: decode batch x context, prefill prompt lengths, mixed (batch, prompt) pairs."""

    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_steps: int
    prefill_prompts: tuple[int, ...]
    prefill_repeats: int
    mixed: tuple[tuple[int, int], ...]

    @property
    def probes(self) -> int:
        return (len(self.decode_batches) * len(self.decode_contexts) + len(self.prefill_prompts) * self.prefill_repeats
                + len(self.mixed))


QUICK = ProbePlan(decode_batches=(1, 2, 4, 8, 12, 16), decode_contexts=(64, 512, 1536), decode_steps=10,
                  prefill_prompts=(16, 64, 256, 512, 1024, 2048, 3000), prefill_repeats=2,
                  mixed=((2, 512), (4, 256), (4, 1024), (8, 512), (8, 1024), (12, 256), (12, 1024), (15, 512)))
FULL = ProbePlan(decode_batches=(1, 2, 4, 8, 12, 16, 24, 32), decode_contexts=(64, 512, 1536), decode_steps=12,
                 prefill_prompts=(16, 64, 128, 256, 512, 1024, 2048, 3000), prefill_repeats=3,
                 mixed=((2, 128), (2, 1024), (4, 256), (4, 1024), (8, 512), (8, 1024), (12, 256), (12, 1024),
                        (16, 512), (24, 1024), (31, 512)))


def plan_for(quick: bool, max_num_seqs: int, max_model_len: int) -> ProbePlan:
    """The quick or full grid, cut to what the engine's limits allow."""
    plan = QUICK if quick else FULL
    return ProbePlan(tuple(b for b in plan.decode_batches if b <= max_num_seqs),
                     tuple(c for c in plan.decode_contexts if c + plan.decode_steps + 1 < max_model_len),
                     plan.decode_steps, tuple(p for p in plan.prefill_prompts if p + 1 < max_model_len),
                     plan.prefill_repeats, tuple((b, p) for b, p in plan.mixed if b < max_num_seqs and p + 1 < max_model_len))


def kind_of(step: StepRecord) -> str:
    if not step.prefills:
        return "decode"
    return "mixed" if step.decode_contexts else "prefill"


class Prober:
    """Runs probes on one engine and keeps every step with its probe's label."""

    def __init__(self, engine: VllmEngine):
        self.engine = engine
        self.steps: list[tuple[str, StepRecord]] = []
        self._ids = 0

    def _submit(self, prompt_tokens: int, output_tokens: int) -> None:
        self._ids += 1
        self.engine.add(f"p{self._ids}", prompt_tokens, output_tokens)

    def _drain(self, label: str) -> list[StepRecord]:
        steps = []
        while self.engine.has_work():
            steps.append(self.engine.step())
        self.steps.extend((label, step) for step in steps)
        return steps

    def warm_up(self, plan: ProbePlan) -> None:
        """One-off set-up (kernels, allocator) outside the samples: the largest prefill, the largest batch."""
        for _ in range(self.engine.limits.max_num_seqs):
            self._submit(64, 4)
        self._submit(max(plan.prefill_prompts), 2)
        while self.engine.has_work():
            self.engine.step()

    def decode(self, batch: int, context: int, steps: int) -> None:
        for _ in range(batch):
            self._submit(context, steps + WARMUP_STEPS + 1)
        self._drain(f"decode B={batch} ctx={context}")

    def prefill(self, prompt: int) -> None:
        self._submit(prompt, 1)
        self._drain(f"prefill P={prompt}")

    def mixed(self, batch: int, prompt: int) -> None:
        for _ in range(batch):
            self._submit(128, 12)
        self.engine.step()  # their prefill
        self.engine.step()  # a first decode step
        self._submit(prompt, 2)
        self._drain(f"mixed B={batch} P={prompt}")

    def run(self, plan: ProbePlan, tick: Tick) -> None:
        self.warm_up(plan)
        tick("vLLM warm-up")
        for batch in plan.decode_batches:
            for context in plan.decode_contexts:
                self.decode(batch, context, plan.decode_steps)
                tick(f"decode batch {batch}, context {context}")
        for prompt in plan.prefill_prompts:
            for _ in range(plan.prefill_repeats):
                self.prefill(prompt)
                tick(f"prefill {prompt} tokens")
        for batch, prompt in plan.mixed:
            self.mixed(batch, prompt)
            tick(f"mixed: {batch} decodes + {prompt}-token prompt")


def summarise(steps: list[tuple[str, StepRecord]]) -> list[dict]:
    """One sample per (probe, kind, shape): the median times of its steps, with min and max.

    Decode steps are grouped by batch size (context grows by B a step: its mean is kept); the first
    ``WARMUP_STEPS`` decode steps of each probe are left out."""
    groups: dict[tuple, list[StepRecord]] = {}
    seen: dict[tuple, int] = {}
    for label, step in steps:
        kind = kind_of(step)
        if kind == "decode":
            key = (label, kind, len(step.decode_contexts))
            seen[key] = seen.get(key, 0) + 1
            if seen[key] <= WARMUP_STEPS:
                continue
        else:
            key = (label, kind, len(step.decode_contexts), tuple(step.prefills))
        groups.setdefault(key, []).append(step)
    samples = []
    for key, members in groups.items():
        first = members[0]
        samples.append({
            "probe": key[0], "kind": key[1], "steps": len(members), "batch": len(first.decode_contexts),
            "context_tokens": statistics.fmean(sum(s.decode_contexts) for s in members),
            "prefills": [list(p) for p in first.prefills],
            **{f"{what}_s": statistics.median(getattr(s, f"{what}_s") for s in members)
               for what in ("wall", "execute", "forward")},
            "wall_min_s": min(s.wall_s for s in members), "wall_max_s": max(s.wall_s for s in members),
        })
    return samples
