"""Trace values past what every command can carry, given to the real ``mmsim`` in a subprocess: a prefix id past
int64 (the Parquet writer's type), a JSON integer of more digits than Python converts (4,300), and an SLO class label
of megabytes. Each is refused when the trace is read, by every command alike: one ``error:`` line naming the file,
the line (or row) and the value, exit 2, no traceback, no output left behind. Every command runs under a timeout."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import MMSIM_CLI, wall_clock_limit
from tests.test_bad_input import TRACE_HEADER, tiny_scenario, write, write_yaml

COMMAND_TIMEOUT_S = 60
"""Each command's bound: a refusal takes a second or two; the 1 MB label took the old code seconds, 20 MB minutes."""
TEST_TIMEOUT_S = 240
BIG_ID = 2**63  # one past the largest int64
MODEL = "qwen2.5-3b"


def mmsim(args, cwd: Path) -> tuple[int, str]:
    """Run ``mmsim ARGS`` as a user would, in ``cwd``; (exit code, stdout + stderr)."""
    result = subprocess.run([*MMSIM_CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                            timeout=COMMAND_TIMEOUT_S)
    return result.returncode, result.stdout + result.stderr


def one_error_line(code: int, text: str, expected: tuple[str, ...]) -> str:
    """Assert a refusal: exit 2 and one ``error:`` line holding each of ``expected``, cut short, no traceback."""
    assert "Traceback" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), text[-3000:]
    for part in expected:
        assert part in lines[0], lines[0][:3000]
    assert len(lines[0]) < 1000, "a long value must be cut in the message"
    return lines[0]


def refused(args, cwd: Path, *expected: str, out: Path | None = None) -> str:
    """:func:`one_error_line` of ``mmsim ARGS``, and nothing at ``out`` (nor the writer's temporary file beside it)."""
    line = one_error_line(*mmsim(args, cwd), expected)
    if out is not None:
        assert not out.exists(), f"{out} was left behind"
        assert not list(out.parent.glob(f".{out.name}.*")), "the writer's temporary file was left behind"
    return line


def scenario_for(tmp_path: Path, trace: Path) -> Path:
    return write_yaml(tmp_path / "s.yaml", tiny_scenario(workload={"trace": {"path": trace.name}}))


def _native_parquet(path: Path, **columns) -> Path:
    base = {"arrival_s": pa.array([0.0, 1.0]), "model": pa.array([MODEL, MODEL]),
            "prompt_tokens": pa.array([1024, 1024]), "output_tokens": pa.array([10, 10])}
    pq.write_table(pa.table({**base, **columns}), path)
    return path


# --- 1. prefix ids are whole numbers from 0 to 2**63-1 --------------------------------------------------------------

def test_a_prefix_id_past_int64_is_refused_by_every_command(tmp_path):
    trace = write(tmp_path / "big.csv", TRACE_HEADER.strip() + f",prefix_ids\n0,{MODEL},1024,10,{BIG_ID}\n")
    other = write(tmp_path / "other.csv", TRACE_HEADER + f"0,{MODEL},100,10\n")
    where = f"{trace.name}: line 2: prefix_ids id {BIG_ID} is more than 9,223,372,036,854,775,807"
    with wall_clock_limit(TEST_TIMEOUT_S):
        for name in ("out.parquet", "out.csv", "out.jsonl"):  # Parquet crashed (OverflowError); the others wrote it
            refused(["trace", "import", "mmsim", trace.name, name], tmp_path, where, out=tmp_path / name)
        refused(["trace", "merge", other.name, trace.name, "merged.parquet"], tmp_path, where,
                out=tmp_path / "merged.parquet")
        refused(["trace", "stats", trace.name], tmp_path, where)
        refused(["run", scenario_for(tmp_path, trace).name, "--out", "r"], tmp_path, where, out=tmp_path / "r")


