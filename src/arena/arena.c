/* arena.c — arena handles: create and destroy, checking and locking a handle for a call, quarantine
 * of destroyed handles, the process's live arenas, the fork handlers of their locks, statistics,
 * and the checked copies. The allocator itself lives in the other src/arena*.c files (see
 * arena_base_impl.h). */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena_bump_internal.h"
#include "arena/arena_base_impl.h"
#include "guard/guard_internal.h"
#include "core/internal.h"

/* 8 MiB: each map costs ~30 us whatever its size on an H200, so growing by 8 MiB costs ~4 ms per
 * GiB (2 MiB: 16 ms); and trim returns memory in pieces that small. Replaying a PyTorch training
 * trace, peak mapped / peak in use was 1.004 (2 MiB: 1.001, 64 MiB: 1.012). */
#define GG__DEFAULT_CHUNK ((size_t)8 << 20)
#define GG__QUARANTINE    64 /* destroyed handles kept readable so late calls fail cleanly */

/* ---- handles: validation, locking, quarantine ------------------------------------------------ */

/* Global locks of the arena, in the order they are taken around fork(): the live list's lock, then
 * the quarantine's lock. No code path holds both; an arena's own lock may be taken under the live
 * list's. */
static pthread_mutex_t gg__live_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t gg__quarantine_lock = PTHREAD_MUTEX_INITIALIZER;
static gg_arena_t *gg__quarantined[GG__QUARANTINE];
static size_t gg__quarantine_next;

/* A destroyed handle stays allocated (magic cleared) until GG__QUARANTINE later destroys, so a call
 * on it reads valid memory and fails with GG_EINVAL instead of touching freed memory. Older handles
 * are truly freed: a call on them is undefined behaviour, as with any dangling pointer. */
static void gg__quarantine(gg_arena_t *a) {
  pthread_mutex_lock(&gg__quarantine_lock);
  gg_arena_t *old = gg__quarantined[gg__quarantine_next];
  /* A dead handle, quarantined once: freeing it twice would be the use after free this prevents. */
  GG__ASSERT(a != old && atomic_load(&a->magic) == GG__DEAD && !a->on_live);
  gg__quarantined[gg__quarantine_next] = a;
  gg__quarantine_next = (gg__quarantine_next + 1) % GG__QUARANTINE;
  pthread_mutex_unlock(&gg__quarantine_lock);
  free(old);
}

/* ---- the process's live arenas, fork, the destroy hook --------------------------------------- */

/* Reports list this process's arenas. Lock order: this list's lock, then an arena's lock. */
static gg_arena_t *gg__live_head;

static void gg__live_add(gg_arena_t *a) {
  pthread_mutex_lock(&gg__live_lock);
  GG__ASSERT(!a->on_live); /* listed twice, removal would unlink only one */
  a->live_prev = NULL;
  a->live_next = gg__live_head;
  if (gg__live_head) gg__live_head->live_prev = a;
  gg__live_head = a;
  a->on_live = true;
  pthread_mutex_unlock(&gg__live_lock);
}

static void gg__live_remove(gg_arena_t *a) {
  pthread_mutex_lock(&gg__live_lock);
  if (a->on_live) {
    GG__ASSERT(a->live_prev ? a->live_prev->live_next == a : gg__live_head == a);
    if (a->live_prev)
      a->live_prev->live_next = a->live_next;
    else
      gg__live_head = a->live_next;
    if (a->live_next) a->live_next->live_prev = a->live_prev;
    a->on_live = false;
  }
  pthread_mutex_unlock(&gg__live_lock);
}

int gg__arena_foreach_live(int (*fn)(gg_arena_t *arena, void *user), void *user) {
  int rc = 0;
  pthread_mutex_lock(&gg__live_lock);
  for (gg_arena_t *a = gg__live_head; a && rc == 0; a = a->live_next) rc = fn(a, user);
  pthread_mutex_unlock(&gg__live_lock);
  return rc;
}

