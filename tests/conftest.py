import os

# Tests run on the CPU with float32 defaults; sharding tests spawn their own 8-device processes.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