def test_a_mooncake_hash_id_past_int64_is_refused(tmp_path):
    trace = write(tmp_path / "m.jsonl", json.dumps({"timestamp": 0, "input_length": 1024, "output_length": 10,
                                                    "hash_ids": [BIG_ID]}) + "\n")
    with wall_clock_limit(TEST_TIMEOUT_S):
        refused(["trace", "import", "mooncake", trace.name, "out.parquet", "--model", MODEL], tmp_path,
                f"{trace.name}: line 1: hash_ids id {BIG_ID} is more than 9,223,372,036,854,775,807",
                out=tmp_path / "out.parquet")


def test_a_uint64_parquet_prefix_id_past_int64_is_refused(tmp_path):
    trace = _native_parquet(tmp_path / "u.parquet", prefix_ids=pa.array([[1, 2], [BIG_ID]], pa.list_(pa.uint64())))
    with wall_clock_limit(TEST_TIMEOUT_S):
        refused(["trace", "import", "mmsim", trace.name, "out.parquet"], tmp_path,
                f"{trace.name}: row 2: prefix_ids id {BIG_ID} is more than", out=tmp_path / "out.parquet")
        refused(["trace", "stats", trace.name], tmp_path, f"{trace.name}: row 2: prefix_ids id {BIG_ID}")


def test_prefix_ids_from_0_to_the_largest_int64_are_read_and_written(tmp_path):
    largest = 2**63 - 1
    ids = pa.array([[0, largest], [largest]], pa.list_(pa.uint64()))
    trace = _native_parquet(tmp_path / "ok.parquet", prefix_ids=ids)
    with wall_clock_limit(TEST_TIMEOUT_S):
        code, text = mmsim(["trace", "import", "mmsim", trace.name, "out.parquet"], tmp_path)
        assert code == 0, text
    assert pq.read_table(tmp_path / "out.parquet").column("prefix_ids").to_pylist() == [[0, largest], [largest]]


@pytest.mark.parametrize("name, content", [
    ("neg.csv", TRACE_HEADER.strip() + f",prefix_ids\n0,{MODEL},1024,10,1 -3\n"),
    ("neg.jsonl", json.dumps({"arrival_s": 0, "model": MODEL, "prompt_tokens": 1024, "output_tokens": 10,
                              "prefix_ids": [1, -3]}) + "\n"),
])
def test_a_negative_prefix_id_is_refused(tmp_path, name, content):
    trace = write(tmp_path / name, content)
    line = "line 2" if name.endswith(".csv") else "line 1"
    with wall_clock_limit(TEST_TIMEOUT_S):
        refused(["trace", "import", "mmsim", trace.name, "out.parquet"], tmp_path,
                f"{trace.name}: {line}: prefix_ids id -3 is less than 0", out=tmp_path / "out.parquet")


# --- 2. JSON integers of more than 4,300 digits -----------------------------------------------------------------------

HUGE = "9" * 5000


def test_a_jsonl_number_of_5000_digits_is_a_bad_row_for_every_command(tmp_path):
    trace = write(tmp_path / "huge.jsonl", f'{{"arrival_s":0,"model":"{MODEL}","prompt_tokens":{HUGE},'
                                           '"output_tokens":10}\n')
    where = f"{trace.name}: line 1: prompt_tokens 9999"
    why = "(5000 characters) is more than 10,000,000"
    with wall_clock_limit(TEST_TIMEOUT_S):
        refused(["trace", "stats", trace.name], tmp_path, where, why)
        refused(["trace", "import", "mmsim", trace.name, "out.parquet"], tmp_path, where, why,
                out=tmp_path / "out.parquet")
        refused(["run", scenario_for(tmp_path, trace).name, "--out", "r"], tmp_path, where, why, out=tmp_path / "r")
        # --skip-bad drops and counts the row instead, as any bad row
        code, text = mmsim(["trace", "stats", trace.name, "--skip-bad", "--json"], tmp_path)
        assert code == 0 and json.loads(text)["trace_rows"]["skipped_malformed"] == 1, text[-2000:]