static void gg__arena_fork_prepare(void) {
  pthread_mutex_lock(&gg__live_lock);
  pthread_mutex_lock(&gg__quarantine_lock);
}

static void gg__arena_fork_parent(void) {
  pthread_mutex_unlock(&gg__quarantine_lock);
  pthread_mutex_unlock(&gg__live_lock);
}

/* The forking thread took both locks and is the child's only thread: it owns them and may unlock
 * them. The lists stay as they were; the parent's arenas in them refuse use in the child. */
static void gg__arena_fork_child(void) {
  pthread_mutex_unlock(&gg__quarantine_lock);
  pthread_mutex_unlock(&gg__live_lock);
}
GG__FORK_REGISTER(GG__FORK_ARENAS, gg__arena_fork_prepare, gg__arena_fork_parent,
                  gg__arena_fork_child)

/* ---- create and destroy ---------------------------------------------------------------------- */

void gg_arena_options_init(gg_arena_options_t *opts) {
  if (opts) memset(opts, 0, sizeof *opts);
}

static const gg__attach_ops_t gg__arena_attach_ops; /* how a guard tears an attached arena down */

/* Opens the device and reserves the range. On failure the caller closes a->dev. */
static int gg__arena_open(gg_arena_t *a, const gg_arena_options_t *o) {
  int rc = gg__dev_open(o->backend, o->device, &a->dev);
  if (rc < 0) return rc;
  a->ops = a->dev->ops;
  a->granularity = a->dev->granularity;
  a->contiguous = a->dev->contiguous;
  size_t g = a->granularity, cap = o->capacity ? o->capacity : a->dev->props.total_mem;
  size_t chunk = o->chunk_size ? o->chunk_size : GG__DEFAULT_CHUNK;
  if (cap > SIZE_MAX - g || chunk > SIZE_MAX - g)
    return gg__err(GG_EINVAL,
                   "gg_arena_create: capacity %zu or chunk size %zu overflows when rounded to %zu",
                   cap, chunk, g);
  a->capacity = (size_t)gg__align_up(cap, g);
  a->chunk_size = (size_t)gg__align_up(chunk, g);
  a->limit = a->capacity;
  if (o->stream && a->ops->stream_check) {
    rc = a->ops->stream_check(a->dev, o->stream, "gg_arena_create");
    if (rc < 0) return rc;
  }
  rc = a->ops->va_reserve(a->dev, a->capacity, &a->base);
  if (rc < 0) return rc;
  a->stream = o->stream;
  a->flags = o->flags;
  a->track = !(o->flags & GG_ARENA_NO_STREAM);
  a->keep_holes = (o->flags & GG_ARENA_KEEP_HOLES) != 0;
  gg__strlcpy(a->name, o->name ? o->name : "arena", sizeof a->name);
  return 0;
}

