"""Bad model configs, profiles and trace prefix ids that were accepted or crashed: a config.json whose head_dim is 0
(a ZeroDivisionError deep in the run), one with more experts per token than experts, a zero vocabulary or FFN, or
``"no"`` for a boolean (``bool("no")`` is True); a profile putting 10**8 GPUs in a node, or giving schema_version
1.0 or an empty name; ``true`` among a trace's prefix ids. Each is refused in one line naming the file and field
(and row), exit code 2, no traceback, no output. Helpers are test_bad_input.py's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import mmsim_in_process
from sim.catalogue import model_from_hf_config
from sim.workload.columns import parse_prefix_ids
from tests.test_bad_input import PROFILE, TRACE_HEADER, cli, refused, tiny_scenario, write, write_yaml

LLAMA_CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}
"""Llama-3-8B's architecture fields, as its config.json gives them."""


def _config_scenario(tmp_path, edit: dict) -> tuple[Path, Path]:
    """(scenario, config): a scenario serving ``mymodel`` from a config.json holding Llama's fields updated by
    ``edit``."""
    path = write(tmp_path / "cfg.json", json.dumps({**LLAMA_CONFIG, **edit}))
    data = tiny_scenario(models=[{"name": "mymodel", "config": "cfg.json"}])
    data["workload"]["generator"]["mix"] = {"mymodel": 1.0}
    return write_yaml(tmp_path / "s.yaml", data), path


# --- config.json: every size positive, every flag a boolean, experts consistent --------------------------------

