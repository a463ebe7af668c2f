/* gpuguard/gpuguard.h — the umbrella header: errors, version, and every part of the public API. */
#ifndef GPUGUARD_GPUGUARD_H
#define GPUGUARD_GPUGUARD_H

/** @mainpage gpuguard
 *  gpuguard guards GPU resources so that device memory and processes never outlive the work that
 *  owned them: scoped arenas of device memory, exit-path guards, process teardown, and queries of
 *  who holds what. Include this header to get the whole API; every call returns 0 or a negative
 *  GG_E* code (see @ref gg_errors) and gg_last_error() says what failed.
 *
 *  Parts: @ref gg_errors, @ref gg_arena, @ref gg_share, @ref gg_guard (guide: @ref guards),
 *  @ref gg_query, @ref gg_report, @ref gg_host, @ref gg_proc, @ref gg_registry
 *  (guide: @ref python). */

#include "gpuguard/arena.h"
#include "gpuguard/error.h"
#include "gpuguard/export.h"
#include "gpuguard/guard.h"
#include "gpuguard/host.h"
#include "gpuguard/proc.h"
#include "gpuguard/query.h"
#include "gpuguard/report.h"
#include "gpuguard/share.h"
#include "gpuguard/version.h"

/* The scope macros need __attribute__((cleanup)); other compilers get the rest of the API and call
 * gg_scope_begin()/gg_scope_end() themselves (scope.h itself says so with an #error). */
#if defined(__GNUC__) || defined(__clang__)
#include "gpuguard/scope.h"
#endif

#endif
