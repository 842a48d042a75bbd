#!/usr/bin/env bash
# Create a Cloud TPU VM or pod slice, install attngeo with jax[tpu] on every worker, ship the code,
# and launch one command on all workers at once (multi-host: attngeo calls jax.distributed.initialize()).
#
#   tpu/launch_tpu.sh --name NAME --zone ZONE [--type v5litepod-8] [--version RUNTIME]
#                     [--project P] [--repo URL] [--keep] [--dry-run] [-- COMMAND ...]
#
# COMMAND defaults to `attngeo swissroll --full`. --version defaults to the JAX runtime image of the
# --type's generation (cloud.google.com/tpu/docs/runtimes): v2, v3, v4 tpu-ubuntu2204-base,
# v5e (v5litepod-*) v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5, v6e v2-alpha-tpuv6e. --repo clones that
# URL on the workers instead of copying this checkout. --dry-run prints every command and runs none.
# --keep leaves the TPU up.
set -euo pipefail

name="" zone="" type="v5litepod-8" version="" project="" repo="" keep=0 dry=0
cmd=(attngeo swissroll --full)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --zone) zone="$2"; shift 2 ;;
    --type) type="$2"; shift 2 ;;
    --version) version="$2"; shift 2 ;;
    --project) project="$2"; shift 2 ;;
    --repo) repo="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    --) shift; cmd=("$@"); break ;;
    *) echo "launch_tpu.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$name" && -n "$zone" ]] || { echo "launch_tpu.sh: --name and --zone are required" >&2; exit 2; }
if [[ -z "$version" ]]; then
  case "$type" in
    v2-*|v3-*|v4-*) version="tpu-ubuntu2204-base" ;;
    v5litepod-*) version="v2-alpha-tpuv5-lite" ;;
    v5p-*) version="v2-alpha-tpuv5" ;;
    v6e-*) version="v2-alpha-tpuv6e" ;;
    *) echo "launch_tpu.sh: --type $type is not a known TPU generation (v2-, v3-, v4-, v5litepod-, v5p-, v6e-N); give its runtime image with --version" >&2; exit 2 ;;
  esac
fi

gc=(gcloud compute tpus tpu-vm)
where=(--zone "$zone")
[[ -n "$project" ]] && where+=(--project "$project")

run() {
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [[ $dry -eq 0 ]]; then "$@"; fi
}

remote_cmd=$(printf ' %q' "${cmd[@]}")
install='python3 -m pip install -q -U pip && python3 -m pip install -q -e "./attngeo[dev]" "jax[tpu]" -f https://storage.googleapis.com/jax-releases/libtpu_releases.html'

run "${gc[@]}" create "$name" "${where[@]}" --accelerator-type "$type" --version "$version"
if [[ -n "$repo" ]]; then
  run "${gc[@]}" ssh "$name" "${where[@]}" --worker=all --command "git clone --depth 1 $repo attngeo"
else
  top=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
  run "${gc[@]}" scp --recurse "$top" "$name:attngeo" "${where[@]}" --worker=all
fi
run "${gc[@]}" ssh "$name" "${where[@]}" --worker=all --command "$install"
run "${gc[@]}" ssh "$name" "${where[@]}" --worker=all --command "cd attngeo &&$remote_cmd"
if [[ $keep -eq 0 ]]; then
  run "${gc[@]}" delete "$name" "${where[@]}" --quiet
fi
