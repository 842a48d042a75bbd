#!/usr/bin/env bash
# The prepared GPU check (one run on an accelerator machine): kernel parity on the GPU, then the
# operator benchmarks (cuDNN / XLA / Pallas / blockwise, ratios; CMAP's Pallas phase kernel against its
# blockwise one), bf16-vs-float32 numerics of every family
# member under every kernel (Pallas included), and the training benchmark with bf16, MFU included.
#   bash experiments/gpu_check.sh                    # from the repository root; writes runs/gpu/*
#   bash experiments/gpu_check.sh --dry-run [DIR]    # CPU, tiny shapes, Pallas in interpret mode; writes DIR
set -euo pipefail
export PYTHONUNBUFFERED=1
if [[ "${1:-}" == "--dry-run" ]]; then
  out="${2:-runs/gpu-dry}"
  export JAX_PLATFORMS=cpu
  seqs=16; batch=1; heads=2; head_dim=8; long=0; repeats=1
  ops=ATTN,DMTN; impls=(--implementations "xla,blockwise,pallas" --interpret); interpret=(--interpret)
  train=(--seq 16 --batch 2 --depth 1 --width 16 --head-dim 8 --repeats 1 --dtype float32)
elif [[ -n "${1:-}" ]]; then
  echo "gpu_check.sh: unknown argument ${1}; expected none or --dry-run [DIR]" >&2
  exit 2
else
  out=runs/gpu
  seqs=1024,4096,16384; batch=8; heads=8; head_dim=64; long=65536; repeats=3
  ops=ATTN,DMAP,DMTN,ATAP,CMAP; impls=()         # every kernel of the backend: einsum, xla, cudnn, blockwise, pallas
  interpret=()                                    # CMAP's Pallas kernel is timed only when named: the line below
  train=(--preset d12 --batch 16 --dtype bfloat16 --repeats 10)
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"
  python3 -m pip install -q -e '.[dev]' 'jax[cuda12]'
  JAX_PLATFORMS=cuda python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_operators.py tests/test_kernels_pallas.py \
    tests/test_kernels_pallas_phase.py \
    2>&1 | tail -3 | tee "$out/parity.txt"
fi
mkdir -p "$out"
python3 -c 'import jax; print(jax.devices())'
attngeo bench --seqs "$seqs" --batch "$batch" --heads "$heads" --head-dim "$head_dim" --dtype bfloat16 \
  --repeats "$repeats" --operators "$ops" "${impls[@]}" --long "$long" --out "$out" | tee "$out/bench_operators.txt"
attngeo bench --seqs "$seqs" --batch "$batch" --heads "$heads" --head-dim "$head_dim" --dtype bfloat16 \
  --repeats "$repeats" --operators CMAP --implementations blockwise,pallas "${interpret[@]}" --long 0 \
  --out "$out/cmap_pallas" | tee "$out/bench_cmap_pallas.txt"
attngeo bench --numerics --seqs "${seqs%%,*}" --batch "$batch" --heads "$heads" --head-dim "$head_dim" \
  --operators "${ops%,CMAP}" "${impls[@]}" --out "$out" | tee "$out/bench_numerics.txt"
attngeo bench-train "${train[@]}" --out "$out" | tee "$out/bench_train.txt"
