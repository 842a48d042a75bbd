"""`attngeo study NAME`: studies that train models at several sizes, probe them and compare.

    attngeo study connection [...]    the second seed paper's claims (stable walks, isometric
                                      transports, both strengthening with scale), measured
"""
from __future__ import annotations

import importlib
import sys

STUDIES = {"connection": ("attngeo.experiments.study_connection",
                          "connection-walk stability and isometry defects across sizes, trained vs random init")}


def usage() -> str:
  return "usage: attngeo study STUDY [--help] [options]\n\nstudies:\n" + "\n".join(
      f"  {name:<12} {desc}" for name, (_, desc) in STUDIES.items())


def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  if not argv or argv[0] in ("-h", "--help"):
    print(usage())
    return 0
  if argv[0] not in STUDIES:
    print(f"attngeo study: unknown study {argv[0]!r}\n\n{usage()}", file=sys.stderr)
    raise SystemExit(2)
  return importlib.import_module(STUDIES[argv[0]][0]).main(argv[1:])


if __name__ == "__main__":
  main()
