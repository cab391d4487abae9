"""Bad input and special files: each class of issue 14 gives one line, exit code 2, no traceback, no output.

Outputs and faults are in test_bad_input_outputs.py, traces in test_bad_input_traces.py; generated cases in
test_fuzz_inputs.py.

Every case runs the CLI in this process (as the ``mmsim`` entry point does) under a time limit, so a hang
fails the test instead of stalling it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
from pathlib import Path

import pytest
import yaml

from sim.cli import main

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "sim" / "data" / "profiles" / "paper-rtx5000.json"
TRACE_HEADER = "arrival_s,model,prompt_tokens,output_tokens\n"


class Hang(BaseException):
    """Raised by the alarm when a command runs past its time limit (not an Exception: nothing may catch it)."""


def cli(*args, timeout_s: float = 30.0, cwd: Path | None = None) -> tuple[int, str]:
    """Run ``mmsim ARGS`` in this process; (exit code, stdout + stderr). A run past ``timeout_s`` raises Hang."""
    def expire(signum, frame):
        raise Hang(f"mmsim {' '.join(map(str, args))} ran past {timeout_s} s")

    output = io.StringIO()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    sys.argv = ["mmsim", *map(str, args)]
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
    return code, output.getvalue()


def assert_refused(code: int, text: str, expected: tuple[str, ...]) -> None:
    """Exit 2 and one ``error:`` line containing each of ``expected``, no traceback."""
    assert code == 2, text
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    for part in expected:
        assert part in text, text


def refused(args, *expected: str, out: Path | None = None, **kwargs) -> str:
    """Assert the command is refused: exit 2, one ``error:`` line containing ``expected``, nothing at ``out``."""
    code, text = cli(*args, **kwargs)
    assert_refused(code, text, expected)
    if out is not None:
        assert not Path(out).exists(), f"{out} was left behind"
    return text


def tiny_scenario(**overrides) -> dict:
    """A scenario that runs in a fraction of a second."""
    data = {
        "name": "tiny", "seed": 1, "profile": "paper-rtx5000",
        "cluster": {"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 64},
        "models": [{"name": "qwen2.5-3b"}],
        "workload": {"generator": {"duration_s": 3, "arrivals": {"process": "poisson", "rate_per_s": 2.0},
                                   "mix": {"qwen2.5-3b": 1.0},
                                   "prompt_tokens": {"dist": "constant", "value": 64},
                                   "output_tokens": {"dist": "constant", "value": 8}}},
        "slo": {"default": {"ttft_s": 2.0, "tpot_s": 0.1}},
        "policy": {"name": "static"},
    }
    data.update(overrides)
    return data


def write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def write_yaml(path: Path, data: dict) -> Path:
    return write(path, yaml.safe_dump(data))


def set_field(data: dict, dotted: str, value) -> dict:
    node = data
    *parents, last = dotted.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[last] = value
    return data


# --- encodings and depth --------------------------------------------------------------------------------------

@pytest.mark.parametrize("content", [bytes([0x99, 0x01, 0xFE, 0xFF]), "name: x\n".encode("utf-16")])
def test_scenario_not_utf8(tmp_path, content):
    path = write(tmp_path / "s.yaml", content)
    refused(["run", path, "--out", tmp_path / "o"], str(path), "not UTF-8", out=tmp_path / "o")


def test_lone_surrogate_name_is_refused_before_running(tmp_path):
    path = write(tmp_path / "s.yaml", yaml.safe_dump(tiny_scenario()).replace("name: tiny", 'name: "\\ud800"'))
    refused(["run", path, "--out", tmp_path / "o"], "surrogate", out=tmp_path / "o")


def test_profile_not_utf8(tmp_path):
    profile = write(tmp_path / "p.json", b"\x99\x01\xfe\xff")
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(profile=str(profile)))
    refused(["run", scenario, "--out", tmp_path / "o"], str(profile), "not UTF-8", out=tmp_path / "o")


def test_conversation_prompt_beyond_prefix_ids(tmp_path):
    # A 2M-token system prompt in one-token blocks: more blocks than a prompt's prefix ids can number.
    data = tiny_scenario()
    data["workload"]["generator"]["conversations"] = {"system_prompt_tokens": 2_000_000}
    data["workload"]["prefix_block_tokens"] = 1
    scenario = write_yaml(tmp_path / "s.yaml", data)
    refused(["run", scenario, "--out", tmp_path / "o"], str(scenario), "workload.prefix_block_tokens",
            out=tmp_path / "o")


@pytest.mark.parametrize("text", ["[" * 1000 + "]" * 1000, "[" * 100_000 + "]" * 100_000,
                                  "a: " + "{b: " * 50_000 + "1" + "}" * 50_000, "- " * 50_000 + "1"],
                         ids=["flow-1k", "flow-100k", "mappings-50k", "block-50k"])
def test_deep_yaml(tmp_path, text):
    # Tens of thousands of levels overflow libyaml's C stack (a crash, not an error): such texts must take the
    # Python parser, which refuses them.
    path = write(tmp_path / "s.yaml", text)
    refused(["run", path, "--out", tmp_path / "o"], "nested too deeply", out=tmp_path / "o")


def test_deep_json_in_trace_and_profile(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    trace = write(tmp_path / "t.jsonl", deep + "\n")
    refused(["trace", "stats", trace], str(trace), "line 1")
    profile = write(tmp_path / "p.json", deep)
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(profile=str(profile)))
    refused(["run", scenario, "--out", tmp_path / "o"], "nested too deeply", out=tmp_path / "o")


# --- numbers: finite, in range, of the right type -------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("workload.generator.arrivals.rate_per_s", float("inf")),
    ("cluster.gpu_memory_gb", float("inf")),
    ("cluster.host_memory_gb", float("inf")),
    ("workload.generator.mix.qwen2.5-3b", float("inf")),
    ("workload.generator.output_tokens", {"dist": "lognormal", "mean": 100, "cv": 1e308}),
    ("workload.generator.arrivals", {"process": "gamma", "rate_per_s": 1.0, "cv": float("inf")}),
    ("workload.generator.arrivals", {"process": "gamma", "rate_per_s": 1.0, "cv": 1e-300}),  # 1/cv**2: a division by 0
    ("workload.generator.arrivals", {"process": "rate-series", "windows": [[0, 1.0, 1e-300]]}),
    ("workload.output_length_error", float("inf")),
    ("cluster.gpus_per_node", 10**18),
    ("cluster.nodes", 10**18),
    ("workload.generator.duration_s", 1e300),
    ("workload.generator.max_requests", 10**18),
    ("seed", -1),
    ("slo.default.tpot_s", True),
    ("engine.max_num_seqs", "64"),
])
def test_scenario_number_out_of_range(tmp_path, field, value):
    data = tiny_scenario()
    if field == "workload.generator.mix.qwen2.5-3b":
        data["workload"]["generator"]["mix"]["qwen2.5-3b"] = value
    else:
        set_field(data, field, value)
    path = write_yaml(tmp_path / "s.yaml", data)
    leaf = field.split(".")[-1] if field != "workload.generator.mix.qwen2.5-3b" else "mix"
    refused(["run", path, "--out", tmp_path / "o"], str(path), leaf, out=tmp_path / "o")


def test_absurd_run_size_is_refused_with_the_figure(tmp_path):
    data = tiny_scenario()
    set_field(data, "workload.generator.duration_s", 1e8)
    path = write_yaml(tmp_path / "s.yaml", data)
    refused(["run", path, "--out", tmp_path / "o"], "2e+08 requests", out=tmp_path / "o")
    set_field(data, "workload.generator.arrivals.rate_per_s", 100.0)
    path = write_yaml(tmp_path / "s.yaml", data)
    refused(["run", path, "--out", tmp_path / "o"], "1e+10 requests", out=tmp_path / "o")


def _profile(tmp_path, edit) -> Path:
    data = json.loads(PROFILE.read_text())
    edit(data)
    return write(tmp_path / "p.json", json.dumps(data))


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["models"]["qwen2.5-3b"]["gpu"].update(decode_base_s=float("inf")), "decode_base_s"),
    (lambda d: d["models"]["qwen2.5-3b"]["gpu"].update(decode_base_s=1e300), "decode_base_s"),
    (lambda d: d["weights"]["from_disk"].update(bandwidth_bytes_per_s=1e-300), "bandwidth_bytes_per_s"),
    (lambda d: d["hardware"]["gpu"].update(memory_bytes="16e9"), "memory_bytes"),
    (lambda d: d["hardware"]["gpu"].update(memory_bytes=True), "memory_bytes"),
])
def test_profile_numbers(tmp_path, edit, expected):
    profile = _profile(tmp_path, edit)
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    refused(["run", scenario, "--profile", profile, "--out", tmp_path / "o"], str(profile), expected,
            out=tmp_path / "o")


def test_profile_duplicate_key(tmp_path):
    text = PROFILE.read_text().replace('"schema_version": 1,', '"schema_version": 1, "schema_version": 1,', 1)
    profile = write(tmp_path / "p.json", text)
    refused(["run", write_yaml(tmp_path / "s.yaml", tiny_scenario()), "--profile", profile, "--out", tmp_path / "o"],
            "given twice", out=tmp_path / "o")


@pytest.mark.parametrize("args", [
    ["run", "{s}", "--seed", "-1", "--out", "{o}"],
    ["trace", "generate", "--out", "{o}", "--seed", "-1", "--duration", "2", "--rate", "1", "--mix", "qwen3-8b=1"],
])
def test_negative_seed_flags(tmp_path, args):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    out = tmp_path / "o.csv"
    code, text = cli(*[a.format(s=scenario, o=out) for a in args])
    assert code == 2 and "Traceback" not in text and "--seed" in text and not out.exists()


# --- silent accepts ----------------------------------------------------------------------------------------------

def test_mix_naming_an_unserved_model(tmp_path):
    data = tiny_scenario()
    data["workload"]["generator"]["mix"] = {"qwen2.5-3b": 0.5, "qwen3-8b": 0.5}
    refused(["run", write_yaml(tmp_path / "s.yaml", data), "--out", tmp_path / "o"], "mix", "'qwen3-8b'",
            "not served", out=tmp_path / "o")


def test_duplicate_yaml_keys(tmp_path):
    text = yaml.safe_dump(tiny_scenario()) + "seed: 2\n"
    refused(["run", write(tmp_path / "s.yaml", text), "--out", tmp_path / "o"], "'seed' given twice",
            out=tmp_path / "o")


@pytest.mark.parametrize("flags, expected", [
    (["--policies", "no-such"], "unknown policy 'no-such'"),
    (["--gpus-for-load", "-1"], "--gpus-for-load"), (["--gpus-for-load", "0"], "--gpus-for-load"),
    (["--seed-list", ","], "--seed-list"), (["--max-gpus", "0"], "--max-gpus"), (["--workers", "0"], "--workers"),
    (["--high", "inf"], "--high"), (["--slo-target", "nan"], "--slo-target"),
])
def test_capacity_flags(tmp_path, flags, expected):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario())
    code, text = cli("capacity", scenario, *flags, "--out", tmp_path / "o")
    assert code == 2 and "Traceback" not in text and expected in text and not (tmp_path / "o").exists(), text


# --- special files -----------------------------------------------------------------------------------------------

def test_fifo_and_devices_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "s.yaml"
    os.mkfifo(fifo)
    refused(["run", fifo, "--out", tmp_path / "o"], "not a regular file", timeout_s=10)
    trace_fifo = tmp_path / "t.csv"
    os.mkfifo(trace_fifo)
    refused(["trace", "stats", trace_fifo], "not a regular file", timeout_s=10)
    refused(["run", "/dev/zero", "--out", tmp_path / "o"], "not a regular file", timeout_s=10)
    scenario = write_yaml(tmp_path / "ok.yaml", tiny_scenario())
    refused(["run", scenario, "--profile", "/dev/zero", "--out", tmp_path / "o"], "not a regular file", timeout_s=10)
    with_trace = write_yaml(tmp_path / "tr.yaml", tiny_scenario(workload={"trace": {"path": str(trace_fifo)}}))
    refused(["run", with_trace, "--out", tmp_path / "o"], "not a regular file", timeout_s=10)


def test_oversized_yaml_is_refused(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as handle:
        handle.truncate(17 << 20)
    refused(["run", big, "--out", tmp_path / "o"], "larger than", timeout_s=10)


@pytest.mark.parametrize("policy", [
    {"name": "time-slice", "params": {"quantum_s": 1e-300}},
    {"name": "time-slice", "params": {"quantum_s": "abc"}},
    {"name": "swap-aware", "params": {"keep_weights_on_host": "yes"}},
    {"name": "swap-aware", "params": {"benefit_ratio": float("inf")}},
])
def test_policy_parameters_are_checked(tmp_path, policy):
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(policy=policy))
    refused(["run", scenario, "--out", tmp_path / "o"], f"policy.params.{next(iter(policy['params']))}",
            out=tmp_path / "o")


def test_usage_errors_are_one_line(tmp_path):
    refused(["run", write_yaml(tmp_path / "s.yaml", tiny_scenario()), "--seed", "abc"], "--seed", "--help")


def test_yaml_aliases_that_explode_are_refused(tmp_path):
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join(f'*a{i - 1}' for _ in range(9))}]" for i in range(1, 10)]
    path = write(tmp_path / "s.yaml", "\n".join(lines) + "\n")
    refused(["run", path, "--out", tmp_path / "o"], "aliases", timeout_s=20)


@pytest.mark.parametrize(("policy", "expected"), [
    ({"name": "paper-preemption"}, ["policy.params", "asks for model 'qwen3-8b'", "serves 'qwen2.5-3b'"]),
    ({"name": "paper-preemption", "params": {"model_a": "qwen2.5-3b", "model_b": "qwen2.5-3b", "gpu": 3}},
     ["policy.params.gpu", "is 3; the cluster has GPUs 0 to 0"]),
    ({"name": "paper-offload", "params": {"gpu": 2}}, ["policy.params.gpu", "is 2"]),
    ({"name": "paper-offload", "params": {"gpu": 0.5}}, ["policy.params.gpu", "expected a whole number, not 0.5"]),
    ({"name": "paper-preemption", "params": {"model_a": "qwen2.5-3b", "model_b": "qwen2.5-3b", "preempt_after": 10.5}},
     ["policy.params.preempt_after", "expected a whole number, not 10.5"]),
])
def test_paper_policies_name_a_model_or_gpu_the_scenario_lacks(tmp_path, policy, expected):
    """`mmsim run scenarios/offload.yaml --policy paper-preemption` was a KeyError traceback (exit 1): the paper's
    policies name their models and GPU in parameters, whose defaults fit the paper's scenarios only. A fractional
    GPU index was a TypeError traceback, and a fractional token count no count at all."""
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(policy=policy))
    refused(["run", scenario, "--out", tmp_path / "o"], *expected, out=tmp_path / "o")
