#!/bin/bash
# deploy/slurm/healthcheck.sh — HealthCheckProgram= (slurmd runs it as root every HealthCheckInterval):
# resumes a node that gpuguard drained once `gpuguard check` passes again (a stranded worker ended by
# an admin or `gpuguard reap`), since no prolog or epilog runs on a drained node. It never drains:
# the prolog and epilog do.
GPUGUARD=/opt/gpuguard/bin/gpuguard
CONF=/etc/default/gpuguard
SCONTROL=/usr/bin/scontrol
TIMEOUT=/usr/bin/timeout
GPUGUARD_ALLOW=1G
# shellcheck source=/dev/null
[ -r "$CONF" ] && . "$CONF"
export GPUGUARD_REGISTRY_DIR GPUGUARD_NVML_LIBRARY
node=${SLURMD_NODENAME:-$(/bin/hostname -s)}
[ -x "$GPUGUARD" ] || exit 0
"$SCONTROL" show node "$node" 2>/dev/null | /bin/grep -q "Reason=gpuguard:" || exit 0
"$TIMEOUT" 20 "$GPUGUARD" check --allow "$GPUGUARD_ALLOW" >/dev/null 2>&1 &&
  "$SCONTROL" update nodename="$node" state=resume
exit 0
