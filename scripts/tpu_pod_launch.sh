#!/bin/bash
# Run a jaxcore training script on every host of a Cloud TPU pod slice.
#
#   TPU_NAME=my-v5e-32 ZONE=us-west4-a PROJECT=my-proj scripts/tpu_pod_launch.sh train.py --steps 1000
#
# `jaxcore launch --print-tpu-pod train.py ...` prints the same two commands for one run.
# The script itself needs no changes: `jaxcore.initialize()` (its first line) finds the
# pod through JAX's Cloud TPU detection (coordinator = worker 0, one process per host).
#
# Preemption (a maintenance event's SIGTERM on the workers): JAX's preemption notifier makes
# every host save the same step and exit with 75 (jaxcore.PREEMPTION_EXIT_CODE); this script
# then starts the run again (it resumes from that checkpoint), up to MAX_RESTARTS times.
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME to the TPU VM (pod slice) name}"
: "${ZONE:?set ZONE, e.g. us-central2-b}"
PROJECT_FLAG=${PROJECT:+--project=${PROJECT}}
REMOTE_DIR=${REMOTE_DIR:-~/jaxcore-run}   # where the code lands on each worker
# XLA's host buffers stay mapped instead of being faulted in every step (PERF-NOTES.md).
TUNABLES="glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
MAX_RESTARTS=${MAX_RESTARTS:-20}
RESTART_DELAY=${RESTART_DELAY:-60}   # seconds before a restart (the VMs may be coming back)

if [ $# -lt 1 ]; then
  echo "usage: $0 script.py [args...]" >&2
  exit 2
fi
CMD=$(printf '%q ' python3 -u "$@")

# 1. Copy the working directory (this checkout: code, scripts, configs) to every worker.
gcloud compute tpus tpu-vm scp --recurse . "$TPU_NAME:$REMOTE_DIR" \
  --zone="$ZONE" $PROJECT_FLAG --worker=all

# 2. Install that copy with JAX's TPU wheels on every worker (jaxcore is not on PyPI: a
#    package of that name there would be someone else's). EXTRAS: what `jaxcore run` needs.
EXTRAS=${EXTRAS:-tpu,data,experiments,serve,run}
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" $PROJECT_FLAG --worker=all \
  --command="pip install -q -e '$REMOTE_DIR[$EXTRAS]'"

# 3. Start the same command on all workers at once. A pod run only starts when every host
#    joins, and JAXCORE_INIT_TIMEOUT bounds the wait with an error naming the coordinator.
#    Exit code 75 on a worker means "preempted, checkpoint saved": run it again.
for attempt in $(seq 0 "$MAX_RESTARTS"); do
  rc=0
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" $PROJECT_FLAG --worker=all \
    --command="cd $REMOTE_DIR && GLIBC_TUNABLES=$TUNABLES JAXCORE_INIT_TIMEOUT=600 $CMD" || rc=$?
  if [ "$rc" -ne 75 ]; then
    exit "$rc"
  fi
  echo "preempted (exit 75) on attempt $attempt: restarting in ${RESTART_DELAY}s" >&2
  sleep "$RESTART_DELAY"
done
echo "preempted more than MAX_RESTARTS=$MAX_RESTARTS times; giving up" >&2
exit 75
