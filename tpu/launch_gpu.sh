#!/usr/bin/env bash
# Multi-node GPU launch: one process per node (all local GPUs), jax.distributed over the nodes.
#
#   tpu/launch_gpu.sh slurm --nodes N [--gpus-per-node 8] [--partition P] [--time 24:00:00]
#                     [--dry-run] [-- COMMAND ...]          # writes and submits an sbatch script
#   tpu/launch_gpu.sh env --coordinator HOST:PORT --nodes N --rank R [--dry-run] [-- COMMAND ...]
#                                                         # torchrun-style: run this on every node
#
# attngeo reads JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID (set here) and calls
# jax.distributed.initialize with them. COMMAND defaults to `attngeo swissroll --full`.
# --dry-run prints the script or the command instead of running it.
set -euo pipefail

mode="${1:-}"; shift || true
nodes=1 gpus=8 partition="" walltime="24:00:00" coordinator="" rank=0 dry=0
cmd=(attngeo swissroll --full)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --gpus-per-node) gpus="$2"; shift 2 ;;
    --partition) partition="$2"; shift 2 ;;
    --time) walltime="$2"; shift 2 ;;
    --coordinator) coordinator="$2"; shift 2 ;;
    --rank) rank="$2"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    --) shift; cmd=("$@"); break ;;
    *) echo "launch_gpu.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
remote_cmd=$(printf ' %q' "${cmd[@]}")

case "$mode" in
  slurm)
    script=$(cat <<SBATCH
#!/usr/bin/env bash
#SBATCH --job-name=attngeo
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=$gpus
#SBATCH --time=$walltime
${partition:+#SBATCH --partition=$partition}
set -euo pipefail
head=\$(scontrol show hostnames "\$SLURM_JOB_NODELIST" | head -n 1)
srun bash -c 'JAX_COORDINATOR_ADDRESS='"\$head"':12345 JAX_NUM_PROCESSES=\$SLURM_NTASKS JAX_PROCESS_ID=\$SLURM_PROCID$remote_cmd'
SBATCH
)
    if [[ $dry -eq 1 ]]; then
      printf '%s\n' "$script"
      echo "+ sbatch attngeo.sbatch"
    else
      printf '%s\n' "$script" > attngeo.sbatch
      sbatch attngeo.sbatch
    fi
    ;;
  env)
    [[ -n "$coordinator" ]] || { echo "launch_gpu.sh: env mode needs --coordinator HOST:PORT" >&2; exit 2; }
    line="JAX_COORDINATOR_ADDRESS=$coordinator JAX_NUM_PROCESSES=$nodes JAX_PROCESS_ID=$rank$remote_cmd"
    if [[ $dry -eq 1 ]]; then
      echo "+ $line"
    else
      env JAX_COORDINATOR_ADDRESS="$coordinator" JAX_NUM_PROCESSES="$nodes" JAX_PROCESS_ID="$rank" "${cmd[@]}"
    fi
    ;;
  *)
    echo "usage: launch_gpu.sh slurm|env [options] [-- COMMAND ...] (see --help)" >&2; exit 2 ;;
esac
