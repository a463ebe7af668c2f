/* guard_report_internal.h — guard_report.c's calls for guard.c: a leak report's destination, read
 * from options.leak_report or GPUGUARD_LEAK_REPORT at creation, and the report a teardown fills
 * from the objects it releases, then writes and frees. */
#ifndef GG_GUARD_REPORT_INTERNAL_H
#define GG_GUARD_REPORT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "guard/guard_internal.h"

enum gg__dest { GG__TO_NONE, GG__TO_STDERR, GG__TO_STDOUT, GG__TO_FILE };

typedef struct gg__report_opts {
  enum gg__dest dest;
  bool json;
  bool asked; /* an explicit destination: report at every teardown, empty or not */
  char path[1024];
} gg__report_opts_t;

/* The blocks still live in a teardown's attached objects, one row per object (with blocks), grouped
 * by tag and allocation site. Zero-initialised before the first gg__report_add(). */
typedef struct gg__report {
  struct gg__obj_row *objs;
  size_t n_objs, cap_objs;
  unsigned long long count, bytes;
} gg__report_t;

/* Parses a destination: "stderr", "stdout", "none", PATH, each optionally "json:" or "text:" first;
 * NULL is stderr, asked for by nobody. `what` names the setting in the error. 0 or GG_EINVAL. */
int gg__report_parse(const char *what, const char *text, gg__report_opts_t *r);
/* Adds the live blocks of obj (attached with ops) before its teardown releases them; out of host
 * memory, the row says it was truncated. Never fails, never changes gg_last_error(). */
void gg__report_add(gg__report_t *r, const gg__attach_ops_t *ops, void *obj);
/* Writes the report of guard `guard` to its destination, within about two seconds: nothing when the
 * destination is none, or when nothing leaked and no destination was asked for. `how` says what
 * tore the guard down ("gg_guard_destroy", "exit", a signal's name). */
void gg__report_emit(const gg__report_opts_t *opts, const char *guard, const gg__report_t *r,
                     const char *how);
void gg__report_free(gg__report_t *r);

#endif