int gg_arena_create(gg_arena_t **arena, const gg_arena_options_t *opts) {
#if GG_DEBUG >= 2
  atomic_store_explicit(&gg__arena_debug_hook, gg__arena_debug_check, memory_order_relaxed);
#endif
  if (!arena) return gg__err(GG_EINVAL, "gg_arena_create: arena (the out-pointer) is NULL");
  *arena = NULL;
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  if (opts) o = *opts;
  if (o.flags & ~(GG_ARENA_NO_STREAM | GG_ARENA_TRIM_ON_SCOPE_EXIT | GG_ARENA_BACKTRACE |
                  GG_ARENA_KEEP_HOLES))
    return gg__err(GG_EINVAL, "gg_arena_create: unknown flags %#x", o.flags);
  if (o.device < 0) return gg__err(GG_EINVAL, "gg_arena_create: device %d is negative", o.device);
  const char *bt = gg__env("GPUGUARD_BACKTRACE"); /* turns sites on for every arena; never off */
  bool bt_on = false;
  if (bt && gg__parse_bool("GPUGUARD_BACKTRACE", bt, &bt_on) < 0) return GG_EINVAL;
  if (bt_on) o.flags |= GG_ARENA_BACKTRACE;
  gg_arena_t *a = calloc(1, sizeof *a);
  if (a) a->frames = calloc(16, sizeof *a->frames);
  if (!a || !a->frames) {
    free(a);
    return gg__err(GG_ENOMEM, "gg_arena_create: out of host memory");
  }
  a->frames_cap = 16;
  a->n_frames = 1;
  int rc = gg__arena_open(a, &o);
  if (rc == 0 && (o.flags & GG_ARENA_BACKTRACE)) rc = gg__sites_create(a);
  if (rc < 0) {
    if (a->dev && a->base) a->ops->va_release(a->dev, a->base, a->capacity);
    gg__dev_close(a->dev);
    free(a->frames);
    free(a);
    return rc;
  }
  pthread_mutex_init(&a->lock, NULL);
  static atomic_ullong ids;
  a->id = atomic_fetch_add(&ids, 1) + 1;
  atomic_init(&a->tc_epoch, 1);
  atomic_init(&a->tc_safe, 1); /* ticket 0 is reusable at once */
  a->fork_gen = a->dev->fork_gen;
  a->magic = GG__MAGIC;
  /* A live guard of this device tears the arena down with its other cleanups, LIFO. */
  rc = gg__guard_attach(a->ops->name, o.device, &gg__arena_attach_ops, a, &a->guard_token);
  if (rc < 0) {
    gg_arena_destroy(a);
    return rc;
  }
  gg__live_add(a);
  *arena = a;
  return 0;
}

/* How long the guard's teardown of an arena waits for the work of every stream before unmapping. */
#define GG__TEARDOWN_SYNC_MS 2000

/* Gives every device resource back: events, chunks, the range, the device. Lock held. */
static int gg__release_device(gg_arena_t *a, bool whole_ctx) {
  int rc = 0;
  /* Live blocks may still be in use by queued work: wait before unmapping. gg_arena_destroy() waits
   * for the arena's stream, as its caller promised the rest. At the guard's teardown (exit, a
   * signal) the program can no longer wait itself, and its kernels on other streams may use the
   * arena's memory too: the whole context is waited for, bounded (a kernel that never ends, say one
   * waiting for a dead peer, must not hang the exit; the watchdog's limit is the guard's, this one
   * is per arena). On timeout the memory is unmapped anyway, as at process exit, and the detail
   * says so. */
  int sync = whole_ctx && a->mapped && a->ops->ctx_sync
                 ? a->ops->ctx_sync(a->dev, GG__TEARDOWN_SYNC_MS)
                 : 1;
  if (sync != 0 && sync != GG_ETIMEDOUT && a->track && a->mapped)
    sync = a->ops->stream_sync(a->dev,
                               a->stream); /* no context wait (refused, or not asked): our stream */
  if (sync < 0) GG_KEEP_FIRST(rc, sync);
  GG_KEEP_FIRST(rc, gg__arena_events_destroy(a));
  GG_KEEP_FIRST(rc, gg__arena_unmap_all(a));
  GG_KEEP_FIRST(rc, a->ops->va_release(a->dev, a->base, a->capacity));
  /* A chunk whose unmap failed stays mapped until the process ends (the driver frees everything
   * then; cuMemCreate memory does not go with the context). The error is returned to the caller. */
  gg__dev_close(a->dev);
  a->dev = NULL;
  return rc;
}

static int gg__release_device_or_say(gg_arena_t *a, void *unused) {
  (void)unused;
  int rc = gg__release_device(a, true);
  if (rc < 0)
    fprintf(stderr, "gpuguard: arena '%s': giving its memory back at the guard's teardown: %s\n",
            a->name, gg_last_error());
  return rc;
}

