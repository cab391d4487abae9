"""Preemption: taking a request off its GPU by KV swap or by recompute, and bringing it back.

A swapped request's KV cache moves over its node's PCIe link to host RAM and
back (vLLM v0's swap: the first swapped out comes back first); a recomputed
one drops its KV and prefills its prompt and the tokens it has generated
again. Each pause is charged to the request's losses by cause (``kv_out``,
``kv_in``, ``recompute``); whatever part of the pause no cause explains was
spent waiting.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sim.engine.instance import Instance
from sim.engine.kv import blocks_for
from sim.engine.request import NAN, Request

if TYPE_CHECKING:  # the engine imports this module
    from sim.engine.engine import Engine


def preempt(engine: Engine, instance: Instance, request: Request, mode: str, now: float) -> float:
    """Take ``request`` off ``instance`` by KV swap (``swap``) or drop-and-recompute (``recompute``).

    Returns the seconds of device-to-host transfer the instance must wait for."""
    # A half-done prefill has no complete KV worth moving: it is recomputed.
    decoding = request.state == "running"
    instance.release(request)
    # The blocks freed may be what a co-resident instance, passed over as blocked earlier in the same round of
    # planning, was waiting for: it must be asked again, or the GPU may idle with work it could run.
    instance.gpu.blocked.clear()
    if engine.placement_kept and instance.status != "draining" and instance.exceeds_max_model_len(request):
        # Admitted before a neighbour's weights came (they stay for good): queued again, it could never start here.
        engine.refuse(request)
        return 0.0
    request.preemptions += 1
    request.preempted_at_s = now
    node = engine.nodes[instance.gpu.node]
    kv_bytes = request.context_tokens * instance.costs.kv_bytes_per_token
    seconds = 0.0
    if mode == "swap" and decoding and node.reserve_host(kv_bytes):
        seconds = node.transfer(now, instance.costs.kv_transfer_s(request.context_tokens, "device_to_host"), "device_to_host")
        request.add_loss("kv_out", seconds)
        request.kv_on_host_node = node.index
        request.kv_host_ready_s = now + seconds
        request.state = "swapped"
        instance.swapped.append(request)  # vLLM v0's order: the first swapped out comes back first
    else:
        mode = "recompute"
        set_recompute(request)
        request.state = "waiting"
        instance.waiting.appendleft(request)
    request.pause_charged = seconds
    engine.recorder.event(now, f"preempt_{mode}", instance.gpu.index, instance.name, request.id, seconds)
    return seconds


def apply_policy_preemptions(engine: Engine, instance: Instance, now: float) -> None:
    """The preemptions a policy asked for while ``instance``'s step ran, now that it has ended (the step's token
    counted, as vLLM's scheduler preempts only between steps); its next step waits for the swap-outs."""
    owed_s = instance.owed_transfer_s
    for request, mode in instance.policy_preemptions:
        if request.state == "running" and request.instance is instance:  # not finished by the step, nor asked twice
            owed_s = max(owed_s, preempt(engine, instance, request, mode, now))
    instance.policy_preemptions.clear()
    instance.owed_transfer_s = owed_s
    for request, target in instance.policy_moves:  # the view's assign of a request whose preemption was pending
        if request.instance is instance and request.state in ("waiting", "swapped") and engine.routable(target):
            engine.withdraw(request)
            engine.assign(request, target)
    instance.policy_moves.clear()


def resume_swapped(engine: Engine, instance: Instance, now: float) -> float:
    """Swap in the KV caches of ``instance``'s swapped requests that fit, oldest first; returns the transfer
    seconds the step waits for."""
    transfer_s = 0.0
    block_size = engine.config.block_size
    while instance.swapped and len(instance.running) + len(instance.prefilling) < engine.config.max_num_seqs:
        request = instance.swapped[0]
        blocks = blocks_for(request.context_tokens, block_size)
        # Room for the token it decodes in this very step, too.
        if blocks_for(request.context_tokens + 1, block_size) > instance.spare_blocks():
            break
        instance.swapped.popleft()
        request.admitted_seq = engine.next_admission()
        # Its KV must be all in host RAM before it can come back: a policy's preemption (or an unload) does not
        # wait for the swap-out, and a replica on the same node may take the request back at once.
        still_leaving_s = request.kv_host_ready_s - (now + transfer_s)
        if still_leaving_s > 0:
            transfer_s += still_leaving_s
        seconds = engine.nodes[instance.gpu.node].transfer(
            now + transfer_s, instance.costs.kv_transfer_s(request.context_tokens, "host_to_device"), "host_to_device")
        transfer_s += seconds
        request.add_loss("kv_in", seconds)
        drop_host_kv(engine, request)
        request.blocks = blocks
        instance.blocks += blocks
        instance._join_running(request)
        end_pause(request, now + transfer_s, charged=seconds)
        engine.recorder.event(now, "swap_in", instance.gpu.index, instance.name, request.id, seconds)
    return transfer_s


def set_recompute(request: Request) -> None:
    """The request will prefill its prompt and every token it has generated again."""
    request.prefilled = request.prefill_start = 0
    request.prefill_target = request.prompt_tokens + request.generated


def drop_host_kv(engine: Engine, request: Request) -> None:
    """Free the host RAM that ``request``'s swapped KV cache holds, if any."""
    if request.kv_on_host_node >= 0:
        node = engine.nodes[request.kv_on_host_node]
        node.release_host(request.context_tokens * engine.costs[request.model].kv_bytes_per_token)
        request.kv_on_host_node = -1


def charge_recompute(engine: Engine, request: Request, now: float) -> None:
    """Charge a recomputed request, as its prefill completes, what that prefill computed: its prompt and generated
    tokens, less those the prefix cache held when it started again, at its instance's share of layers."""
    instance = request.instance
    assert instance is not None  # only a prefill running on an instance completes
    cached = request.prefill_start
    seconds = instance.costs.prefill_s(request.prefill_target - cached, instance.gpu_share, context_before=cached)
    if not math.isnan(request.preempted_at_s):
        seconds = unexplained(request, seconds, now)
    request.add_loss("recompute", seconds)
    end_pause(request, now, charged=seconds)


def unexplained(request: Request, seconds: float, now: float) -> float:
    """What a cause of ``seconds`` that ends at ``now`` may charge ``request``'s pause: no more than the part of the
    pause so far that the causes charged already leave unexplained. Causes can overlap (an unload beside the reload
    of a copy elsewhere, a reload charged twice for a request moved between loading copies), and the losses must
    never add up to more than the pause. Where the two differ only by rounding the charge is left whole."""
    left = now - request.preempted_at_s - request.pause_charged
    return seconds if left >= seconds - 1e-9 * max(1.0, now) else max(0.0, left)


def end_pause(request: Request, now: float, charged: float) -> None:
    """The request runs again: whatever part of its pause no cause explains was spent waiting."""
    if math.isnan(request.preempted_at_s):
        return
    explained = request.pause_charged + charged
    request.add_loss("waiting", max(0.0, now - request.preempted_at_s - explained))
    request.preempted_at_s = NAN
    request.pause_charged = 0.0
