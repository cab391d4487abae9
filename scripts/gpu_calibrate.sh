#!/usr/bin/env bash
# Full GPU calibration of Qwen2.5-3B, Qwen3-8B and Qwen2.5-14B on GPU 0, then validation of the profile
# against real torch decode loops; everything lands in $OUT. Budget: about 8 minutes on one H200
# (calibration under 6, validation under 2); the script stops itself at 9.
#
# A preflight step times the host CPU's products first: the host-CPU layers (what offload is priced from) run in the
# profile's dtype, and a CPU without native half-precision math runs them at ~1 GFLOP/s (an AVX2 EPYC here), where
# the three models' host grids (about 1 TFLOP) would take the whole budget. It picks bf16 (what H200 serving runs)
# or fp16, whichever the CPU runs natively, and drops the largest models whose host grids would not fit.
#
#   bash scripts/gpu_calibrate.sh                 # on the GPU machine, from the repository root
#   bash scripts/gpu_calibrate.sh --fetch-wheels  # beforehand, on a machine with PyPI (see below)
#
# Writes into $OUT (default ./gpu-calibration):
#   profile.json      the calibrated profile (load it with `mmsim profiles show` or use it in a scenario)
#   validation.json   one entry per validation loop: predicted vs measured decode tokens/s and the error
#   calibrate.log     progress and summaries
#   nvidia-smi.txt    the GPU as the driver reports it
#   vllm/             when vLLM (CUDA build) imports there: profile.json from `calibrate --engine vllm --gpu 0`
#                     (Qwen2.5-3B, bf16, added to the layer profile above), validation.json/.html from
#                     `validate vllm` at light/mid/heavy load, vllm.log. MMSIM_VLLM=0 skips it; without vLLM
#                     it is skipped with a line saying so (the device image has no vLLM, and its wheels are
#                     far larger than what a run can carry: a machine with vLLM installed runs it unchanged).
#
# The device machines' image has torch, safetensors, nvidia-ml-py, numpy, pyyaml and rich but not pydantic,
# which the profile schema needs. `--fetch-wheels` downloads it (and its own needs) for CPython 3.12 into
# .whl/ (git-ignored); carry .whl to the GPU machine and this script installs it into /tmp/site.
# Only calibrate/ and the schema modules of sim/ are imported, not the simulator's CLI.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 typing-extensions==4.15.0)
if [[ "${1:-}" == "--fetch-wheels" ]]; then
  platforms=()
  for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
    platforms+=(--platform "$p")
  done
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "${WHEELS[@]}"
  exit 0
fi

OUT=${OUT:-$PWD/gpu-calibration}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -c "import torch, safetensors, pydantic, yaml, rich, numpy" || {
  echo "missing Python packages: run 'bash scripts/gpu_calibrate.sh --fetch-wheels' where PyPI is reachable, carry .whl" >&2
  exit 2
}
nvidia-smi -q >"$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi did not answer" >"$OUT/nvidia-smi.txt"

SCRATCH=$(mktemp -d /var/tmp/mmsim-calibrate.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
started=$SECONDS

read -r DTYPE MODELS < <(python3 - <<'PY' 2>>"$OUT/calibrate.log"
import sys
import time

import torch

from calibrate.plan import HOST_CPU_NEXT_TO_GPU as GRID
from sim.catalogue import get_model

MODELS = ("qwen2.5-3b", "qwen3-8b", "qwen2.5-14b")


def host_grid_flop(name):
    """FLOP of one model's host-CPU grid, warm-up rounds included (attention over the short contexts left out)."""
    spec = get_model(name)
    rows = sum(GRID.prefill_tokens) + sum(GRID.decode_batches) * len(GRID.decode_contexts)
    per_round = 2 * spec.layer_params * rows + 2 * spec.lm_head_params * sum(GRID.decode_batches)
    return per_round * (GRID.warmup + GRID.repeats)


BUDGET_S = 120


def flops_per_s(dtype, size=512):
    a = torch.randn(size, size).to(dtype)
    torch.matmul(a, a)
    began = time.perf_counter()
    torch.matmul(a, a)
    return 2 * size**3 / (time.perf_counter() - began)


rates = {name: flops_per_s(dtype) for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16),
                                                      ("fp16", torch.float16))}
print("host CPU GFLOP/s: " + ", ".join(f"{name} {rate / 1e9:.1f}" for name, rate in rates.items()), file=sys.stderr)
dtype = max(("bf16", "fp16"), key=lambda name: (rates[name] * 10 >= rates["fp32"], name == "bf16"))
models, spent = [], 0.0
for model, flop in ((name, host_grid_flop(name)) for name in MODELS):
    if spent + flop / rates[dtype] <= BUDGET_S or not models:
        models.append(model)
        spent += flop / rates[dtype]
