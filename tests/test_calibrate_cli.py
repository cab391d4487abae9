"""``mmsim calibrate`` and ``mmsim calibrate validate`` from the command line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

import calibrate.commands  # noqa: E402
import calibrate.validate  # noqa: E402
from sim.cli import main  # noqa: E402
from sim.profile import load_profile  # noqa: E402
from test_calibrate_bench import TINY, TINY_PLAN  # noqa: E402

from conftest import MMSIM_CLI


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["mmsim", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


@pytest.fixture
def tiny_catalogue(monkeypatch):
    """The CLI sees a tiny model and a tiny plan, so the whole command runs in seconds."""
    real = calibrate.commands.get_model
    lookup = lambda name: TINY if name == TINY.name else real(name)  # noqa: E731
    monkeypatch.setattr(calibrate.commands, "get_model", lookup)
    monkeypatch.setattr(calibrate.validate, "get_model", lookup)
    monkeypatch.setattr(calibrate.commands, "plan_for", lambda device_type, quick: TINY_PLAN)


def test_importing_the_cli_does_not_import_torch():
    code = "import sys, sim.cli; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None and __import__("torch").cuda.is_available(),
                    reason="this machine has a GPU")
def test_gpu_without_gpu_is_one_line_and_exit_2(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", "--gpu", "0")
    assert code == 2
    assert err.strip().count("\n") == 0 and "--device cpu" in err and "no CUDA GPU" in err


def test_missing_torch_says_how_to_install(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    code, _, err = run_cli(monkeypatch, capsys, "calibrate", "--device", "cpu", "--quick")
    assert code == 2 and "pip install '.[calibrate]'" in err


def test_bad_options_are_user_errors(monkeypatch, capsys):
    for args, message in ((["--device", "tpu"], "expected cpu"), (["--device", "cpu", "--dtype", "q4"], "dtypes"),
                          (["--device", "cpu", "--models", "nope"], "unknown model"),
                          # "" calibrated the default models, and a model given twice was accepted
                          (["--device", "cpu", "--models", ""], "--models must name at least one model"),
                          (["--device", "cpu", "--models", "qwen2.5-3b,qwen2.5-3b"], "is there twice"),
                          # vLLM's CPU KV pool is whole GiB: a fraction is refused here, not deep inside vLLM
                          (["--engine", "vllm", "--device", "cpu", "--kv-cache-gib", "0.125"], "--kv-cache-gib")):
        code, _, err = run_cli(monkeypatch, capsys, "calibrate", *args)
        assert code == 2 and message in err


@pytest.mark.parametrize("flags", [["--config", "config.json"], ["--base", "p.json"], ["--max-num-seqs", "4"],
                                   ["--block-size", "32"], ["--max-num-batched-tokens", "64"], ["--kv-cache-gib", "2"]])
def test_vllm_flags_are_refused_by_the_torch_calibration(monkeypatch, capsys, flags):
    """They were ignored, and a calibration of the default models ran for minutes instead."""
    code, _, err = run_cli(monkeypatch, capsys, "calibrate", "--device", "cpu", *flags)
    assert code == 2 and f"{flags[0]} is for --engine vllm" in err


def test_a_validation_loop_too_large_for_memory_is_one_line(monkeypatch, capsys):
    """--prompt-tokens 100000000 was a RuntimeError traceback from torch's allocator (exit 1)."""
    def allocate(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(calibrate.validate, "measure_loop", allocate)
    code, _, err = run_cli(monkeypatch, capsys, "calibrate", "validate", "paper-rtx5000", "--device", "cpu",
                           "--model", "qwen2.5-3b", "--prompt-tokens", "100000000")
    assert code == 2 and "does not fit in cpu's memory" in err and "Traceback" not in err


def test_calibrate_then_validate_from_the_cli(monkeypatch, capsys, tmp_path, tiny_catalogue):
    out = tmp_path / "profile.json"
    code, stdout, _ = run_cli(monkeypatch, capsys, "calibrate", "--device", "cpu", "--quick", "--models", TINY.name,
                              "--dtype", "fp32", "--out", str(out))
    assert code == 0 and f"wrote {out}" in stdout.replace("\n", "")
    assert load_profile(out).models[TINY.name].gpu.source == "measured"

    code, stdout, _ = run_cli(monkeypatch, capsys, "calibrate", "validate", str(out), "--json", "--layers", "2",
                              "--cpu-layers", "1", "--batch", "2", "--prompt-tokens", "8", "--new-tokens", "4",
                              "--repeats", "2", "--record")
    result = json.loads(stdout)
    assert code == 0 and result["model"] == TINY.name and result["device"] == "cpu"
    assert result["predicted_tokens_per_s"] > 0 and result["measured_tokens_per_s"] > 0
    assert result["error_pct"] == pytest.approx(
        (result["predicted_tokens_per_s"] / result["measured_tokens_per_s"] - 1) * 100)
    assert list(load_profile(out).validation) == [f"{TINY.name}:2layers:1cpu:cpu"]

    code, stdout, _ = run_cli(monkeypatch, capsys, "calibrate", "validate", str(out), "--layers", "1",
                              "--batch", "1", "--prompt-tokens", "4", "--new-tokens", "2", "--repeats", "1")
    assert code == 0 and "decode tokens/s" in stdout and "target" in stdout


@pytest.mark.slow
def test_quick_cpu_calibration_of_a_real_model_validates_within_target(request, tmp_path):
    """The issue's acceptance run: real Qwen2.5-3B layers, quick plan, then validate (about a minute on 2 cores)."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("end-to-end calibration of a real model: run with -m slow")
    out = tmp_path / "p.json"
    cli = MMSIM_CLI
    subprocess.run([*cli, "calibrate", "--device", "cpu", "--quick", "--out", str(out)], check=True)
    result = subprocess.run([*cli, "calibrate", "validate", str(out), "--json"], check=True, capture_output=True, text=True)
    report = json.loads(result.stdout)
    assert abs(report["error_pct"]) <= 10, report
