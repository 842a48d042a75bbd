"""Transparent huge pages for glibc's malloc (glibc ≥ 2.35), for the `attngeo` command and the test suite.

XLA on CPU allocates fresh buffers for its n × n temporaries at every call, and glibc maps large ones
from the kernel 4 KiB page by page (a 500-step Swiss-roll condition made 7.1 M page faults, 0.46 M with
huge pages; docs/benchmarks.md gives the time measured). Tunables are read at process start, so the
command re-executes itself once, with the same command line and the setting added (`reexec`);
ATTNGEO_HUGEPAGES=0 keeps the process as it is. Standard library only.
"""
from __future__ import annotations

import os
import sys

HUGE_PAGES = "glibc.malloc.hugetlb=1"
_REEXEC = "ATTNGEO_REEXEC"          # set in the re-executed process: never a second exec


def huge_pages_env(env) -> dict | None:
  """`env` with `HUGE_PAGES` added to GLIBC_TUNABLES (and the re-exec mark), or None when it is off,
  present, already re-executed, or not glibc ≥ 2.35."""
  tunables = env.get("GLIBC_TUNABLES", "")
  if env.get("ATTNGEO_HUGEPAGES", "1") == "0" or "glibc.malloc.hugetlb" in tunables or env.get(_REEXEC):
    return None
  try:
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
    if name != "glibc" or tuple(int(x) for x in version.split(".")[:2]) < (2, 35):
      return None
  except (AttributeError, ValueError, OSError):          # not Linux/glibc
    return None
  return dict(env, GLIBC_TUNABLES=f"{tunables}:{HUGE_PAGES}" if tunables else HUGE_PAGES, **{_REEXEC: "1"})


def reexec() -> None:
  """Replace this process by the same command line (`sys.orig_argv`: interpreter flags and wrappers
  kept) under `huge_pages_env`; returns (and the command runs here) when that is None or exec fails."""
  env = huge_pages_env(os.environ)
  if env is None or not sys.executable:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    os.execve(sys.executable, list(sys.orig_argv), env)
  except OSError:
    pass
