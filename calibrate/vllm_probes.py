"""The probes ``calibrate --engine vllm`` runs through a real engine, and the step samples they yield.

A probe is a set of requests submitted together and run to completion:

- decode sweep: as many requests as the largest batch of the grid, with prompts of ``context`` tokens, decode
  together; after ``decode_steps`` (+ ``WARMUP_STEPS``) pure decode steps at one batch size, enough of them
  are aborted to bring the batch down to the next size of the grid, down to the smallest. One prefill
  thus serves every batch size, and each is measured as a whole batch (the steps while they prefill mix
  decodes with prefill chunks: they are kept as mixed samples);
- prefill: one request of P prompt tokens and one output token (prompts longer than the token budget run
  in chunks over the part already cached: the ``2PC`` term);
- mixed: B decoding requests, then one prompt of P tokens joining them.

The whole grid is run ``passes`` times, every other pass in reverse order, so that every probe is measured
at moments tens of seconds apart: on a shared machine the same step runs 10-20% slower or faster from one
minute to the next, and a few times an hour twice as slow for tens of seconds (another job's burst).

First runs: a step of a token count the engine has not run before costs more. vLLM's CPU build took 2.3-3 ms
longer for it (prompts of 80 to 1,000 tokens, tcmalloc preloaded) than for the same count run again. Served
prompts have any length, so most steps holding a prefill that a replay meets are first runs: each pass lengthens
every probe's prompts by one more token, so that each step size is run once (a step that fills the token budget
is the exception, in the probes as in serving: its size recurs).

Each step is classified by its composition as the scheduler planned it. Per probe and kind, the steps'
times are summarised by their mean: a served request's latency is a sum of step times, so the slow steps
(another process taking the core for a while) count as they happen.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from calibrate.vllm_engine import EngineLimits, StepRecord, VllmEngine

Tick = Callable[[str], None]
WARMUP_STEPS = 2  # the first decode steps of a batch shape pay one-off kernel set-up


@dataclass(frozen=True)
class ProbePlan:
    """The probe grid, run ``passes`` times: decode batch sizes x contexts, prefill prompt lengths, mixed
    (batch, prompt) pairs."""

    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_steps: int
    prefill_prompts: tuple[int, ...]
    mixed: tuple[tuple[int, int], ...]
    passes: int

    @property
    def probes(self) -> int:
        return self.passes * (len(self.decode_contexts) + len(self.prefill_prompts) + len(self.mixed))


# Every batch size up to 16: a sweep measures one more size for decode_steps steps (~0.2 s on a CPU), where
# interpolating between sizes left up to 4% out. Prompt lengths stay off the powers of two: oneDNN's GEMMs
# ran 1-3% cheaper per token at 256 / 512 / 1024 tokens than at the lengths around them, and real prompts
# have any length.
QUICK = ProbePlan(decode_batches=tuple(range(1, 17)) + (24, 32, 48, 64), decode_contexts=(64, 512, 1536),
                  decode_steps=10, prefill_prompts=(24, 90, 200, 360, 560, 800, 1000, 1500, 2000, 3000),
                  mixed=((2, 500), (4, 240), (4, 1000), (8, 500), (8, 1000), (12, 240), (12, 1000), (15, 500)), passes=3)
FULL = ProbePlan(decode_batches=tuple(range(1, 17)) + (20, 24, 28, 32, 48, 64, 96, 128), decode_contexts=(64, 512, 1536),
                 decode_steps=12, prefill_prompts=(24, 90, 150, 200, 360, 560, 800, 1000, 1500, 2000, 3000),
                 mixed=((2, 120), (2, 1000), (4, 240), (4, 1000), (8, 500), (8, 1000), (12, 240), (12, 1000),
                        (16, 500), (24, 1000), (31, 500)), passes=4)


def sweep_output_tokens(plan: ProbePlan, context: int, budget_tokens: int) -> int:
    """Output tokens per request of a decode sweep: enough to outlast its prefill steps (``budget_tokens`` per
    step, less one per request already decoding) and every phase of the sweep."""
    largest = max(plan.decode_batches)
    prefill_steps = math.ceil(largest * context / max(budget_tokens - largest, 1))
    return prefill_steps + 2 + len(plan.decode_batches) * (plan.decode_steps + WARMUP_STEPS)


def plan_for(quick: bool, limits: EngineLimits) -> ProbePlan:
    """The quick or full grid, cut to what the engine's limits allow."""
    plan = QUICK if quick else FULL
    longest = limits.max_model_len - 1 - plan.passes  # the last pass's prompts are plan.passes tokens longer
    plan = replace(plan, decode_batches=tuple(b for b in plan.decode_batches if b <= limits.max_num_seqs),
                   prefill_prompts=tuple(p for p in plan.prefill_prompts if p < longest),
                   mixed=tuple((b, p) for b, p in plan.mixed if b < limits.max_num_seqs and p < longest))
    return replace(plan, decode_contexts=tuple(
        c for c in plan.decode_contexts if c + sweep_output_tokens(plan, c, limits.max_num_batched_tokens) <= longest))


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

    def _submit(self, prompt_tokens: int, output_tokens: int) -> str:
        self._ids += 1
        request_id = f"p{self._ids}"
        self.engine.add(request_id, prompt_tokens, output_tokens)
        return request_id

    def _drain(self, label: str) -> list[StepRecord]:
        steps = []
        while self.engine.has_work():
            steps.append(self.engine.step())
        self.steps.extend((label, step) for step in steps)
        return steps

    def warm_up(self, plan: ProbePlan) -> None:
        """One-off set-up (kernels, allocator) outside the samples: every batch size of the grid, the largest
        prefill."""
        self.decode_sweep(replace(plan, decode_steps=1), 64)
        self._submit(max(plan.prefill_prompts), 2)
        while self.engine.has_work():
            self.engine.step()

    def decode_sweep(self, plan: ProbePlan, context: int) -> list[StepRecord]:
        """The steps of a sweep over every batch size of ``plan``, largest first, on prompts of ``context``
        tokens."""
        sizes = sorted(plan.decode_batches, reverse=True)
        tokens = sweep_output_tokens(plan, context, self.engine.limits.max_num_batched_tokens)
        running = [self._submit(context, tokens) for _ in range(sizes[0])]
        phase_steps = plan.decode_steps + WARMUP_STEPS
        steps: list[StepRecord] = []
        for following in sizes[1:] + [0]:
            counted = 0
            while counted < phase_steps and self.engine.has_work():
                step = self.engine.step()
                steps.append(step)
                if not step.prefills and len(step.decode_contexts) == len(running):
                    counted += 1
            self.engine.abort(running[following:])
            del running[following:]
        return steps

    def prefill(self, prompt: int, suffix: str = "") -> None:
        self._submit(prompt, 1)
        self._drain(f"prefill P={prompt}{suffix}")

    def mixed(self, batch: int, prompt: int, suffix: str = "") -> None:
        for _ in range(batch):
            self._submit(128, 12)
        self.engine.step()  # their prefill
        self.engine.step()  # a first decode step
        self._submit(prompt, 2)
        self._drain(f"mixed B={batch} P={prompt}{suffix}")

    def run(self, plan: ProbePlan, tick: Tick) -> None:
        self.warm_up(plan)
        tick("vLLM warm-up")
        for index in range(plan.passes):
            self.run_pass(plan, index, tick)

    def run_pass(self, plan: ProbePlan, index: int, tick: Tick) -> None:
        """Every probe once (pass ``index``, 0-based), odd passes in reverse order; labels name the pass, so
        that the summary keeps the passes apart. Prompts are ``index + 1`` tokens longer than the grid's: each
        length runs for the first time (see the module's note on first runs)."""
        order = -1 if index % 2 else 1
        suffix = f" pass {index + 1}"
        longer = index + 1
        for context in plan.decode_contexts[::order]:
            label = f"decode ctx={context}{suffix}"
            self.steps.extend((label, step) for step in self.decode_sweep(plan, context + longer))
            tick(f"decode batch {max(plan.decode_batches)}…{min(plan.decode_batches)}, context {context}{suffix}")
        for prompt in plan.prefill_prompts[::order]:
            self.prefill(prompt + longer, suffix)
            tick(f"prefill {prompt + longer} tokens{suffix}")
        for batch, prompt in plan.mixed[::order]:
            self.mixed(batch, prompt + longer, suffix)
            tick(f"mixed: {batch} decodes + {prompt + longer}-token prompt{suffix}")


def summarise(steps: list[tuple[str, StepRecord]]) -> list[dict]:
    """One sample per (probe, kind, shape): the mean times of its steps, with min and max.

    Decode steps are grouped by batch size (context grows by B a step: its mean is kept); the first
    ``WARMUP_STEPS`` decode steps of each probe and batch size are left out."""
    groups: dict[tuple, list[StepRecord]] = {}
    seen: dict[tuple, int] = {}
    for label, step in steps:
        kind = kind_of(step)
        if kind == "decode":
            key: tuple = (label, kind, len(step.decode_contexts))
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
            **{f"{what}_s": statistics.fmean(getattr(s, f"{what}_s") for s in members)
               for what in ("wall", "execute", "forward")},
            "wall_min_s": min(s.wall_s for s in members), "wall_max_s": max(s.wall_s for s in members),
        })
    return samples
