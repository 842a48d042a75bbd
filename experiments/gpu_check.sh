#!/usr/bin/env bash
# The prepared GPU check (one run on an accelerator machine): kernel parity on the GPU, then the
# operator and training benchmarks with cuDNN flash attention and bf16, MFU included.
#   bash experiments/gpu_check.sh            # from the repository root; writes runs/gpu/*
set -euo pipefail
export PYTHONUNBUFFERED=1
mkdir -p runs/gpu
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee runs/gpu/device.txt
python3 -m pip install -q -e '.[dev]' 'jax[cuda12]'
python3 -c 'import jax; print(jax.devices())'
JAX_PLATFORMS=cuda python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_operators.py 2>&1 | tail -3 \
  | tee runs/gpu/parity.txt
attngeo bench --seqs 1024,4096,16384 --batch 8 --heads 8 --head-dim 64 --dtype bfloat16 \
  --operators ATTN,DMAP,DMTN,ATAP,CMAP --long 65536 --out runs/gpu | tee runs/gpu/bench_operators.txt
attngeo bench-train --preset d12 --batch 16 --dtype bfloat16 --repeats 10 --out runs/gpu \
  | tee runs/gpu/bench_train.txt
