#!/usr/bin/env bash
# Full GPU calibration of Qwen2.5-3B, Qwen3-8B and Qwen2.5-14B on GPU 0, then validation of the profile
# against real torch decode loops; everything lands in $OUT. Budget: about 8 minutes on one H200
# (calibration under 6, validation under 2); the script stops itself at 9.
#
#   bash scripts/gpu_calibrate.sh                 # on the GPU machine, from the repository root
#   bash scripts/gpu_calibrate.sh --fetch-wheels  # beforehand, on a machine with PyPI (see below)
#
# Writes into $OUT (default ./gpu-calibration):
#   profile.json      the calibrated profile (load it with `mmsim profiles show` or use it in a scenario)
#   validation.json   one entry per validation loop: predicted vs measured decode tokens/s and the error
#   calibrate.log     progress and summaries
#   nvidia-smi.txt    the GPU as the driver reports it
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
MODELS=qwen2.5-3b,qwen3-8b,qwen2.5-14b
started=$SECONDS

timeout 400 python3 - "$OUT/profile.json" "$SCRATCH" "$MODELS" <<'PY' 2>&1 | tee "$OUT/calibrate.log"
import sys
from pathlib import Path

from calibrate.commands import calibrate_command
from sim.errors import MmsimError

out, scratch, models = sys.argv[1:]
try:
    calibrate_command(gpu=0, device=None, models=models, quick=False, out=Path(out), dtype="fp16", workdir=Path(scratch))
except MmsimError as error:
    sys.exit(f"error: {error}")
PY
echo "calibration took $((SECONDS - started)) s" | tee -a "$OUT/calibrate.log"

# Validation: all-GPU decode of 8 layers of each model at batch 16 (the batch the LM head cost is quoted at),
# then Qwen3-8B with 2 of its 8 layers on the CPU to check the offload formula.
timeout 140 python3 - "$OUT/profile.json" "$OUT/validation.json" <<'PY' 2>&1 | tee -a "$OUT/calibrate.log"
import json
import os
import sys

from calibrate.commands import validate_command
from calibrate.validate import LoopShape

profile, out = sys.argv[1:]
runs = [("qwen2.5-3b", LoopShape(8, 0, 16, 512, 64)), ("qwen3-8b", LoopShape(8, 0, 16, 512, 64)),
        ("qwen2.5-14b", LoopShape(8, 0, 16, 512, 64)), ("qwen3-8b", LoopShape(8, 2, 4, 128, 32))]
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