@pytest.mark.parametrize("edit, field, expected", [
    ({"head_dim": 0}, "head_dim", "expected a positive whole number, got 0"),
    ({"vocab_size": 0}, "vocab_size", "expected a positive whole number, got 0"),
    ({"intermediate_size": 0}, "intermediate_size", "expected a positive whole number, got 0"),
    ({"num_hidden_layers": 0}, "num_hidden_layers", "expected a positive whole number, got 0"),
    ({"hidden_size": 0}, "hidden_size", "expected a positive whole number, got 0"),
    ({"num_attention_heads": 0}, "num_attention_heads", "expected a positive whole number, got 0"),
    ({"head_dim": 128.0}, "head_dim", "expected a positive whole number, got 128.0"),
    ({"head_dim": True}, "head_dim", "expected a positive whole number, got true"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings", 'expected true or false, got "no"'),
    ({"tie_word_embeddings": 0}, "tie_word_embeddings", "expected true or false, got 0"),
    ({"attention_bias": "false"}, "attention_bias", 'expected true or false, got "false"'),
    ({"num_experts": 8, "num_experts_per_tok": 16}, "num_experts_per_tok", "16 is more than num_experts 8"),
    ({"num_local_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok", "9 is more than num_local_experts 8"),
    ({"num_experts": 8, "num_experts_per_tok": 0}, "num_experts_per_tok", "expected a positive whole number, got 0"),
    ({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 0, "intermediate_size": 0},
     "intermediate_size", "expected a positive whole number, got 0"),
    # DeepSeek's latent attention: priced by its heads, the KV cache would have been several times too large.
    ({"kv_lora_rank": 512}, "kv_lora_rank", "multi-head latent attention (DeepSeek-style MLA) is not modelled"),
])
def test_an_impossible_config_field_is_refused_by_run(tmp_path, edit, field, expected):
    scenario, config = _config_scenario(tmp_path, edit)
    refused(["run", scenario, "--out", tmp_path / "o"], f"{config}: {field}: {expected}", out=tmp_path / "o")


def test_a_zero_head_dim_no_longer_divides_by_zero_in_the_run(tmp_path, capsys):
    """The reported case, through the ``mmsim`` entry point: it was a ZeroDivisionError traceback, exit 1."""
    scenario, config = _config_scenario(tmp_path, {"head_dim": 0})
    code, out, err = mmsim_in_process(capsys, "run", scenario, "--out", tmp_path / "o")
    assert (code, out) == (2, "")
    assert err.strip() == f"error: {config}: head_dim: expected a positive whole number, got 0"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("edit, tied, bias, head_dim", [
    ({}, False, False, 128),  # llama's defaults: untied, no biases, hidden / heads
    ({"tie_word_embeddings": True, "attention_bias": True, "head_dim": 64}, True, True, 64),
    ({"tie_word_embeddings": None, "head_dim": None}, False, False, 128),  # JSON null: transformers' default
])
def test_good_flags_and_sizes_are_read_as_given(tmp_path, edit, tied, bias, head_dim):
    _, config = _config_scenario(tmp_path, edit)
    spec = model_from_hf_config(config, "mymodel")
    assert (spec.tied_embeddings, spec.qkv_bias, spec.head_dim) == (tied, bias, head_dim)
    assert spec.lm_head_params == (0 if tied else 128256 * 4096)


def test_a_moe_config_at_its_limits_is_accepted(tmp_path):
    _, config = _config_scenario(tmp_path, {"num_local_experts": 8, "num_experts_per_tok": 8})
    spec = model_from_hf_config(config, "mymodel")
    assert (spec.num_experts, spec.experts_per_token, spec.moe_ffn_size) == (8, 8, 14336)


# --- profile: the GPUs of a node bounded as the scenario bounds them; version and name ---------------------------

def _profile(tmp_path, **changes) -> Path:
    data = json.loads(PROFILE.read_text())
    gpus = changes.pop("gpus_per_node", None)
    if gpus is not None:
        data["hardware"]["gpu"]["gpus_per_node"] = gpus
    return write(tmp_path / "p.json", json.dumps(data | changes))


def _profile_scenario(tmp_path, profile: Path) -> Path:
    """A scenario whose cluster takes its GPUs per node from ``profile``."""
    return write_yaml(tmp_path / "s.yaml", tiny_scenario(profile=str(profile),
                                                         cluster={"nodes": 1, "host_memory_gb": 64}))


@pytest.mark.parametrize("gpus", [65, 10**6, 10**8])
def test_a_profile_cannot_put_more_gpus_in_a_node_than_a_scenario_may(tmp_path, gpus):
    """10**8 exhausted memory or hung, and 10**6 billed 2354 GPU-hours for two requests."""
    profile = _profile(tmp_path, gpus_per_node=gpus)
    refused(["run", _profile_scenario(tmp_path, profile), "--out", tmp_path / "o"],
            f"{profile}: hardware.gpu.gpus_per_node: ", "less than or equal to 64", out=tmp_path / "o", timeout_s=20)


def test_a_profile_with_64_gpus_per_node_still_runs(tmp_path):
    profile = _profile(tmp_path, gpus_per_node=64)
    code, text = cli("run", _profile_scenario(tmp_path, profile), "--out", tmp_path / "o")
    assert code == 0 and (tmp_path / "o" / "requests.parquet").exists(), text


@pytest.mark.parametrize("changes, field, expected", [
    ({"schema_version": 1.0}, "schema_version", "1.0 is not a whole number; write 1"),
    ({"schema_version": 2}, "schema_version", "version 2 is not supported; this mmsim reads version 1"),
    ({"name": ""}, "name", "must not be empty or blank"),
    ({"name": " \t"}, "name", "must not be empty or blank"),
])
def test_a_profile_version_or_name_that_is_no_such_thing_is_refused(tmp_path, changes, field, expected):
    profile = _profile(tmp_path, **changes)
    refused(["run", write_yaml(tmp_path / "s.yaml", tiny_scenario()), "--profile", profile, "--out", tmp_path / "o"],
            f"{profile}: {field}: {expected}", out=tmp_path / "o")


def test_a_profile_number_written_as_true_is_echoed_as_the_file_has_it(tmp_path):
    """The message said ``not True``, Python's spelling of the file's ``true``."""
    data = json.loads(PROFILE.read_text())
    data["hardware"]["gpu"]["memory_bytes"] = True
    profile = write(tmp_path / "p.json", json.dumps(data))
    refused(["run", write_yaml(tmp_path / "s.yaml", tiny_scenario()), "--profile", profile, "--out", tmp_path / "o"],
            f"{profile}: hardware.gpu: memory_bytes must be a number, not true", out=tmp_path / "o")


# --- trace prefix ids: true is no number --------------------------------------------------------------------------

PREFIX_REASON = "prefix_ids must be whole numbers"


def _jsonl(tmp_path, *prefixes: str):
    rows = [f'{{"arrival_s": {i}, "model": "qwen2.5-3b", "prompt_tokens": 100, "output_tokens": 5, '
            f'"prefix_ids": {ids}}}' for i, ids in enumerate(prefixes)]
    return write(tmp_path / "t.jsonl", "\n".join(rows) + "\n")


@pytest.mark.parametrize("ids", ["[true, false]", "[1, true]", "[false]"])
def test_a_boolean_prefix_id_in_jsonl_is_a_bad_row(tmp_path, capsys, ids):
    trace = _jsonl(tmp_path, "[1, 2]", ids)
    refused(["trace", "stats", trace], f"{trace}: line 2: {PREFIX_REASON}")
    code, out, _ = mmsim_in_process(capsys, "trace", "stats", trace, "--skip-bad", "--json")
    assert code == 0 and json.loads(out)["trace_rows"]["skipped_malformed"] == 1


def test_a_boolean_prefix_id_stops_a_run(tmp_path):
    trace = _jsonl(tmp_path, "[true, false]")
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(workload={"trace": {"path": trace.name}}))
    refused(["run", scenario, "--out", tmp_path / "o"], f"{trace}: line 1: {PREFIX_REASON}", out=tmp_path / "o")


def test_a_boolean_prefix_id_in_parquet_is_a_bad_row(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"arrival_s": [0.5, 1.0], "model": ["qwen2.5-3b"] * 2, "prompt_tokens": [10, 20],
                             "output_tokens": [5, 6], "prefix_ids": pa.array([[1, 2], [3]])}), path)
    code, text = cli("trace", "stats", path, "--json")
    assert code == 0 and json.loads(text)["requests"] == 2, text  # whole numbers are read
    pq.write_table(pa.table({"arrival_s": [0.5, 1.0], "model": ["qwen2.5-3b"] * 2, "prompt_tokens": [10, 20],
                             "output_tokens": [5, 6], "prefix_ids": pa.array([[True], [False, True]])}), path)
    refused(["trace", "stats", path], f"{path}: row 1: {PREFIX_REASON}")


