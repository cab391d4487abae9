"""A request's life in the engine: queues, tokens, and the time it lost to preemption."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from sim.engine.instance import Instance
    from sim.engine.prefix import PrefixPath

LOSS_CAUSES: Final = ("reload", "unload", "kv_out", "kv_in", "recompute", "waiting")
"""Why a preempted request was paused; each gets its own seconds column in the results."""
NAN: Final = math.nan
"""Not ``float("nan")`` per request: compiled, that call parses the string each time."""


class Request:
    """One inference request: arrival, lengths, progress, and its timestamps.

    ``generated`` counts output tokens produced so far; while a request sits in
    an instance's decode batch its count is derived from the instance's
    iteration counter (``join_iter``/``gen_at_join``) so that fast-forward can
    advance many iterations without touching every request.
    """

    __slots__ = (
        "id", "model", "arrival_s", "prompt_tokens", "output_tokens", "predicted_output_tokens", "priority",
        "generated", "prefilled", "prefill_target", "state", "instance", "gpu", "first_token_s", "finish_s",
        "first_scheduled_s", "preemptions", "lost", "drop_reason", "join_iter", "gen_at_join", "join_seq",
        "preempted_at_s", "kv_on_host_node", "blocks", "pause_charged", "unplaced", "admitted_seq", "prefix_ids",
        "prefix_path", "cache_blocks", "cached_tokens", "prefill_start", "kv_host_ready_s", "slo_class",
        "prefilled_most",
    )

    def __init__(self, rid: int, model: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 predicted_output_tokens: int, priority: int = 0, prefix_ids: tuple[int, ...] | None = None,
                 slo_class: int = -1):
        self.id = rid
        self.model = model
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.predicted_output_tokens = predicted_output_tokens
        self.priority = priority
        self.generated = 0
        self.prefilled = 0
        self.prefilled_most = 0  # the furthest any of its prefills got: chunks short of it recompute (no progress)
        self.prefill_target = prompt_tokens
        self.state = "pending"
        self.instance: Instance | None = None
        self.gpu = -1
        self.first_token_s = NAN
        self.finish_s = NAN
        self.first_scheduled_s = NAN
        self.preemptions = 0
        self.lost: list[float] | None = None  # seconds lost to each of LOSS_CAUSES; None until it loses any
        self.drop_reason = ""
        self.join_iter = 0
        self.gen_at_join = 0
        self.join_seq = 0  # its place in the order requests joined its instance's running batch
        self.preempted_at_s = NAN
        self.kv_on_host_node = -1
        self.blocks = 0
        self.pause_charged = 0.0
        self.unplaced = False  # in its model's pending queue (no instance holds it)
        self.admitted_seq = 0  # when it last joined a batch (prefill admission or swap-in), in the engine's order
        self.prefix_ids = prefix_ids  # the trace's ids of its prompt's prefix blocks, if any
        self.prefix_path: PrefixPath | None = None  # its KV blocks' prefix-cache segments, made when first looked up
        self.cache_blocks = 0  # of its blocks, how many (from the first) are the prefix cache's, perhaps shared
        self.cached_tokens = 0  # prompt tokens its first prefill found in the prefix cache
        self.prefill_start = 0  # tokens its current prefill found in the prefix cache (it computes the rest)
        self.kv_host_ready_s = 0.0  # when its swapped-out KV is all in host RAM (a swap-in cannot start before)
        self.slo_class = slo_class  # its trace row's SLO class, a code into the recorder's slo_class_names; -1: none

    def add_loss(self, cause: str, seconds: float) -> None:
        lost = self.lost
        if lost is None:
            lost = self.lost = [0.0] * len(LOSS_CAUSES)
        lost[LOSS_CAUSES.index(cause)] += seconds

    @property
    def context_tokens(self) -> int:
        """Tokens whose KV this request holds once its prefill is complete."""
        return self.prompt_tokens + self.generated

    @property
    def remaining_tokens(self) -> int:
        return self.output_tokens - self.generated

    def __repr__(self) -> str:
        return f"Request({self.id}, model={self.model}, state={self.state}, gen={self.generated}/{self.output_tokens})"
