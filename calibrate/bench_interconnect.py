"""The interconnect between a node's GPUs, measured with torch.distributed: the profile's ``hardware.interconnect``.

A tensor-parallel step all-reduces its activations (tokens x hidden x 2 bytes) twice per layer, and a pipeline
stage sends them to the next one; mmsim prices both as ``latency_s + bus_bytes / bandwidth_bytes_per_s``
(sim.costs: ``bus_bytes`` is 2(n-1)/n of the bytes for a ring all-reduce over n ranks, nccl-tests' bus
bandwidth, and all of them for a send). So this times all-reduces of those sizes across every GPU of the node
and a send/recv ping-pong between two of them, one process per rank, and fits both to that one line.

The backend and the device are parameters: NCCL over CUDA GPUs on a GPU host, gloo on the CPU (what the tests
run, two processes on one machine). With fewer than two GPUs nothing is measured and the profile keeps the
roofline default (``sim.profile.DEFAULT_INTERCONNECT``).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from calibrate.fit import fit_affine, max_relative_error
from calibrate.timing import Timing, synchronize, time_once
from sim.errors import MmsimError
from sim.profile import DEFAULT_INTERCONNECT

TOKENS = (1, 16, 128, 1024, 8192)
"""Tokens a step moves: one decode, small and large decode batches, a prefill chunk, a full token budget."""
HIDDEN_SIZES = (4096, 8192)
"""An 8B and a 70B Llama's hidden size: the models tensor parallelism serves."""
OP_NAMES = {"all_reduce": "all-reduce", "send_recv": "send/recv"}
WARMUP = 2  # the first collectives set up NCCL's channels and buffers


def activation_sizes_bytes(hidden_sizes: tuple[int, ...] = (), tokens: tuple[int, ...] = TOKENS) -> tuple[int, ...]:
    """The fp16 activation sizes a step moves in models of these hidden sizes and of ``HIDDEN_SIZES``."""
    return tuple(sorted({t * hidden * 2 for t in tokens for hidden in {*hidden_sizes, *HIDDEN_SIZES}}))


def _timed(op, device: torch.device, repeats: int) -> list[float]:
    for _ in range(WARMUP):
        op()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        dist.barrier()  # every rank starts together, so a sample is the collective, not a late peer
        samples.append(time_once(op, device))
    return samples


