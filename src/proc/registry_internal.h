/* registry_internal.h — registry.c's calls for the rest of the library: the fatal-path unlink and
 * the fork handlers of the session registry's lock. */
#ifndef GG_REGISTRY_INTERNAL_H
#define GG_REGISTRY_INTERNAL_H

#include <stddef.h>
#include <sys/types.h>

#include "gpuguard/proc.h"

/* [AS-safe] Unlinks this process's registry record if it made one (never the parent's, after
 * fork). */
void gg__registry_fatal_unlink(void);

/* After gg_proc_spawn() started a job in a new PID namespace through `keeper` (the job's keeper, in
 * our namespace): remembers the namespace (and rewrites our record, if we have one, to name it), so
 * that once nothing of it is left its records are known to be stale. */
void gg__registry_note_job_ns(pid_t keeper);

/* gg_registry_list(), and for each row whether it was written in another pid namespace (its pid
 * means nothing here; foreign may be NULL). */
int gg__registry_list_ns(gg_session_record_t *rows, unsigned char *foreign, size_t cap,
                         size_t *count);

/* Test hook: fn(dfd, name) runs in gg_registry_prune() after a record was judged stale and before
 * it is removed (where another process may replace it). NULL turns it off. */
void gg__registry_test_prune_hook(void (*fn)(int dfd, const char *name));

#endif
