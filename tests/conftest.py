import os

# Tests run on the CPU unless JAX_PLATFORMS says otherwise (experiments/gpu_check.sh sets cuda);
# sharding tests spawn their own 8-device processes.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Worker processes (pytest-xdist) and the subprocesses tests start use glibc's transparent huge pages,
# as the `attngeo` command does (attngeo.cli.HUGE_PAGES): XLA's fresh n × n buffers otherwise fault in
# 4 KiB at a time. Read at process start, so it reaches the processes started from here on.
from attngeo import cli as _cli  # noqa: E402

os.environ.update(_cli.huge_pages_env(os.environ) or {})
