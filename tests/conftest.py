import os

# Tests run on the CPU unless JAX_PLATFORMS says otherwise (experiments/gpu_check.sh sets cuda);
# sharding tests spawn their own 8-device processes.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