/* The guard's teardown step for an attached arena: device memory back now, the handle kept (calls
 * on it fail with GG_ESTATE) until its owner calls gg_arena_destroy(). */
static void gg__arena_guard_teardown(void *obj) {
  gg_arena_t *a = obj;
  pthread_mutex_lock(&a->lock);
  if (a->magic == GG__MAGIC) {
    a->magic = GG__TORN;
    gg__tcache_detach_all(a); /* before the device goes: a cache may be asking the stream */
    gg__arena_quietly(a, gg__release_device_or_say, NULL);
  }
  pthread_mutex_unlock(&a->lock);
}

static const char *gg__arena_attached_name(void *obj) { return ((gg_arena_t *)obj)->name; }
static const char *gg__arena_attached_backend(void *obj) { return ((gg_arena_t *)obj)->ops->name; }
/* The guard's leak report counts blocks in its own type (guard_internal.h): each one is handed
 * over as the guard layer spells it. */
typedef struct gg__held_visit {
  gg__held_visit_fn visit;
  void *user;
} gg__held_visit_t;
static int gg__arena_held_block(const gg_block_info_t *b, void *user) {
  const gg__held_visit_t *h = user;
  gg__held_block_t held = {b->size, b->tag, b->n_frames, b->frames};
  return h->visit(&held, h->user);
}
static int gg__arena_attached_foreach(void *obj, gg__held_visit_fn visit, void *user) {
  gg__held_visit_t h = {visit, user};
  return gg_arena_foreach_block(obj, gg__arena_held_block, &h);
}

static const gg__attach_ops_t gg__arena_attach_ops = {
    "arena", gg__arena_guard_teardown, gg__arena_attached_name, gg__arena_attached_backend,
    gg__arena_attached_foreach};

/* Frees the host side of an arena (not the handle). Lock held. */
static void gg__arena_free_metadata(gg_arena_t *a) {
  gg__arena_tags_free(a);
  gg__sites_free(a);
  for (size_t d = 0; d < a->frames_cap; d++) {
    free(a->frames[d].recs);
    gg__addr_map_free(&a->frames[d].used);
  }
  free(a->chunks);
  free(a->spare_events);
  free(a->closed);
  free(a->bump);
  free(a->runs);
  free(a->frames);
  gg__freelist_free(&a->freelist);
  gg__addr_map_free(&a->used);
  free(a->ord_tick);
}

int gg_arena_destroy(gg_arena_t *a) {
  if (!a) return 0;
  int rc = gg__arena_valid(a, "gg_arena_destroy");
  if (rc == GG_ESTATE && a->magic == GG__TORN) rc = 0; /* torn down by its guard: free the handle */
  if (rc < 0) return rc;
  if (atomic_exchange(&a->destroying, true)) /* a concurrent destroy goes ahead */
    return gg__err(GG_EINVAL, "gg_arena_destroy: %p is not a live arena (destroyed already)",
                   (void *)a);
  gg__live_remove(a);
  /* Before our lock: if the guard is tearing this arena down right now, this waits for that step.
   * */
  gg__guard_detach(a->guard_token);
  pthread_mutex_lock(&a->lock);
  bool torn = a->magic == GG__TORN;
  atomic_store(&a->magic, GG__DEAD);
  gg__tcache_detach_all(a);
  GG__ASSERT(a->caches == NULL); /* no cache may serve blocks of memory given back below */
  if (!torn) rc = gg__release_device(a, false);
  gg__arena_free_metadata(a);
  pthread_mutex_unlock(&a->lock);
  /* Calls that counted themselves before the handle died leave at once (they find it dead); the
   * lock is destroyed only once none is left in it. */
  while (atomic_load(&a->calls)) sched_yield();
  pthread_mutex_destroy(&a->lock);
  gg__quarantine(a);
  return rc;
}

/* ---- statistics and blocks ------------------------------------------------------------------- */

