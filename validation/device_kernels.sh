#!/usr/bin/env bash
# One prepared run on one lent GPU (an H200: well under 6 minutes): compute kernels, the MLP's single-GPU step and
# the MoE layer's expert GEMMs and NCCL all_to_all, then the compute calibration fitted from them and its held-out
# error. Everything lands in $OUT (at most 8 files, the device tool's limit), each CSV headed by `# key: value`
# lines with the GPU, driver, CUDA, NCCL and torch versions and the command (validation/machine.py).
#
#   $OUT/kernels.csv            python -m validation.kernels: Llama 3 405B's layer GEMMs and flash attention (tp 8),
#                               a bf16 GEMM sweep 256..16384, SDPA shapes, norm/element-wise kernels 1M..256M
#   $OUT/kernels_22b.csv        the same for Korthikanti 2022's 22B layer (materialized attention's batched GEMMs)
#   $OUT/mlp_steps.csv          python -m validation.mlp, cut single (one GPU), fp32, gradients checked
#   $OUT/moe_a2a.csv            python -m validation.moe on NCCL (1 rank on one GPU: the all_to_all is the local copy
#   $OUT/moe_gemms.csv          NCCL does for a group of one; kept as a record, not fitted) and its expert GEMMs
#   $OUT/compute_calibration.yaml  simdist calibrate of hgx-h200 from the kernel CSVs (held-out sizes), versions on top
#   $OUT/validate.json          simdist validate --holdout sizes of the kernels: per-kernel errors, MAPE per kind
#   $OUT/device_kernels.log     everything printed, with the versions first
#
# Run from the repository root on the device machine, e.g. through the device tool:
#   run(command="bash validation/device_kernels.sh", carry=[".wheels"], timeout_s=420)
# The device image has torch, numpy, networkx, pyyaml, typer and rich but not simdist's pydantic, simpy and plotly:
# carry them as wheels made here first (nothing can be downloaded there):
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       --platform manylinux_2_17_x86_64 -d .wheels pydantic simpy plotly && echo /.wheels/ >> .git/info/exclude
# Commit what comes back under validation/reference/ (issue 14 item 8) with a line in its README.md.
set -uo pipefail

OUT="${OUT:-out}"
mkdir -p "$OUT"
LOG="$OUT/device_kernels.log"
PY="${PYTHON:-python3}"
FAILED=()
exec > >(tee "$LOG") 2>&1

step() {  # step NAME SECONDS COMMAND...: run with a time limit, note a failure and go on
  local name="$1" limit="$2"
  shift 2
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*"
  local start=$SECONDS
  if ! timeout "$limit" "$@"; then
    FAILED+=("$name")
    echo "=== $name FAILED after $((SECONDS - start)) s"
  else
    echo "=== $name done in $((SECONDS - start)) s"
  fi
}

if ! "$PY" -c "import pydantic, simpy, plotly" 2>/dev/null; then
  if [ -d .wheels ]; then
    "$PY" -m pip install -q --no-index --find-links .wheels --target .pydeps pydantic simpy plotly || exit 2
  else
    echo "error: pydantic, simpy or plotly missing and no .wheels folder carried (fix: see this script's header)"
    exit 2
  fi
fi
export PYTHONPATH="$PWD/.pydeps:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

echo "=== versions"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), \
'gpu', torch.cuda.get_device_name(0))"

# Kernels: bf16, Llama 3 405B's layer as simdist prices it (tp 8, seq 8192), the sweep, SDPA and memory kernels.
step kernels 150 "$PY" -m validation.kernels --device cuda --dtype bf16 --scenario scenarios/llama3-405b-16k.yaml \
  --gemm-sizes 256:16384:x2 --attention "1,16,8192,128;4,16,2048,128;8,32,1024,64" --memory-sizes 1M:256M:x4 \
  --warmup 3 --iters 10 --out "$OUT/kernels.csv" --timeout 140
step kernels_22b 60 "$PY" -m validation.kernels --device cuda --dtype bf16 --scenario scenarios/korthikanti2022-22b.yaml \
  --gemm-sizes "" --attention "" --memory-sizes "" --out "$OUT/kernels_22b.csv" --timeout 50
# The MLP's single-GPU training step (fp32, as the CPU runs): what fit_compute used before kernels existed.
step mlp 60 "$PY" -m validation.mlp --backend nccl --ranks 1 --cuts single --width 8192 --layers 4 --batch 8192 \
  --iters 10 --check --out "$OUT/mlp_steps.csv" --timeout 50
# The MoE layer on NCCL: the float64 check, then bf16 dispatch and expert GEMMs at a DeepSeek-like expert width.
step moe 60 "$PY" -m validation.moe --backend nccl --ranks 1 --experts 8 --topk 2 --hidden 4096 --ffn 1536 --tokens 256 \
  --dtype bf16 --time-tokens 1024,4096,16384 --iters 10 --out "$OUT/moe_a2a.csv" --kernels-out "$OUT/moe_gemms.csv" \
  --timeout 50
# The fit and its held-out error (the GEMMs, memory kernels and expert GEMMs; attention is checked, not fitted).
FITTED=()
for f in "$OUT/kernels.csv" "$OUT/kernels_22b.csv" "$OUT/moe_gemms.csv"; do [ -s "$f" ] && FITTED+=("$f"); done
if [ "${#FITTED[@]}" -gt 0 ]; then
  step calibrate 60 "$PY" -m simdist calibrate "${FITTED[@]}" --topology hgx-h200 --holdout sizes \
    --out "$OUT/compute_calibration.raw.yaml"
  if [ -s "$OUT/compute_calibration.raw.yaml" ]; then
    { "$PY" - <<'EOF'
import shutil, subprocess, torch
smi = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
gpu = subprocess.run(smi, capture_output=True, text=True).stdout.strip() if shutil.which("nvidia-smi") else "no GPU"
print(f"# fitted on {gpu} (name, driver); torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"NCCL {torch.cuda.nccl.version()}; by validation/device_kernels.sh")
EOF
      cat "$OUT/compute_calibration.raw.yaml"; } > "$OUT/compute_calibration.yaml"
    rm -f "$OUT/compute_calibration.raw.yaml"
    echo "=== validate (held-out sizes)"
    timeout 60 "$PY" -m simdist validate "${FITTED[@]}" --calibration "$OUT/compute_calibration.yaml" \
      --holdout sizes --json > "$OUT/validate.json" || FAILED+=(validate)
    timeout 60 "$PY" -m simdist validate "${FITTED[@]}" --calibration "$OUT/compute_calibration.yaml" \
      --holdout sizes | grep -E "^(MAPE|#)"
  fi
fi
echo "=== finished in $SECONDS s; failed: ${FAILED[*]:-none}"
[ "${#FAILED[@]}" -eq 0 ]
