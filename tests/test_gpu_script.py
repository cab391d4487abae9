"""``scripts/gpu_calibrate.sh`` runs once, unattended, on a lent GPU: its Python steps must still call the current
calibration API. Each step (a ``<<'PY'`` block) is run here with the calibration functions replaced by stand-ins
that bind the real functions' signatures, so an argument added, removed or reordered fails here, not on the GPU."""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import pytest

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


def test_the_script_has_its_three_steps():
    assert len(STEPS) == 3


@pytest.mark.parametrize("step", range(3))
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
    arguments = [[profile, tmp_path, "qwen2.5-3b,qwen3-8b"], [profile, out / "validation.json"], [profile, out]][step]
    monkeypatch.setattr(sys, "argv", ["-", *map(str, arguments)])  # as the script hands them over
    with wall_clock_limit(60):
        exec(compile(STEPS[step], f"{SCRIPT.name} step {step + 1}", "exec"), {"__name__": "__main__"})
    assert calls, "the step called none of the calibration functions"
