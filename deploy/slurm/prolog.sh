#!/bin/bash
# deploy/slurm/prolog.sh — Prolog=/etc/slurm/prolog.d/* (runs as root on the node before each job):
# refuses to start a job on a node whose GPUs hold stranded or orphaned processes, or memory no
# process holds, and drains the node with a reason naming pid, class and GPU (never a command line:
# `sinfo -R` shows reasons to everyone). Slurm starts prologs with no PATH: every program is named by
# its absolute path. Exit 1 (the job does not start here) only when `gpuguard check` says 1; a missing
# gpuguard (127), a usage error (2) or no GPU (3) never take the node down. What Slurm does with a
# failed prolog: docs/deploy.md (a batch job is requeued and held unless
# SchedulerParameters=nohold_on_prolog_fail).
GPUGUARD=/opt/gpuguard/bin/gpuguard
CONF=/etc/default/gpuguard
SCONTROL=/usr/bin/scontrol
TIMEOUT=/usr/bin/timeout
LOGGER=/usr/bin/logger
GPUGUARD_ALLOW=1G
# shellcheck source=/dev/null
[ -r "$CONF" ] && . "$CONF"
export GPUGUARD_REGISTRY_DIR GPUGUARD_NVML_LIBRARY
node=${SLURMD_NODENAME:-$(/bin/hostname -s)}

log() { "$LOGGER" -t gpuguard-prolog -- "$*" 2>/dev/null || true; }

# The first problem `check` names, as "GPU N: CLASS process PID (user U) holds SIZE", or its line
# about memory no process holds; anything else (a command line) never reaches the reason.
reason_of() {
  /bin/sed -nE \
    -e 's/^(GPU [0-9]+: [a-z-]+ process [0-9]+ \(user [A-Za-z0-9._-]*\) holds [0-9.]+ [KMGT]?i?B).*/\1/p' \
    -e 's/^(GPU [0-9]+: [0-9.]+ [KMGT]?i?B in use that no listed process holds).*/\1/p' |
    /usr/bin/head -n 1
}

[ -x "$GPUGUARD" ] || { log "$GPUGUARD is missing: not checked"; exit 0; }
out=$("$TIMEOUT" 20 "$GPUGUARD" check --allow "$GPUGUARD_ALLOW" 2>&1)
rc=$?
case $rc in
  0 | 3) exit 0 ;;
  1)
    reason=$(printf '%s\n' "$out" | reason_of)
    log "check: ${reason:-memory held}; draining $node"
    "$SCONTROL" update nodename="$node" state=drain reason="gpuguard: ${reason:-GPU memory held (gpuguard check)}"
    exit 1 ;;
  *) log "check exited $rc (not a verdict): $out"; exit 0 ;;
esac