@pytest.mark.parametrize("cell", [[True], (np.True_,), np.array([1, 0], dtype=bool)])
def test_parse_prefix_ids_refuses_booleans_of_every_kind(cell):
    assert parse_prefix_ids(cell, text=False) is False


def test_parse_prefix_ids_still_takes_numpy_integers():
    assert parse_prefix_ids(np.array([7, 8], dtype=np.int64), text=False) == (7, 8)


def test_a_csv_prefix_of_true_is_a_bad_row(tmp_path):
    trace = write(tmp_path / "t.csv", TRACE_HEADER.strip() + ",prefix_ids\n0.5,qwen2.5-3b,10,5,1 true\n")
    refused(["trace", "stats", trace], f"{trace}: line 2: {PREFIX_REASON}")


def test_a_trace_cell_true_is_echoed_as_the_file_wrote_it(tmp_path):
    trace = write(tmp_path / "t.jsonl", '{"arrival_s": 0.1, "model": "qwen2.5-3b", "prompt_tokens": true, '
                                        '"output_tokens": 5}\n')
    refused(["trace", "stats", trace], "line 1: prompt_tokens true is not a whole number")


def test_a_misspelt_dtype_of_a_profiles_model_is_refused(tmp_path):
    """Under ``fp99`` the measured entry never applied: the run fell back to the roofline estimate, without a word."""
    data = json.loads(PROFILE.read_text())
    name = next(iter(data["models"]))
    data["models"][name]["dtype"] = "fp99"
    profile = write(tmp_path / "p.json", json.dumps(data))
    refused(["run", write_yaml(tmp_path / "s.yaml", tiny_scenario()), "--profile", profile, "--out", tmp_path / "o"],
            f"{profile}: models.{name}.dtype: unknown dtype 'fp99'; expected one of fp32, fp16", out=tmp_path / "o")
