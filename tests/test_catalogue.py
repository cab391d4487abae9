"""Model catalogue: architectures, sizes and the paper's KV/weight figures."""

from __future__ import annotations

import json
import subprocess

import pytest

from sim.catalogue import catalogue, get_model
from sim.errors import MmsimError

from conftest import MMSIM_CLI

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
    out = subprocess.run([*MMSIM_CLI, "models", "show", "qwen3-8b", "--json"], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    for key in ("name", "num_layers", "num_kv_heads", "head_dim", "params", "weight_bytes", "kv_bytes_per_token"):
        assert key in data
    assert data["kv_bytes_per_token"] == 147_456


def test_cli_bad_name_exits_2_without_traceback():
    out = subprocess.run([*MMSIM_CLI, "models", "show", "nope"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "unknown model" in out.stderr


# -- models from a Hugging Face config.json -----------------------------------------------------------------
QWEN25_3B_CONFIG = {  # Qwen/Qwen2.5-3B's published config.json (the fields mmsim reads, and some it ignores)
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008,
    "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
    "tie_word_embeddings": True, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "torch_dtype": "bfloat16"}


def write_config(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_a_config_json_gives_the_catalogue_architecture(tmp_path):
    from sim.catalogue import model_from_hf_config

    spec = model_from_hf_config(write_config(tmp_path, QWEN25_3B_CONFIG), "my-qwen")
    catalogued = get_model("qwen2.5-3b")
    assert spec.name == "my-qwen" and spec.head_dim == 128 and spec.qkv_bias
    assert spec.params == catalogued.params
    assert spec.kv_bytes_per_token("fp16") == 36_864


def test_a_moe_config_counts_every_expert_in_the_weights_and_the_routed_ones_in_the_flops(tmp_path):
    from sim.catalogue import model_from_hf_config

    # Qwen3-30B-A3B: 48 layers, 128 experts of 768, 8 per token (published: 30.5B parameters, 3.3B active).
    config = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
              "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
              "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False}
    spec = model_from_hf_config(write_config(tmp_path, config), "qwen3-moe")
    assert spec.params / 1e9 == pytest.approx(30.5, rel=0.01)
    active = spec.embedding_params + spec.num_layers * spec.active_layer_params + spec.lm_head_params
    assert active / 1e9 == pytest.approx(3.3, rel=0.05)


@pytest.mark.parametrize("missing", ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size",
                                     "intermediate_size"])
def test_a_config_without_an_architecture_field_names_it(tmp_path, missing):
    from sim.catalogue import model_from_hf_config

    data = {k: v for k, v in QWEN25_3B_CONFIG.items() if k != missing}
    with pytest.raises(MmsimError, match=f"missing field {missing}"):
        model_from_hf_config(write_config(tmp_path, data), "broken")


@pytest.mark.parametrize("edit, expected", [
    ({"num_attention_heads": 6}, "hidden_size 2048 is not a multiple of num_attention_heads 6"),
    ({"num_key_value_heads": 32}, "num_key_value_heads 32 must divide num_attention_heads 16"),
    ({"num_key_value_heads": 0}, "num_key_value_heads 0 must divide"),
])
def test_a_config_whose_heads_do_not_split_is_refused(tmp_path, edit, expected):
    """Each was accepted, and sized with a fractional head or more KV heads than heads."""
    from sim.catalogue import model_from_hf_config

    with pytest.raises(MmsimError, match=expected):
        model_from_hf_config(write_config(tmp_path, {**QWEN25_3B_CONFIG, **edit}), "broken")


def test_a_config_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    """A FIFO named as a model's config blocked the run for ever."""
    import os

    from sim.catalogue import model_from_hf_config

    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(MmsimError, match="not a regular file"):
        model_from_hf_config(tmp_path / "config.json", "fifo")


def test_a_scenario_serves_a_model_from_its_config(tmp_path):
    from sim.simulation import simulate
    from sim.scenario import parse_scenario

    config = write_config(tmp_path, QWEN25_3B_CONFIG)
    scenario = parse_scenario({
        "profile": "h100-sxm", "cluster": {"nodes": 1, "gpus_per_node": 1},
        "models": [{"config": str(config), "name": "my-qwen", "dtype": "bf16"}],
        "workload": {"generator": {"duration_s": 10, "arrivals": {"process": "poisson", "rate_per_s": 2.0},
                                   "prompt_tokens": {"dist": "constant", "value": 100},
                                   "output_tokens": {"dist": "constant", "value": 20}, "mix": {"my-qwen": 1.0}}}}, "test")
    result = simulate(scenario)
    assert len(result.requests) > 5 and result.requests["status"].eq("completed").all()


def test_a_scenario_config_that_is_missing_is_one_line(tmp_path):
    from sim.scenario import parse_scenario

    with pytest.raises(MmsimError, match="model config not found"):
        parse_scenario({"models": [{"config": str(tmp_path / "nowhere.json"), "name": "x"}],
                        "workload": {"trace": {"path": "t.csv"}}}, "test")


def test_a_config_cannot_take_a_catalogue_name(tmp_path):
    from sim.catalogue import model_from_hf_config, register_model

    with pytest.raises(MmsimError, match="is a catalogue model"):
        register_model(model_from_hf_config(write_config(tmp_path, QWEN25_3B_CONFIG), "qwen3-8b"))
