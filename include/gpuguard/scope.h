/* gpuguard/scope.h — C RAII for GCC and Clang: GG_SCOPE blocks and automatic arena and guard
 * variables. */
#ifndef GPUGUARD_SCOPE_H
#define GPUGUARD_SCOPE_H

#if !defined(__GNUC__) && !defined(__clang__)
#error \
    "gpuguard/scope.h needs __attribute__((cleanup)) (GCC or Clang). With other compilers call \
gg_scope_begin()/gg_scope_end(), gg_arena_destroy() and gg_guard_destroy() yourself."
#endif

#include <stddef.h>

#include "gpuguard/arena.h"
#include "gpuguard/guard.h"

/** @defgroup gg_scope_raii C scope macros
 *  Cleanups tied to C blocks with `__attribute__((cleanup))` (GCC and Clang). They run on every way
 *  out of a block: falling off its end, `break`, `continue`, `return` and `goto`; during C++
 *  unwinding only when C code is built with `-fexceptions`; never on `longjmp()` or a signal (that
 *  is the guard's job).
 *
 *  @code
 *  GG_SCOPE(arena) {                       // gg_scope_begin()
 *    void *tmp;
 *    if (gg_alloc(arena, n, &tmp) != 0) return -1;   // the scope ends here too
 *  }                                        // gg_scope_end(): tmp is released
 *
 *  gg_auto(gg_arena_destroy) gg_arena_t *a = NULL;  // destroyed when the block ends, if not NULL
 *  gg_auto(gg_guard_destroy) gg_guard_t *g = NULL;
 *  ...
 *  return GG_TAKE_PTR(a);                  // hand ownership out: a becomes NULL, nothing is
 *  destroyed
 *  @endcode
 *  @{ */

/** Destroys `*p` with gg_arena_destroy() if not NULL and sets it to NULL; for
 *  gg_auto(gg_arena_destroy). */
static inline void gg_arena_destroyp(gg_arena_t **p) {
  if (p && *p) {
    gg_arena_destroy(*p);
    *p = NULL;
  }
}

/** Destroys `*p` with gg_guard_destroy() if not NULL and sets it to NULL; for
 *  gg_auto(gg_guard_destroy). */
static inline void gg_guard_destroyp(gg_guard_t **p) {
  if (p && *p) {
    gg_guard_destroy(*p);
    *p = NULL;
  }
}

/** Declares a variable destroyed by `destroy` (gg_arena_destroy or gg_guard_destroy; the macro
 *  calls gg_arena_destroyp() or gg_guard_destroyp() with the variable's address) when its block
 *  ends. Initialise the variable (to NULL at least). */
#define gg_auto(destroy) __attribute__((cleanup(destroy##p)))

/** Evaluates to the pointer held in variable @p p and sets the variable to NULL, so that a gg_auto
 *  cleanup does not destroy it: for handing ownership to the caller. */
#define GG_TAKE_PTR(p)              \
  __extension__({                   \
    __typeof__(p) gg__taken_ = (p); \
    (p) = NULL;                     \
    gg__taken_;                     \
  })

/** State of one GG_SCOPE block (internal). */
typedef struct gg__scope_block {
  gg_scope_t scope; /**< the scope */
  int rc;           /**< gg_scope_begin()'s status */
  int pass;         /**< 1 while the block's single pass runs */
} gg__scope_block_t;

/** Begins the scope of a GG_SCOPE block (internal). */
static inline gg__scope_block_t gg__scope_block_begin(gg_arena_t *arena) {
  gg__scope_block_t b;
  b.scope.arena = NULL;
  b.scope.id = 0;
  b.rc = gg_scope_begin(arena, &b.scope);
  b.pass = b.rc == 0;
  return b;
}

/** Ends the scope of a GG_SCOPE block, however the block was left (internal). */
static inline void gg__scope_block_end(gg__scope_block_t *b) {
  if (b->rc == 0) gg_scope_end(&b->scope);
}

#define GG__CAT_(a, b) a##b
#define GG__CAT(a, b)  GG__CAT_(a, b)

/** Runs the following block inside a scope of @p arena, ended on every way out of the block. The
 *  block is a one-pass loop: `break` and `continue` leave it (not an enclosing loop). If the scope
 *  cannot begin (NULL arena, after fork), the block is skipped and gg_last_error() says why; use
 *  GG_SCOPE_RC to see the status. */
#define GG_SCOPE(arena) GG__SCOPE_(arena, GG__CAT(gg__scope_, __COUNTER__), (void)0)

/** As GG_SCOPE, and stores gg_scope_begin()'s status in the int lvalue @p rc first. */
#define GG_SCOPE_RC(arena, rc)      GG__SCOPE_RC_(arena, rc, GG__CAT(gg__scope_, __COUNTER__))
#define GG__SCOPE_RC_(arena, rc, v) GG__SCOPE_(arena, v, (rc) = v.rc)

#define GG__SCOPE_(arena, v, after_begin)                                            \
  for (gg__scope_block_t v                                                           \
       __attribute__((cleanup(gg__scope_block_end))) = gg__scope_block_begin(arena); \
       (after_begin, v.pass); v.pass = 0)

/** @} */
#endif
