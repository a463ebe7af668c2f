/* abi.c — the sizes of the public structs, by name, for bindings that lay them out themselves.
 * In the topmost layer: it names the structs of every layer's header. */
#include <string.h>

#include "gpuguard/arena.h"
#include "gpuguard/guard.h"
#include "gpuguard/proc.h"
#include "gpuguard/query.h"

#define GG__SIZE(type) \
  { #type, sizeof(type) }

static const struct {
  const char *name;
  size_t size;
} gg__sizes[] = {
    GG__SIZE(gg_arena_options_t), GG__SIZE(gg_arena_stats_t),   GG__SIZE(gg_scope_t),
    GG__SIZE(gg_block_info_t),    GG__SIZE(gg_guard_options_t), GG__SIZE(gg_spawn_options_t),
    GG__SIZE(gg_proc_outcome_t),  GG__SIZE(gg_proc_receipt_t),  GG__SIZE(gg_session_record_t),
    GG__SIZE(gg_device_info_t),   GG__SIZE(gg_process_t),       GG__SIZE(gg_device_telemetry_t),
};

size_t gg_sizeof(const char *type_name) {
  if (!type_name) return 0;
  for (size_t i = 0; i < sizeof gg__sizes / sizeof gg__sizes[0]; i++)
    if (strcmp(gg__sizes[i].name, type_name) == 0) return gg__sizes[i].size;
  return 0;
}