def _slowest(samples: list[float], device: torch.device) -> list[float]:
    """Each repeat's time on its slowest rank: a collective is over when the last rank has its result."""
    times = torch.tensor(samples, dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.tolist()


def _rank(rank: int, ranks: int, backend: str, device_type: str, sizes_bytes: tuple[int, ...], repeats: int,
          folder: str) -> None:
    """One rank's measurements; rank 0 writes every sample to ``folder``/samples.json."""
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=ranks)
    dtype = torch.float16 if device_type == "cuda" else torch.float32  # gloo reduces fp32 on the CPU
    element_bytes = torch.empty(0, dtype=dtype).element_size()
    records = []
    for size in sizes_bytes:
        tensor = torch.ones(max(1, size // element_bytes), dtype=dtype, device=device)
        moved = tensor.numel() * element_bytes
        reduce_s = _slowest(_timed(lambda: dist.all_reduce(tensor), device, repeats), device)
        records.append(Timing.of(reduce_s, device).record(op="all_reduce", bytes=moved, ranks=ranks,
                                                          bus_bytes=2 * (ranks - 1) / ranks * moved))

        def ping_pong() -> None:
            # Ranks 0 and 1 pass the activations there and back: half the round trip is one hand-off, with no
            # clocks to compare between processes.
            if rank == 0:
                dist.send(tensor, 1)
                dist.recv(tensor, 1)
            elif rank == 1:
                dist.recv(tensor, 0)
                dist.send(tensor, 0)

        send_s = [s / 2 for s in _slowest(_timed(ping_pong, device, repeats), device)]
        records.append(Timing.of(send_s, device).record(op="send_recv", bytes=moved, ranks=2, bus_bytes=moved))
    if rank == 0:
        Path(folder, "samples.json").write_text(json.dumps(records))
    dist.barrier()
    dist.destroy_process_group()


def measure_interconnect(ranks: int, backend: str, device_type: str, sizes_bytes: tuple[int, ...], repeats: int,
                         timeout_s: float) -> list[dict]:
    """Samples of all-reduce across ``ranks`` processes and of a send/recv between two of them, one per size."""
    if ranks < 2:
        raise MmsimError(f"an interconnect needs at least 2 ranks, not {ranks}")
    with tempfile.TemporaryDirectory(prefix="mmsim-interconnect-") as folder:
        context = mp.start_processes(_rank, args=(ranks, backend, device_type, sizes_bytes, repeats, folder),
                                     nprocs=ranks, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise MmsimError(f"the {backend} interconnect benchmark over {ranks} ranks did not finish in "
                                     f"{timeout_s:.0f} s")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
            raise MmsimError(f"the {backend} interconnect benchmark failed: {str(error).strip().splitlines()[-1]}")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        return json.loads(Path(folder, "samples.json").read_text())


def fit_interconnect(samples: list[dict], kind: str, where: str) -> dict:
    """The profile's ``Interconnect``: one latency and bus bandwidth for all-reduces and hand-offs alike, fitted
    to every sample by relative least squares (each op's own fit is in the note)."""

    def line(group: list[dict]) -> tuple[float, float, float]:
        x, y = [s["bus_bytes"] for s in group], [s["typical_s"] for s in group]
        latency_s, per_byte_s = fit_affine(x, y)
        if per_byte_s <= 0:  # noise left no slope: the best rate seen, with no fixed cost
            latency_s, per_byte_s = 0.0, min(t / b for b, t in zip(x, y))
        error = max_relative_error([[1.0] * len(x), x], y, [latency_s, per_byte_s])
        return latency_s, 1.0 / per_byte_s, error

    latency_s, bandwidth, error = line(samples)
    parts = []
    for op in ("all_reduce", "send_recv"):
        mine = [s for s in samples if s["op"] == op]
        op_latency, op_bandwidth, _ = line(mine)
        ranks = mine[0]["ranks"]
        parts.append(f"{OP_NAMES[op]} over {ranks} ranks alone: {op_bandwidth / 1e9:.2f} GB/s, "
                     f"{op_latency * 1e6:.1f} us")
    sizes = sorted({s["bytes"] for s in samples})
    note = (f"{where}: all-reduce and send/recv of {sizes[0]:,} to {sizes[-1]:,} bytes (the activations a step "
            f"moves), one fit of latency + bus bytes / bandwidth, max error {error:.0%}; " + "; ".join(parts))
    return {"source": "measured", "kind": kind, "bandwidth_bytes_per_s": bandwidth, "latency_s": latency_s,
            "note": note}


def nvlink_between_gpus() -> bool:
    """Whether NVML reports an active NVLink on GPU 0 (else peer traffic goes over PCIe)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return any(pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED for link in range(18))
    except Exception:  # no NVML, or a GPU without NVLink: NVML raises for links that do not exist
        return False


def node_interconnect(device: torch.device, sizes_bytes: tuple[int, ...], repeats: int,
                      timeout_s: float = 600.0) -> tuple[dict | None, str]:
    """The measured interconnect of this node's GPUs (NCCL, one rank per GPU), or None with fewer than two GPUs;
    and a line saying what was done."""
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if gpus < 2:
        default = DEFAULT_INTERCONNECT
        return None, (f"{'one GPU' if gpus == 1 else 'no GPU'} here, so the interconnect was not measured: a "
                      f"profile without one prices tensor- and pipeline-parallel steps at the roofline default "
                      f"({default.kind}, {default.bandwidth_bytes_per_s / 1e9:.0f} GB/s, "
                      f"{default.latency_s * 1e6:.0f} us)")
    kind = "nvlink" if nvlink_between_gpus() else "pcie"
    samples = measure_interconnect(gpus, "nccl", "cuda", sizes_bytes, repeats, timeout_s)
    section = fit_interconnect(samples, kind, f"NCCL across the node's {gpus} GPUs ({kind})")
    return section, describe(section)


def describe(section: dict) -> str:
    return (f"interconnect ({section['kind']}): {section['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s bus bandwidth, "
            f"{section['latency_s'] * 1e6:.1f} us per message")