int gg_arena_stats(gg_arena_t *a, gg_arena_stats_t *stats) {
  int rc = gg__arena_enter(a, "gg_arena_stats");
  if (rc < 0) return rc;
  if (!stats) {
    rc = gg__err(GG_EINVAL, "gg_arena_stats: stats is NULL");
  } else {
    /* Memory whose work is done counts as free: one event record and a query, never a wait. */
    if (a->track) gg__arena_reclaim_finished(a);
    gg__arena_fill_stats(a, stats);
    gg__tcache_add_stats(a, stats);
  }
  gg__arena_leave(a);
  return rc;
}

int gg_arena_stats_quiet(gg_arena_t *a, gg_arena_stats_t *stats) {
  if (!stats) {
    return gg__err(GG_EINVAL, "gg_arena_stats_quiet: stats is NULL");
  }
  int rc = gg__arena_enter(a, "gg_arena_stats_quiet");
  if (rc < 0) {
    return rc;
  }
  gg__arena_fill_stats(a, stats);
  gg__tcache_add_stats(a, stats);
  gg__arena_leave(a);
  return 0;
}

static int gg__info_cmp(const void *x, const void *y) {
  uintptr_t a = (uintptr_t)((const gg_block_info_t *)x)->ptr,
            b = (uintptr_t)((const gg_block_info_t *)y)->ptr;
  return a < b ? -1 : a > b;
}

int gg_arena_foreach_block(gg_arena_t *a, gg_block_visitor_t visit, void *user) {
  int rc = gg__arena_enter(a, "gg_arena_foreach_block");
  if (rc < 0) return rc;
  if (!visit) {
    gg__arena_leave(a);
    return gg__err(GG_EINVAL, "gg_arena_foreach_block: visit is NULL");
  }
  rc = gg__tcache_publish_all(a); /* blocks threads' caches handed out are listed too */
  if (rc > 0) rc = 0;             /* how many it published */
  gg_block_info_t *v = rc < 0 ? NULL : malloc((a->n_live ? a->n_live : 1) * sizeof *v);
  size_t n = 0;
  if (rc < 0) {
  } else if (!v) {
    rc =
        gg__err(GG_ENOMEM, "gg_arena_foreach_block: out of host memory for %llu blocks", a->n_live);
  } else {
    for (int d = 0; d < a->n_frames; d++) {
      const gg__addr_map_t *m = gg__used_map(a, d);
      for (size_t i = 0; i < m->cap; i++) {
        const gg__block_t *b = m->slots[i].val;
        if (b) v[n++] = (gg_block_info_t){(void *)b->addr, b->req, b->tag, b->depth, 0, NULL};
      }
    }
    for (size_t i = 0; i < a->bump_count; i++) {
      const gg__bump_entry_t *e = &a->bump[i];
      if (e->live) v[n++] = (gg_block_info_t){(void *)e->ptr, e->req, e->tag, e->depth, 0, NULL};
    }
    for (size_t i = 0; a->sites && i < n; i++) {
      const gg__site_t *site = gg__site_of(a, (uintptr_t)v[i].ptr);
      if (site) {
        v[i].n_frames = site->n;
        v[i].frames = site->pc;
      }
    }
    qsort(v, n, sizeof *v, gg__info_cmp);
    for (size_t i = 0; i < n && !visit(&v[i], user); i++) continue;
  }
  free(v);
  gg__arena_leave(a);
  return rc;
}

const char *gg_arena_name(const gg_arena_t *a) {
  return a && (a->magic == GG__MAGIC || a->magic == GG__TORN) ? a->name : NULL;
}

const char *gg_arena_backend(const gg_arena_t *a) {
  return a && (a->magic == GG__MAGIC || a->magic == GG__TORN) ? a->ops->name : NULL;
}

/* ---- copies that prove memory is real -------------------------------------------------------- */

