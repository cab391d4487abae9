"""Model catalogue: architectures, sizes and the paper's KV/weight figures."""

from __future__ import annotations

import json
import subprocess

import pytest

from sim.catalogue import catalogue, get_model
from sim.errors import MmsimError

REQUIRED = ["qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen3-8b", "qwen3-32b", "llama-2-7b",
            "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3.1-70b", "mistral-7b"]


def test_catalogue_has_required_models():
    assert set(REQUIRED) <= set(catalogue())


@pytest.mark.parametrize("name, kv_bytes", [("qwen2.5-3b", 36_864), ("qwen3-8b", 147_456), ("qwen2.5-14b", 196_608)])
def test_kv_bytes_per_token_matches_paper(name, kv_bytes):
    assert get_model(name).kv_bytes_per_token("fp16") == kv_bytes


@pytest.mark.parametrize("name, paper_gb", [("qwen2.5-3b", 5.9), ("qwen3-8b", 15.6), ("qwen2.5-14b", 28.3)])
def test_weight_size_close_to_paper(name, paper_gb):
    # The paper's sizes are what PyTorch held on the GPU (weights plus a little runtime state), in GiB;
    # pure fp16 weights come out 2-3% below them.
    gib = get_model(name).weight_bytes("fp16") / 2**30
    assert paper_gb * 0.96 <= gib <= paper_gb * 1.0


@pytest.mark.parametrize("name, billions", [("qwen2.5-7b", 7.62), ("llama-2-7b", 6.74), ("llama-2-70b", 68.98),
                                            ("llama-3-8b", 8.03), ("mistral-7b", 7.24), ("qwen3-32b", 32.76)])
def test_parameter_counts_match_published(name, billions):
    assert get_model(name).params / 1e9 == pytest.approx(billions, rel=0.005)


def test_quantised_sizes_scale_with_bits():
    spec = get_model("llama-3-8b")
    assert spec.weight_bytes("fp8") == pytest.approx(spec.weight_bytes("fp16") / 2, rel=1e-6)
    assert spec.weight_bytes("q4") == pytest.approx(spec.weight_bytes("fp16") * 4.5 / 16, rel=1e-6)
    assert spec.kv_bytes_per_token("fp8") == spec.kv_bytes_per_token("fp16") // 2


def test_unknown_model_is_a_user_error():
    with pytest.raises(MmsimError, match="unknown model"):
        get_model("gpt-5")


def test_cli_models_show_json():
    out = subprocess.run(["mmsim", "models", "show", "qwen3-8b", "--json"], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    for key in ("name", "num_layers", "num_kv_heads", "head_dim", "params", "weight_bytes", "kv_bytes_per_token"):
        assert key in data
    assert data["kv_bytes_per_token"] == 147_456


def test_cli_bad_name_exits_2_without_traceback():
    out = subprocess.run(["mmsim", "models", "show", "nope"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "unknown model" in out.stderr
