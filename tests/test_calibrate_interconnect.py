"""``mmsim calibrate interconnect``: all-reduce and send/recv timed with torch.distributed, fitted into the profile's
``hardware.interconnect``; on the CPU with gloo over two processes, as NCCL runs over a node's GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from calibrate import bench_interconnect  # noqa: E402
from calibrate.bench_interconnect import activation_sizes_bytes, fit_interconnect, node_interconnect  # noqa: E402
from sim.catalogue import get_model  # noqa: E402
from sim.costs import ModelCosts  # noqa: E402
from sim.profile import load_profile  # noqa: E402
from test_calibrate_cli import run_cli  # noqa: E402

PROFILES = Path(__file__).resolve().parents[1] / "sim" / "data" / "profiles"


def test_the_sizes_are_the_activations_a_step_moves():
    # 1 to 8192 tokens of fp16 hidden states of 4096 (8B) and 8192 (70B) wide models, and of the given ones.
    sizes = activation_sizes_bytes((2048,), tokens=(1, 1024))
    assert sizes == (4096, 8192, 16384, 4 * 2**20, 8 * 2**20, 16 * 2**20)


def test_the_fit_recovers_a_link_drawn_by_hand():
    # 12 us + bus bytes / 300 GB/s: an all-reduce over 4 ranks moves 2 x 3/4 of its bytes on the bus.
    samples = []
    for size in (16_384, 262_144, 4 * 2**20, 64 * 2**20):
        for op, ranks, bus in (("all_reduce", 4, 1.5 * size), ("send_recv", 2, size)):
            samples.append({"op": op, "bytes": size, "ranks": ranks, "bus_bytes": bus, "typical_s": 12e-6 + bus / 300e9})
    section = fit_interconnect(samples, "nvlink", "by hand")
    assert section["bandwidth_bytes_per_s"] == pytest.approx(300e9, rel=1e-6)
    assert section["latency_s"] == pytest.approx(12e-6, rel=1e-6)
    assert "all-reduce over 4 ranks alone: 300.00 GB/s, 12.0 us" in section["note"]


def test_with_one_gpu_or_none_the_default_stays_and_the_line_says_so(monkeypatch):
    section, line = node_interconnect(torch.device("cpu"), (4096,), 1)
    assert section is None and line.startswith("no GPU here") and "20 GB/s, 15 us" in line
    monkeypatch.setattr(bench_interconnect.torch.cuda, "device_count", lambda: 1)
    section, line = node_interconnect(torch.device("cuda", 0), (4096,), 1)
    assert section is None and line.startswith("one GPU here")


def test_gloo_over_two_cpu_processes_writes_the_profiles_interconnect(monkeypatch, capsys, tmp_path):
    path = tmp_path / "profile.json"
    data = json.loads((PROFILES / "h100-sxm.json").read_text())
    del data["hardware"]["interconnect"]
    path.write_text(json.dumps(data))
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", "interconnect", str(path), "--cpu-ranks", "2",
                             "--repeats", "2", "--timeout-s", "150")
    assert code == 0, err
    link = load_profile(str(path)).hardware.interconnect
    assert link is not None and link.source == "measured" and link.kind == "loopback"
    assert 1e6 < link.bandwidth_bytes_per_s < 1e12 and 0 <= link.latency_s < 0.1  # host memory, one machine
    assert "8,192 to 134,217,728 bytes" in link.note and "wrote hardware.interconnect" in out
    # A tensor-parallel step pays what the profile now says: 2 ring all-reduces per layer, 80 layers, TP2.
    costs = ModelCosts(load_profile(str(path)), get_model("llama-3.1-70b"), tensor_parallel=2)
    assert costs.parallel_comm_s(1) == pytest.approx(
        2 * 80 * (link.latency_s + 2 * 1 / 2 * 8192 * 2 / link.bandwidth_bytes_per_s), rel=1e-12)


def test_a_built_in_profile_name_is_refused_in_one_line(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "calibrate", "interconnect", "h100-sxm")
    assert code == 2 and err.strip().count("\n") == 0 and "is not a profile file" in err