/* Whether [p, p+n) lies inside one live block the arena's own structures hold. */
static bool gg__in_live_block(const gg_arena_t *a, uintptr_t p, size_t n) {
  long i = gg__bump_find(a, p);
  if (i >= 0) {
    const gg__bump_entry_t *e = &a->bump[i];
    return e->live && p >= e->ptr && p + n <= e->ptr + e->req;
  }
  const gg__block_t *b = gg__used_get(a, p);
  if (!b) b = gg__used_holding(a, p);
  return b && p + n <= b->addr + b->req;
}

/* 0 when [p, p+n) lies inside one live block of the arena. */
static int gg__check_range(gg_arena_t *a, const char *call, uintptr_t p, size_t n) {
  if (!p) return gg__err(GG_EINVAL, "%s: device pointer is NULL", call);
  if (p > UINTPTR_MAX - n) return gg__err(GG_EINVAL, "%s: range wraps around", call);
  if (gg__in_live_block(a, p, n)) return 0;
  /* A block a thread's cache handed out is found once the caches published theirs. */
  if (gg__tcache_publish_all(a) > 0 && gg__in_live_block(a, p, n)) return 0;
  return gg__err(GG_EINVAL, "%s: %zu bytes at %#jx do not lie inside one live block of arena '%s'",
                 call, n, (uintmax_t)p, a->name);
}

int gg_arena_copy_to_device(gg_arena_t *a, void *dst, const void *src, size_t n) {
  int rc = gg__arena_enter(a, "gg_arena_copy_to_device");
  if (rc < 0) return rc;
  if (!src && n)
    rc = gg__err(GG_EINVAL, "gg_arena_copy_to_device: src is NULL");
  else
    rc = gg__check_range(a, "gg_arena_copy_to_device", (uintptr_t)dst, n);
  /* The copy runs under the lock: a guard's teardown must not unmap the block while it runs. */
  if (rc == 0 && n) rc = a->ops->copy_to_dev(a->dev, (uintptr_t)dst, src, n);
  gg__arena_leave(a);
  return rc;
}

int gg_arena_copy_from_device(gg_arena_t *a, void *dst, const void *src, size_t n) {
  int rc = gg__arena_enter(a, "gg_arena_copy_from_device");
  if (rc < 0) return rc;
  if (!dst && n)
    rc = gg__err(GG_EINVAL, "gg_arena_copy_from_device: dst is NULL");
  else
    rc = gg__check_range(a, "gg_arena_copy_from_device", (uintptr_t)src, n);
  if (rc == 0 && n) rc = a->ops->copy_from_dev(a->dev, dst, (uintptr_t)src, n);
  gg__arena_leave(a);
  return rc;
}

int gg_arena_memset(gg_arena_t *a, void *dst, int value, size_t n) {
  int rc = gg__arena_enter(a, "gg_arena_memset");
  if (rc < 0) return rc;
  rc = gg__check_range(a, "gg_arena_memset", (uintptr_t)dst, n);
  if (rc == 0 && n) rc = a->ops->set_d8(a->dev, (uintptr_t)dst, (unsigned char)value, n);
  gg__arena_leave(a);
  return rc;
}

int gg_arena_reset_peak(gg_arena_t *a) {
  int rc = gg__arena_enter(a, "gg_arena_reset_peak");
  if (rc < 0) return rc;
  a->peak_in_use = a->in_use;
  a->peak_mapped = a->mapped;
  gg__tcache_reset_peak(a);
  gg__arena_leave(a);
  return 0;
}

int gg_arena_get_options(gg_arena_t *a, gg_arena_options_t *out) {
  if (!out) return gg__err(GG_EINVAL, "gg_arena_get_options: out is NULL");
  int rc = gg__arena_enter(a, "gg_arena_get_options");
  if (rc < 0) return rc;
  gg_arena_options_init(out);
  out->device = a->dev->index;
  out->backend = a->ops->name;
  out->capacity = a->capacity;
  out->chunk_size = a->chunk_size;
  out->stream = a->stream;
  out->flags = a->flags;
  out->name = a->name;
  gg__arena_leave(a);
  return 0;
}

