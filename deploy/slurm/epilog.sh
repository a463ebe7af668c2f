#!/bin/bash
# deploy/slurm/epilog.sh — Epilog=/etc/slurm/epilog.d/* (runs as root on the node after each job): ends
# what the job left behind (stranded workers of a trainer that crashed, orphans of its gpuguard
# sessions), then checks the GPUs: clean, it resumes the node if gpuguard drained it; still held after
# a few seconds, it drains the node, with a reason naming pid, class and GPU. Absolute paths (no
# PATH), bounded in time (keep PrologEpilogTimeout above ~40 s), and only `check`'s exit 1 drains.
GPUGUARD=/opt/gpuguard/bin/gpuguard
CONF=/etc/default/gpuguard
SCONTROL=/usr/bin/scontrol
TIMEOUT=/usr/bin/timeout
LOGGER=/usr/bin/logger
GPUGUARD_ALLOW=1G
GPUGUARD_GRACE=5s
# shellcheck source=/dev/null
[ -r "$CONF" ] && . "$CONF"
export GPUGUARD_REGISTRY_DIR GPUGUARD_NVML_LIBRARY
node=${SLURMD_NODENAME:-$(/bin/hostname -s)}

log() { "$LOGGER" -t gpuguard-epilog -- "$*" 2>/dev/null || true; }
reason_of() {
  /bin/sed -nE \
    -e 's/^(GPU [0-9]+: [a-z-]+ process [0-9]+ \(user [A-Za-z0-9._-]*\) holds [0-9.]+ [KMGT]?i?B).*/\1/p' \
    -e 's/^(GPU [0-9]+: [0-9.]+ [KMGT]?i?B in use that no listed process holds).*/\1/p' |
    /usr/bin/head -n 1
}
# Resumes the node when the drain is gpuguard's own (never one an admin set for another reason).
resume_if_ours() {
  "$SCONTROL" show node "$node" 2>/dev/null | /bin/grep -q "Reason=gpuguard:" &&
    "$SCONTROL" update nodename="$node" state=resume && log "clean again: $node resumed"
}

[ -x "$GPUGUARD" ] || { log "$GPUGUARD is missing: nothing reaped or checked"; exit 0; }
log "job $SLURM_JOB_ID: $("$TIMEOUT" 30 "$GPUGUARD" reap --yes --all-users --grace "$GPUGUARD_GRACE" 2>&1 | /usr/bin/tail -n 1)"
for _ in 1 2 3 4 5; do # the driver frees a dead process's memory within ~100 ms
  out=$("$TIMEOUT" 20 "$GPUGUARD" check --allow "$GPUGUARD_ALLOW" 2>&1)
  rc=$?
  case $rc in
    0) resume_if_ours; exit 0 ;;
    1) /bin/sleep 1 ;;
    *) log "check exited $rc (not a verdict): $out"; exit 0 ;;
  esac
done
reason=$(printf '%s\n' "$out" | reason_of)
log "job $SLURM_JOB_ID left ${reason:-memory held}; draining $node"
"$SCONTROL" update nodename="$node" state=drain reason="gpuguard: ${reason:-GPU memory held (gpuguard check)}"
exit 0
