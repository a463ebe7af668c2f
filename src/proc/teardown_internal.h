/* teardown_internal.h — teardown.c's entry points: ending a process set (the guard's teardown and
 * the public gg_proc_teardown share it) and the test switch that mutes signals. */
#ifndef GG_TEARDOWN_INTERNAL_H
#define GG_TEARDOWN_INTERNAL_H

#include <stdbool.h>

#include "gpuguard/proc.h"

/* The longest grace period a teardown accepts (ms): the library and the CLI share it. */
#define GG__GRACE_MAX_MS GG_PROC_GRACE_MAX_MS

/* TERM, grace, KILL, reap for every process in key's set and their descendants (see
 * gg_proc_teardown). receipt may be NULL. */
int gg__proc_teardown_set(const void *guard_key, int grace_ms, gg_proc_receipt_t **receipt);
/* Tests make teardown send nothing, to stand in for a process SIGKILL cannot end (uninterruptible
 * sleep), which CI cannot make on demand. */
void gg__proc_test_mute(bool on);

#endif