/* ---- limit and chunk walk
 * ------------------------------------------------------------------------ */

int gg_arena_set_limit(gg_arena_t *a, size_t limit) {
  int rc = gg__arena_enter(a, "gg_arena_set_limit");
  if (rc < 0) {
    return rc;
  }
  if (limit == 0 || limit >= a->capacity) {
    a->limit = a->capacity;
  } else {
    a->limit = limit - limit % a->granularity;
  }
  gg__arena_leave(a);
  return 0;
}

int gg_arena_get_limit(gg_arena_t *a, size_t *limit) {
  if (!limit) {
    return gg__err(GG_EINVAL, "gg_arena_get_limit: limit (the out-pointer) is NULL");
  }
  int rc = gg__arena_enter(a, "gg_arena_get_limit");
  if (rc < 0) {
    return rc;
  }
  *limit = a->limit;
  gg__arena_leave(a);
  return 0;
}

int gg_arena_foreach_chunk(gg_arena_t *a, gg_chunk_visitor_t visit, void *user) {
  if (!visit) {
    return gg__err(GG_EINVAL, "gg_arena_foreach_chunk: visit is NULL");
  }
  int rc = gg__arena_enter(a, "gg_arena_foreach_chunk");
  if (rc < 0) {
    return rc;
  }
  size_t i = 0;
  while (i < a->n_chunks) {
    if (a->chunks[i]->alias) {
      i++;
      continue; /* an old range of a moved chunk: no memory of its own */
    }
    gg_chunk_info_t c = {(void *)a->chunks[i]->ptr, a->chunks[i]->size};
    i++;
    /* Neighbours at consecutive addresses are one range: a block may span them. */
    while (i < a->n_chunks && !a->chunks[i]->alias &&
           a->chunks[i]->ptr == (uintptr_t)c.ptr + c.size) {
      c.size += a->chunks[i]->size;
      i++;
    }
    if (visit(&c, user) != 0) {
      break;
    }
  }
  gg__arena_leave(a);
  return 0;
}

int gg__arena_walk_mappings(gg_arena_t *a, const void *ptr, size_t size, const char *call,
                            gg_mapping_visitor_t visit, void *user) {
  uintptr_t lo = (uintptr_t)ptr;
  if (!visit) {
    return gg__err(GG_EINVAL, "%s: visit is NULL", call);
  }
  if (size == 0 || lo + size < lo) {
    return gg__err(GG_EINVAL, "%s: bad range %p + %zu", call, ptr, size);
  }
  int rc = gg__arena_enter(a, call);
  if (rc < 0) {
    return rc;
  }
  uintptr_t hi = lo + size;
  uintptr_t covered = lo; /* every byte below this is mapped */
  for (size_t i = 0; i < a->n_chunks && covered < hi; i++) {
    const gg__chunk_t *c = a->chunks[i];
    if (c->alias || c->ptr + c->size <= covered) {
      continue;
    }
    if (c->ptr > covered) {
      break; /* a hole (chunks are in address order) */
    }
    gg_mapping_info_t m = {(void *)c->ptr, c->size, (uint64_t)c->handle};
    covered = c->ptr + c->size;
    if (visit(&m, user) != 0) {
      covered = hi; /* stopped by the visitor: not a hole */
    }
  }
  gg__arena_leave(a);
  if (covered < hi) {
    return gg__err(GG_ENOTFOUND, "%s: %p is not mapped by the arena", call, (void *)covered);
  }
  return 0;
}

int gg_arena_foreach_mapping(gg_arena_t *a, const void *ptr, size_t size,
                             gg_mapping_visitor_t visit, void *user) {
  return gg__arena_walk_mappings(a, ptr, size, "gg_arena_foreach_mapping", visit, user);
}
