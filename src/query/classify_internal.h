/* classify_internal.h — classify.c's judgement of processes no gpuguard session owns. */
#ifndef GG_CLASSIFY_INTERNAL_H
#define GG_CLASSIFY_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "gpuguard/query.h"
#include "proc/procfs_internal.h"

/* Whether the parent that started the process (stat `st`, row's start time) is gone: no parent
 * here, gone, a zombie, a pid reused since, init, or a subreaper of another session it was handed
 * to. The reason is appended to why. */
bool gg__parent_gone(const gg_process_t *row, const gg__pinfo_t *st, char *why, size_t cap);

/* GG_PROCESS_STRANDED, GG_PROCESS_DETACHED or GG_PROCESS_UNKNOWN for a process that carries no
 * session, with the evidence written to row->why. Reads /proc for row->pid (and its environment:
 * ours, or as root). */
gg_process_class_t gg__classify_unsessioned(gg_process_t *row);

#endif