print(f"calibrating {', '.join(models)} in {dtype}: host-CPU grids about {spent:.0f} s", file=sys.stderr)
print(dtype, ",".join(models))
PY
)
[[ -n "${MODELS:-}" ]] || { echo "the preflight step failed: see $OUT/calibrate.log" >&2; exit 2; }

timeout 400 python3 - "$OUT/profile.json" "$SCRATCH" "$MODELS" "$DTYPE" <<'PY' 2>&1 | tee -a "$OUT/calibrate.log"
import sys
from pathlib import Path

from calibrate.commands import calibrate_command
from sim.errors import MmsimError

out, scratch, models, dtype = sys.argv[1:]
try:
    calibrate_command(gpu=0, device=None, models=models, quick=False, out=Path(out), dtype=dtype, workdir=Path(scratch))
except MmsimError as error:
    sys.exit(f"error: {error}")
PY
echo "calibration took $((SECONDS - started)) s" | tee -a "$OUT/calibrate.log"

# Validation: all-GPU decode of 8 layers of each calibrated model at batch 16 (the batch the LM head cost is quoted
# at), then Qwen3-8B (else the one model) with 2 of its 8 layers on the CPU to check the offload formula.
timeout 140 python3 - "$OUT/profile.json" "$OUT/validation.json" "$MODELS" <<'PY' 2>&1 | tee -a "$OUT/calibrate.log"
import json
import os
import sys

from calibrate.commands import validate_command
from calibrate.validate import LoopShape

profile, out, models = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
runs = [(model, LoopShape(8, 0, 16, 512, 64)) for model in models]
runs.append(("qwen3-8b" if "qwen3-8b" in models else models[0], LoopShape(8, 2, 4, 128, 32)))
results = []
for model, shape in runs:
    results.append(validate_command(profile, model, None, shape, repeats=5, as_json=False, record=False))
    with open(out + ".tmp", "w") as handle:  # rewritten after each loop so a timeout keeps what finished
        json.dump(results, handle, indent=1)
    os.replace(out + ".tmp", out)
print(json.dumps([{k: r[k] for k in ("model", "layers", "cpu_layers", "batch", "predicted_tokens_per_s",
                                     "measured_tokens_per_s", "error_pct")} for r in results], indent=1))
PY
echo "calibration and validation took $((SECONDS - started)) s" | tee -a "$OUT/calibrate.log"

# Real-engine calibration and validation on the GPU (vLLM CUDA build): the same commands as on a CPU machine.
if [[ "${MMSIM_VLLM:-1}" == "1" ]] && python3 -c "import vllm" >/dev/null 2>&1; then
  mkdir -p "$OUT/vllm"
  left=$((540 - (SECONDS - started)))
  if (( left < 120 )); then
    echo "vLLM: skipped, ${left} s left of the 9-minute budget" | tee -a "$OUT/calibrate.log"
  else
    timeout "$left" python3 - "$OUT/profile.json" "$OUT/vllm" <<'PY' 2>&1 | tee "$OUT/vllm/vllm.log"
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.vllm_commands import calibrate_engine_command, validate_vllm_command
from calibrate.vllm_engine import EngineLimits
from sim.errors import MmsimError

base, out = Path(sys.argv[1]), Path(sys.argv[2])
limits = EngineLimits(max_num_seqs=64, max_num_batched_tokens=8192, block_size=16, max_model_len=8192,
                      gpu_memory_utilization=0.85)
try:
    profile = calibrate_engine_command("qwen2.5-3b", None, "bf16", "cuda:0", limits, True, out / "profile.json", out,
                                       base if base.exists() else None)
    rng = np.random.default_rng(3)
    requests = 200
    pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1 / 20, requests)), "model": "qwen2.5-3b",
                  "prompt_tokens": rng.integers(128, 2049, requests), "output_tokens": rng.integers(32, 257, requests)}
                 ).to_csv(out / "trace.csv", index=False)
    # Loads are factors on the trace's 20 requests/s: light, mid and heavy for a 3B model on one H200.
    validate_vllm_command(out / "trace.csv", profile, [0.5, 1.5, 4.0], "qwen2.5-3b", None, "bf16", "cuda:0", limits,
                          out, None, False, 0)
except MmsimError as error:
    sys.exit(f"error: {error}")
PY
  fi
else
  echo "vLLM: skipped (MMSIM_VLLM=0, or vllm does not import in this python3)" | tee -a "$OUT/calibrate.log"
fi
echo "all done in $((SECONDS - started)) s" | tee -a "$OUT/calibrate.log"
