#!/usr/bin/env bash
# The prepared GPU check (one run on an accelerator machine): bf16 numerics of every family member under every
# kernel (Pallas included) against float32 einsum; the Pallas kernels' parity tests on the GPU (float64
# references, masks, causal order); the operator benchmarks (cuDNN / XLA / Pallas / blockwise, ratios; CMAP's
# Pallas phase kernel beside its blockwise and paired ones); the training benchmark in bf16 with MFU (the lm
# preset and the d12 shape); a block-size × warps × stages sweep of the Pallas kernel; causal ratios at 2048.
#   bash experiments/gpu_check.sh [--out DIR]          # from the repository root; writes DIR (default runs/gpu)
#   bash experiments/gpu_check.sh --dry-run [DIR]      # CPU, tiny shapes, Pallas in interpret mode; writes DIR
#
# The machine is offline: nothing is installed from a registry. The project is installed editable with no
# dependencies (the image's jax / flax / optax / orbax run it); if it does not import there, the wheels in .whl/
# (flax, optax, orbax-checkpoint, chex at the versions the tests use here) are installed beside it.
# Stages run in order of importance, each under its own time limit and all under GPU_CHECK_SECONDS (default
# 540): a stage that fails or runs out of time says so in the summary and the next one starts.
set -uo pipefail
export PYTHONUNBUFFERED=1
start=$SECONDS
usage="expected none, --out DIR or --dry-run [DIR]"
dry=0
out=runs/gpu
case "${1:-}" in
  -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --dry-run) dry=1; out="${2:-runs/gpu-dry}" ;;
  --out) if [[ -z "${2:-}" ]]; then echo "gpu_check.sh: --out needs a folder" >&2; exit 2; fi; out="$2" ;;
  "") ;;
  *) echo "gpu_check.sh: unknown argument ${1}; $usage" >&2; exit 2 ;;
