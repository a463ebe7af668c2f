/* labels_internal.h — what a GPU process belongs to, for the exporter's joins with a scheduler's
 * labels: the Slurm job from its environment, the Kubernetes pod from its cgroup. */
#ifndef GG_LABELS_INTERNAL_H
#define GG_LABELS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct gg__workload {
  char job[32];       /* SLURM_JOB_ID, digits only; "" when none (or not readable) */
  char pod_uid[40];   /* the pod's UID as its cgroup names it, with dashes; "" when none */
  char pod[254];      /* the pod's name (its hostname), a DNS name; "" when unknown */
  char namespace[64]; /* its namespace (the service account's file), a DNS label; "" unknown */
} gg__workload_t;

/* Reads what pid belongs to. Every field is validated (a job id is digits, a pod name a DNS name),
 * so nothing a process controls can carry other text into a label; fields that cannot be read
 * (another user's environment without root) stay "". Never fails. */
void gg__workload_of(pid_t pid, gg__workload_t *out);

/* The pod UID in one cgroup path ("kubepods/burstable/pod<UID>/..." or systemd's
 * "kubepods-burstable-pod<UID with _>.slice"), with dashes, into out (>= 37 bytes); false when the
 * path names no pod. */
bool gg__pod_uid_in(const char *path, char *out, size_t cap);

#endif