def test_a_mooncake_line_with_a_5000_digit_number_is_a_bad_row(tmp_path):
    lines = ['{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}',
             f'{{"timestamp": 1, "input_length": -{HUGE}, "output_length": 5, "hash_ids": [1]}}',
             f'{{"timestamp": 2, "input_length": 100, "output_length": 5, "hash_ids": [1, {HUGE}]}}']
    with wall_clock_limit(TEST_TIMEOUT_S):
        trace = write(tmp_path / "m.jsonl", "\n".join(lines) + "\n")
        refused(["trace", "import", "mooncake", trace.name, "out.csv", "--model", MODEL], tmp_path,
                f"{trace.name}: line 2: input_length -9999", "(5001 characters) is less than 1",
                out=tmp_path / "out.csv")
        write(trace, "\n".join(lines[::2]) + "\n")
        refused(["trace", "import", "mooncake", trace.name, "out.csv", "--model", MODEL], tmp_path,
                f"{trace.name}: line 2: hash_ids id 9999", "(5000 characters) is more than 9,223,372,036,854,775,807",
                out=tmp_path / "out.csv")


def test_a_5000_digit_prefix_id_in_native_jsonl(tmp_path):
    trace = write(tmp_path / "p.jsonl", f'{{"arrival_s":0,"model":"{MODEL}","prompt_tokens":10,"output_tokens":10,'
                                        f'"prefix_ids":[{HUGE}]}}\n')
    with wall_clock_limit(TEST_TIMEOUT_S):
        refused(["trace", "stats", trace.name], tmp_path, f"{trace.name}: line 1: prefix_ids id 9999", "is more than")


# --- 3. SLO class labels are at most 200 characters (as names are) ----------------------------------------------------

def _labelled(path: Path, label: str) -> Path:
    row = {"arrival_s": 0, "model": MODEL, "prompt_tokens": 100, "output_tokens": 10, "slo_class": label}
    return write(path, json.dumps(row) + "\n")


def test_a_megabyte_slo_class_is_refused_at_once(tmp_path):
    # The old code drew it into the per-class table: 26 s for 3 MB, over 400 s for 20 MB.
    trace = _labelled(tmp_path / "long.jsonl", "x" * 1_000_000)
    where = f"{trace.name}: line 1: slo_class 'xxxx"
    why = "(1000000 characters)' is longer than 200 characters"
    with wall_clock_limit(TEST_TIMEOUT_S):
        refused(["run", scenario_for(tmp_path, trace).name, "--out", "r"], tmp_path, where, why, out=tmp_path / "r")
        refused(["trace", "stats", trace.name], tmp_path, where, why)
        refused(["trace", "import", "mmsim", trace.name, "out.parquet"], tmp_path, where, why,
                out=tmp_path / "out.parquet")


def test_slo_class_labels_end_at_200_characters_in_every_native_format(tmp_path):
    with wall_clock_limit(TEST_TIMEOUT_S):
        code, text = mmsim(["trace", "stats", _labelled(tmp_path / "ok.jsonl", "g" * 200).name, "--json"], tmp_path)
        assert code == 0 and json.loads(text)["requests"] == 1, text[-2000:]
        label = "g" * 201
        csv = write(tmp_path / "t.csv", TRACE_HEADER.strip() + f",slo_class\n0,{MODEL},100,10,gold\n1,{MODEL},100,10,"
                                                                f"{label}\n")
        parquet = _native_parquet(tmp_path / "t.parquet", slo_class=pa.array(["gold", label]))
        for trace, where in ((_labelled(tmp_path / "t.jsonl", label), "line 1"), (csv, "line 3"),
                             (parquet, "row 2")):
            refused(["trace", "stats", trace.name], tmp_path, f"{trace.name}: {where}: slo_class 'gggg",
                    "(201 characters)' is longer than 200 characters")