esac
if (($# > 2)) || { [[ "${1:-}" == "" ]] && (($# > 0)); }; then
  echo "gpu_check.sh: too many arguments (${*}); $usage" >&2
  exit 2
fi
if [[ "$out" == -* ]]; then echo "gpu_check.sh: the output folder must not start with '-'; got $out" >&2; exit 2; fi
budget=${GPU_CHECK_SECONDS:-540}
if ! [[ "$budget" =~ ^[0-9]+$ ]] || ((10#$budget < 60)); then
  echo "gpu_check.sh: GPU_CHECK_SECONDS must be a whole number of seconds ≥ 60; got '$budget'" >&2
  exit 2
fi
budget=$((10#$budget))
if ((dry)) && ! command -v attngeo >/dev/null; then
  echo "gpu_check.sh: no attngeo command on PATH: activate the project's venv (source .venv/bin/activate)" >&2
  exit 2
fi
if ((!dry)) && ! command -v nvidia-smi >/dev/null; then
  echo "gpu_check.sh: no NVIDIA GPU here (nvidia-smi is missing); on a CPU run --dry-run [DIR]" >&2
  exit 2
fi
if ! mkdir -p "$out" 2>/dev/null || ! [[ -w "$out" ]]; then
  echo "gpu_check.sh: cannot write the output folder $out (a file in the way, or not writable)" >&2
  exit 2
fi
summary=()
stage_pid=
stage_name=

# Ctrl-C or SIGTERM: stop the stage in progress (timeout passes the signal on to it), say so, and stop.
interrupted() {
  [[ -n "$stage_pid" ]] && kill -TERM "$stage_pid" 2>/dev/null && wait "$stage_pid" 2>/dev/null
  summary+=("interrupted ($1)${stage_name:+ during $stage_name} after $((SECONDS - start)) s")
  printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
  exit "$2"
}
trap 'interrupted SIGINT 130' INT
trap 'interrupted SIGTERM 143' TERM

# stage NAME SECONDS COMMAND...: run COMMAND under min(SECONDS, time left), its output also in $out/NAME.txt
stage() {
  local name=$1 limit=$2 left rc
  shift 2
  left=$((budget - (SECONDS - start)))
  if ((left < 15)); then summary+=("$name: skipped (time budget spent)"); return; fi
  ((limit > left)) && limit=$left
  echo "=== $name (≤ ${limit} s) ==="
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > >(tee "$out/$name.txt") 2>&1 &
  stage_pid=$!
  stage_name=$name
  wait "$stage_pid"
  rc=$?
  stage_pid=
  stage_name=
  if ((rc == 0)); then
    summary+=("$name: ok in $((SECONDS - t0)) s")
  elif ((SECONDS - t0 >= limit)) && ((rc == 124 || rc == 137)); then
    summary+=("$name: TIMED OUT after ${limit} s")
  else                                              # 137 before the limit: killed (the OOM killer, say)
    summary+=("$name: FAILED (exit $rc) after $((SECONDS - t0)) s")
  fi
}

if ((dry)); then
  export JAX_PLATFORMS=cpu
  seqs=16; batch=1; heads=2; head_dim=8; long=0; repeats=1
  ops=ATTN,DMTN; impls=(--implementations "xla,blockwise,pallas" --interpret)
  cmap=(--implementations "blockwise,pallas" --interpret)
  train_lm=(--seq 16 --batch 2 --depth 1 --width 16 --head-dim 8 --repeats 1 --dtype float32)
  train_d12=()
  sweep=(--seq 40 --batch 1 --heads 2 --widths 16 --value-dim 8 --blocks 16 --warps 4 --stages 2 --repeats 1
         --interpret)
  causal=()
else
  export JAX_PLATFORMS=cuda
  seqs=1024,4096; batch=8; heads=8; head_dim=64; long=16384; repeats=3
  ops=ATTN,DMAP,DMTN,ATAP,CMAP; impls=()          # every kernel of the backend: einsum, xla, cudnn, blockwise, pallas
  cmap=(--implementations "blockwise,paired,pallas")  # CMAP's Pallas kernel is timed only when named: its own stage
  train_lm=(--preset lm --dtype bfloat16 --repeats 10)
  train_d12=(--preset d12 --batch 16 --dtype bfloat16 --repeats 5)
  sweep=(--seq 4096 --widths "256,64" --blocks "32,64,128" --warps "4,8" --stages 2 --repeats 3)
  causal=(--causal --seqs 2048 --operators "ATTN,DMAP,DMTN,ATAP,CMAP" --implementations "xla,cudnn,blockwise,pallas")
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/device.txt"
  python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
  PATH="$(python3 -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"
  if ! python3 -c 'import attngeo.experiments' 2>/dev/null || ! command -v attngeo >/dev/null; then
    echo "the editable install did not take: attngeo from the checkout (PYTHONPATH) and a wrapper command"
    ln -sfn ../experiments attngeo/experiments
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    mkdir -p /tmp/attngeo-bin
    printf '#!/bin/sh\nexec python3 -c "import sys; from attngeo.cli import main; sys.exit(main())" "$@"\n' \
      > /tmp/attngeo-bin/attngeo
    chmod +x /tmp/attngeo-bin/attngeo
    PATH="/tmp/attngeo-bin:$PATH"
  fi
  if ! python3 -c 'import attngeo.train, attngeo.kernels.pallas, attngeo.experiments.bench_train'; then
    if [[ -d .whl ]]; then
      echo "attngeo does not import on the image's packages (above): installing .whl/ before them"
      python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
      export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    else
      echo "attngeo does not import on the image's packages (above), and no .whl/ came with the run (carry it)"
    fi
  fi
fi
python3 -c 'import jax, jaxlib, flax, optax, orbax.checkpoint as ocp, numpy
print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "flax", flax.__version__, "optax", optax.__version__,
      "orbax", ocp.__version__, "numpy", numpy.__version__); print(jax.devices())' | tee "$out/versions.txt"
common=(--batch "$batch" --heads "$heads" --head-dim "$head_dim")

stage numerics 60 attngeo bench --numerics --seqs "${seqs%%,*}" "${common[@]}" --operators "${ops%,CMAP}" \
  "${impls[@]}" --out "$out"
if ((!dry)) && ! python3 -c 'import pytest, xdist, threadpoolctl' 2>/dev/null; then
  summary+=("parity: skipped (pytest, pytest-xdist or threadpoolctl missing on the image)")
elif ((!dry)); then   # the Pallas kernels against float64 on the GPU: float32 products at full precision (no TF32)
  stage parity 60 env JAX_DEFAULT_MATMUL_PRECISION=highest ATTNGEO_TEST_JAX_CACHE= python3 -m pytest -q -n 0 \
    -p no:cacheprovider tests/test_kernels_pallas.py tests/test_kernels_pallas_phase.py
fi
stage bench_operators 150 attngeo bench --seqs "$seqs" "${common[@]}" --dtype bfloat16 --repeats "$repeats" \
  --operators "$ops" "${impls[@]}" --long "$long" --out "$out"
stage bench_cmap_pallas 45 attngeo bench --seqs "$seqs" "${common[@]}" --dtype bfloat16 --repeats "$repeats" \
  --operators CMAP "${cmap[@]}" --long 0 \
  --out "$out/cmap_pallas"
stage bench_train_lm 40 attngeo bench-train "${train_lm[@]}" --out "$out/train_lm"
if ((${#train_d12[@]})); then
  stage bench_train_d12 90 attngeo bench-train "${train_d12[@]}" --out "$out/train_d12"
fi
stage pallas_blocks 60 attngeo bench-pallas "${sweep[@]}" --out "$out/pallas_blocks"
if ((${#causal[@]})); then
  stage bench_causal 45 attngeo bench "${causal[@]}" "${common[@]}" --dtype bfloat16 --repeats "$repeats" \
    --long 0 --out "$out/causal"
fi

echo "=== summary ($((SECONDS - start)) s) ==="
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
ran=$(printf '%s\n' "${summary[@]}" | grep -c ": ok in")
if ((ran == 0)) || printf '%s\n' "${summary[@]}" | grep -q "FAILED\|TIMED OUT"; then
  exit 1
fi
