"""``scripts/gpu_calibrate.sh`` runs once, unattended, on a lent GPU: its Python steps must still call the current
calibration API. Each step (a ``<<'PY'`` block) is run here with the calibration functions replaced by stand-ins
that bind the real functions' signatures, so an argument added, removed or reordered fails here, not on the GPU."""

from __future__ import annotations

import inspect
import re
import sys
import time
from pathlib import Path

import pytest
import torch

import calibrate.commands
import calibrate.vllm_commands
from conftest import wall_clock_limit

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_calibrate.sh"
STEPS = re.findall(r"<<'PY'[^\n]*\n(.*?)\nPY\n", SCRIPT.read_text(), re.S)
CALLED = {  # what each step may call, and a result of the shape the step reads
    (calibrate.commands, "calibrate_command"): lambda **_: Path("profile.json"),
    (calibrate.commands, "validate_command"): lambda **_: {
        "model": "m", "layers": 8, "cpu_layers": 0, "batch": 16, "predicted_tokens_per_s": 1.0,
        "measured_tokens_per_s": 1.0, "error_pct": 0.0},
    (calibrate.vllm_commands, "calibrate_engine_command"): lambda **_: Path("vllm/profile.json"),
    (calibrate.vllm_commands, "validate_vllm_command"): lambda **_: {},
}


def test_the_script_has_its_four_steps():
    assert len(STEPS) == 4


@pytest.mark.parametrize(("seconds_per_product", "printed"), [
    ({"float32": 0.002, "bfloat16": 0.05, "float16": 0.004}, "fp16 qwen2.5-3b,qwen3-8b,qwen2.5-14b"),
    ({"float32": 0.002, "bfloat16": 0.05, "float16": 0.05}, "bf16 qwen2.5-3b,qwen3-8b"),
    ({"float32": 0.002, "bfloat16": 2.0, "float16": 2.0}, "bf16 qwen2.5-3b"),
    ({"float32": 0.002, "bfloat16": 0.003, "float16": 0.003}, "bf16 qwen2.5-3b,qwen3-8b,qwen2.5-14b"),
])
def test_the_preflight_picks_a_native_dtype_and_the_models_whose_host_grids_fit(seconds_per_product, printed,
                                                                                monkeypatch, capsys):
    """A 512-square product in t seconds runs at 2 * 512**3 / t FLOP/s: 0.05 s is 5.4 GFLOP/s against fp32's 134,
    so that dtype is not native; at 5.4 GFLOP/s the 3B and 8B grids (0.12 + 0.36 TFLOP, 90 s) fit the 120 s budget
    and the 14B one (0.51 TFLOP) does not; at 0.13 GFLOP/s only the first model is kept."""
    clock = [0.0]

    def product(a, b):
        clock[0] += seconds_per_product[str(a.dtype).removeprefix("torch.")]
        return a

    monkeypatch.setattr(torch, "matmul", product)
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    exec(compile(STEPS[0], f"{SCRIPT.name} step 1", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.strip() == printed


@pytest.mark.parametrize("step", range(1, 4))
def test_each_step_calls_the_api_as_it_is(step, tmp_path, monkeypatch):
    calls = []
    for (module, name), result in CALLED.items():
        signature = inspect.signature(getattr(module, name))

        def stand_in(*args, _name=name, _signature=signature, _result=result, **kwargs):
            bound = _signature.bind(*args, **kwargs)  # TypeError when the script's call no longer fits
            calls.append(_name)
            return _result(**bound.arguments)

        monkeypatch.setattr(module, name, stand_in)
    profile, out = tmp_path / "profile.json", tmp_path / "out"
    out.mkdir()
    arguments = [[profile, tmp_path, "qwen2.5-3b,qwen3-8b", "bf16"], [profile, out / "validation.json", "qwen2.5-3b"],
                 [profile, out]][step - 1]
    monkeypatch.setattr(sys, "argv", ["-", *map(str, arguments)])  # as the script hands them over
    with wall_clock_limit(60):
        exec(compile(STEPS[step], f"{SCRIPT.name} step {step + 1}", "exec"), {"__name__": "__main__"})
    assert calls, "the step called none of the calibration functions"
