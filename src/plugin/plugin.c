/* plugin.c — the allocator plugin: PyTorch's CUDAPluggableAllocator entry points over one
 * registered arena per device, and their counters. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpuguard/plugin.h"
#include "arena/arena_internal.h"
#include "core/internal.h"
#include "plugin/plugin_graph_internal.h"
#include "plugin/plugin_internal.h"
#include "plugin/plugin_threads_internal.h"

/* The table is read on every allocation and written only at registration: a call announces the
 * arena it uses in its thread's record and a writer waits for the calls using the arena it replaces
 * (plugin_threads.c), so calls from many threads share no lock. */
static _Atomic(gg_arena_t *) gg__plug[GG_PLUGIN_MAX_DEVICES];
static pthread_once_t gg__plug_once = PTHREAD_ONCE_INIT;
static atomic_bool gg__plug_used; /* set once the table was first written */
/* Serialises gg_plugin_ensure_arena(): two first allocations on one device make one arena. */
static pthread_mutex_t gg__plug_make_lock = PTHREAD_MUTEX_INITIALIZER;

/* Captures announced through gg_plugin_announce_capture() and not yet ended: while any is, calls
 * with GG_TORCH_ANNOUNCED ask the driver as every other call does. Read by a call after its hold on
 * the table is published, and raised before the announcer waits for the holds (both sequentially
 * consistent): a call either sees the announcement or is waited for. */
static atomic_long gg__announced;

/* GPUGUARD_PLUGIN_TRACE=FILE records every call, for bench_replay: `a PTR SIZE STREAM`, `f PTR
 * STREAM`. Opened at the first call; a name that cannot be opened is reported once and tracing
 * stays off. */
static pthread_once_t gg__trace_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t gg__trace_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *gg__trace;

static void gg__trace_open(void) {
  const char *path = gg__env("GPUGUARD_PLUGIN_TRACE");
  if (!path) return;
  gg__trace = fopen(path, "w");
  if (!gg__trace)
    fprintf(stderr, "gpuguard: GPUGUARD_PLUGIN_TRACE='%s' cannot be opened; not tracing\n", path);
  else
    fprintf(gg__trace, "# gpuguard plugin trace, pid %ld\n", (long)getpid());
}

static void gg__trace_line(char op, const void *ptr, ssize_t size, const void *stream) {
  pthread_once(&gg__trace_once, gg__trace_open);
  if (!gg__trace) return;
  pthread_mutex_lock(&gg__trace_lock);
  if (op == 'a')
    fprintf(gg__trace, "a %p %zd %p\n", ptr, size, stream);
  else
    fprintf(gg__trace, "f %p %p\n", ptr, stream);
  fflush(gg__trace); /* the process may end without exit handlers (PyTorch's global allocator) */
  pthread_mutex_unlock(&gg__trace_lock);
}

static void gg__plug_install(void) {
  gg__arena_on_destroy(gg__plugin_forget); /* a destroyed arena leaves the table first */
  atomic_store(&gg__plug_used, true);
}

static int gg__plug_device(int device, const char *call) {
  if (device < 0 || device >= GG_PLUGIN_MAX_DEVICES)
    return gg__err(GG_EINVAL, "%s: device %d is out of range (0..%d)", call, device,
                   GG_PLUGIN_MAX_DEVICES - 1);
  return 0;
}

/* Streams PyTorch recorded blocks on (Tensor.record_stream): ptr → streams, joined at the free.
 * Rare (side-stream communication), so a small list under a mutex, checked at a free only when not
 * empty. */
typedef struct gg__recorded {
  void *ptr, *stream;
  int device;
} gg__recorded_t;
static pthread_mutex_t gg__rec_lock = PTHREAD_MUTEX_INITIALIZER;
static gg__recorded_t *gg__rec;
static size_t gg__nrec, gg__caprec;
static atomic_size_t gg__nrec_any; /* gg__nrec, readable without the lock */

int gg_plugin_record_stream(int device, void *ptr, void *stream) {
  int rc = gg__plug_device(device, "gg_plugin_record_stream");
  if (rc < 0) return rc;
  if (!ptr) return gg__err(GG_EINVAL, "gg_plugin_record_stream: ptr is NULL");
  pthread_mutex_lock(&gg__rec_lock);
  bool known = false;
  for (size_t i = 0; i < gg__nrec && !known; i++)
    known = gg__rec[i].ptr == ptr && gg__rec[i].stream == stream && gg__rec[i].device == device;
  if (!known && gg__nrec == gg__caprec) {
    size_t cap = gg__caprec ? 2 * gg__caprec : 16;
    gg__recorded_t *n = realloc(gg__rec, cap * sizeof *n);
    if (!n)
      rc = gg__err(GG_ENOMEM, "gg_plugin_record_stream: out of host memory");
    else {
      gg__rec = n;
      gg__caprec = cap;
    }
  }
  if (!known && rc == 0) gg__rec[gg__nrec++] = (gg__recorded_t){ptr, stream, device};
  atomic_store(&gg__nrec_any, gg__nrec);
  pthread_mutex_unlock(&gg__rec_lock);
  return rc;
}

/* Takes the next stream recorded for ptr out of the list; false when none is left. */
static bool gg__recorded_take(int device, void *ptr, void **stream) {
  if (GG__LIKELY(atomic_load_explicit(&gg__nrec_any, memory_order_relaxed) == 0)) return false;
  bool found = false;
  pthread_mutex_lock(&gg__rec_lock);
  for (size_t i = 0; i < gg__nrec && !found; i++)
    if (gg__rec[i].ptr == ptr && gg__rec[i].device == device) {
      *stream = gg__rec[i].stream;
      gg__rec[i] = gg__rec[--gg__nrec];
      found = true;
    }
  atomic_store(&gg__nrec_any, gg__nrec);
  pthread_mutex_unlock(&gg__rec_lock);
  return found;
}

/* fork() while another thread holds one of these would leave it held forever in the child: fork.c's
 * handler takes them around the fork, outermost of the library's locks. The child's table starts
 * empty (the parent's arenas refuse use there anyway), and so does its list of recorded streams. */
static _Thread_local bool gg__plug_forking; /* this thread's prepare took the locks */

static void gg__plugin_fork_prepare(void) {
  gg__pt_fork_prepare();
  /* Only once the plugin was used (as when it registered its own handler at first use): a program
   * that never touches it forks as before. */
  if (!atomic_load(&gg__plug_used)) return;
  pthread_mutex_lock(&gg__plug_make_lock);
  pthread_mutex_lock(&gg__trace_lock);
  pthread_mutex_lock(&gg__rec_lock);
  gg__graph_fork_prepare();
  gg__plug_forking = true;
}

static void gg__plugin_fork_parent(void) {
  if (gg__plug_forking) {
    gg__plug_forking = false;
    gg__graph_fork_release();
    pthread_mutex_unlock(&gg__rec_lock);
    pthread_mutex_unlock(&gg__trace_lock);
    pthread_mutex_unlock(&gg__plug_make_lock);
  }
  gg__pt_fork_parent();
}

static void gg__plugin_fork_child(void) {
  gg__pt_fork_child();
  atomic_store(&gg__announced, 0); /* the parent's captures are not the child's */
  if (!gg__plug_forking) return;
  gg__plug_forking = false;
  for (int i = 0; i < GG_PLUGIN_MAX_DEVICES; i++) atomic_store(&gg__plug[i], NULL);
  gg__nrec = 0;
  atomic_store(&gg__nrec_any, 0);
  /* Re-made, not unlocked: a parent thread blocked in the same lock (a second fork() at once) left
   * itself recorded as a waiter, and an unlock in the child hands the lock to that thread, which
   * does not exist here: the child's next reader would wait forever. */
  gg__graph_fork_reinit();
  pthread_mutex_init(&gg__rec_lock, NULL);
  pthread_mutex_init(&gg__trace_lock, NULL);
  pthread_mutex_init(&gg__plug_make_lock, NULL);
}
GG__FORK_REGISTER(GG__FORK_PLUGIN, gg__plugin_fork_prepare, gg__plugin_fork_parent,
                  gg__plugin_fork_child)

int gg_plugin_set_arena(int device, gg_arena_t *arena) {
  int rc = gg__plug_device(device, "gg_plugin_set_arena");
  if (rc < 0) return rc;
  /* A framework's tensors come back in the sizes they left: keep the holes they leave for them.
   * Marking the arena validates the handle too: live, not torn down, not inherited through fork. */
  if (arena) {
    rc = gg__arena_keep_holes(arena, "gg_plugin_set_arena");
    if (rc < 0) return rc;
  }
  pthread_once(&gg__plug_once, gg__plug_install);
  gg__pt_publish(&gg__plug[device], arena);
  return 0;
}

int gg_plugin_ensure_arena(int device, const gg_arena_options_t *opts, gg_arena_t **arena) {
  if (!arena) {
    return gg__err(GG_EINVAL, "gg_plugin_ensure_arena: arena (the out-pointer) is NULL");
  }
  *arena = NULL;
  int rc = gg__plug_device(device, "gg_plugin_ensure_arena");
  if (rc < 0) {
    return rc;
  }
  gg_arena_t *have = atomic_load(&gg__plug[device]);
  if (have) {
    *arena = have;
    return 0;
  }
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  if (opts) {
    o = *opts;
  }
  o.device = device;
  if (o.flags & GG_ARENA_NO_STREAM) {
    return gg__err(GG_EINVAL,
                   "gg_plugin_ensure_arena: GG_ARENA_NO_STREAM would hand out blocks that "
                   "PyTorch's kernels may still use");
  }
  if (!o.name) {
    o.name = "torch";
  }
  pthread_mutex_lock(&gg__plug_make_lock);
  have = atomic_load(&gg__plug[device]);
  if (!have) {
    rc = gg_arena_create(&have, &o);
    if (rc == 0) {
      rc = gg_plugin_set_arena(device, have);
      if (rc < 0) {
        gg_arena_destroy(have);
        have = NULL;
      }
    }
  }
  pthread_mutex_unlock(&gg__plug_make_lock);
  *arena = have;
  return rc;
}

int gg_plugin_get_arena(int device, gg_arena_t **arena) {
  if (!arena) return gg__err(GG_EINVAL, "gg_plugin_get_arena: arena (the out-pointer) is NULL");
  int rc = gg__plug_device(device, "gg_plugin_get_arena");
  if (rc < 0) return rc;
  *arena = atomic_load(&gg__plug[device]);
  return 0;
}

int gg_plugin_reset_peak(int device) {
  int rc = gg__plug_device(device, "gg_plugin_reset_peak");
  if (rc == 0) gg__pt_reset(device, true, false);
  return rc;
}

int gg_plugin_reset_totals(int device) {
  int rc = gg__plug_device(device, "gg_plugin_reset_totals");
  if (rc == 0) gg__pt_reset(device, false, true);
  return rc;
}

int gg_plugin_stats(int device, gg_plugin_stats_t *stats) {
  if (!stats) return gg__err(GG_EINVAL, "gg_plugin_stats: stats is NULL");
  int rc = gg__plug_device(device, "gg_plugin_stats");
  if (rc < 0) return rc;
  gg__pt_read(device, stats);
  memset(stats->reserved_, 0, sizeof stats->reserved_);
  stats->arena = atomic_load(&gg__plug[device]);
  return 0;
}

void gg__plugin_forget(const gg_arena_t *arena) {
  /* Called by every gg_arena_destroy(): a cheap read first, the writer's wait only when it is
   * registered (gg_arena_t is const here only for the comparison). */
  for (int i = 0; i < GG_PLUGIN_MAX_DEVICES; i++) {
    if (atomic_load(&gg__plug[i]) == arena) gg__pt_retract(&gg__plug[i], (gg_arena_t *)arena);
  }
}

enum { GG__TORCH_FLAGS = GG_TORCH_ANNOUNCED | GG_TORCH_OWN_STATS };

int gg_plugin_announce_capture(void) {
  atomic_fetch_add(&gg__announced, 1);
  gg__pt_quiesce();
  return 0;
}

int gg_plugin_capture_ended(void) {
  long n = atomic_load(&gg__announced);
  do {
    if (n <= 0)
      return gg__err(GG_ESTATE, "gg_plugin_capture_ended: no capture announcement is open");
  } while (!atomic_compare_exchange_weak(&gg__announced, &n, n - 1));
  return 0;
}

/* Whether a call with these flags may skip the capture query; after gg__pt_enter. */
static bool gg__trusted(unsigned flags) {
  return (flags & GG_TORCH_ANNOUNCED) && atomic_load(&gg__announced) == 0;
}

int gg_torch_alloc_ex(ssize_t size, int device, void *stream, unsigned flags, void **ptr) {
  if (!ptr) return gg__err(GG_EINVAL, "gg_torch_alloc: ptr (the out-pointer) is NULL");
  *ptr = NULL;
  if (flags & ~(unsigned)GG__TORCH_FLAGS)
    return gg__err(GG_EINVAL, "gg_torch_alloc_ex: unknown flags 0x%x", flags);
  if (size == 0) return 0;
  int joins = 0;
  gg__pt_t *me = NULL;
  int rc = gg__plug_device(device, "gg_torch_alloc");
  if (rc < 0) return rc;
  if (size < 0) rc = gg__err(GG_EINVAL, "gg_torch_alloc: size %zd is negative", size);
  if (rc == 0) {
    gg_arena_t *a = gg__pt_enter(&gg__plug[device], &me);
    int g = gg__graph_alloc(device, a, (size_t)size, stream, gg__trusted(flags),
                            ptr); /* under a CUDA graph capture */
    if (g != 0)
      rc = g < 0 ? g : 0;
    else if (!a)
      rc = gg__err(GG_ESTATE,
                   "gg_torch_alloc: no arena is registered for device %d (gg_plugin_set_arena)",
                   device);
    else
      rc = gg__arena_alloc_on(a, (size_t)size, stream, ptr, &joins);
    gg__pt_leave(me);
  }
  if (!(flags & GG_TORCH_OWN_STATS)) gg__pt_count(me, device, rc, true, (size_t)size, joins);
  if (rc < 0) return rc;
  gg__trace_line('a', *ptr, size, stream);
  return 0;
}

int gg_torch_alloc_status(ssize_t size, int device, void *stream, void **ptr) {
  return gg_torch_alloc_ex(size, device, stream, 0, ptr);
}

void *gg_torch_alloc(ssize_t size, int device, void *stream) {
  void *p = NULL;
  if (gg_torch_alloc_status(size, device, stream, &p) < 0)
    fprintf(stderr, "gpuguard: gg_torch_alloc(%zd bytes, device %d) failed: %s\n", size, device,
            gg_last_error());
  return p;
}

int gg_torch_free_ex(void *ptr, ssize_t size, int device, void *stream, unsigned flags) {
  if (flags & ~(unsigned)GG__TORCH_FLAGS)
    return gg__err(GG_EINVAL, "gg_torch_free_ex: unknown flags 0x%x", flags);
  if (!ptr)
    return 0; /* the arena knows every block's size; `size` feeds PyTorch-style statistics */
  gg__trace_line('f', ptr, 0, stream);
  int joins = 0;
  gg__pt_t *me = NULL;
  int rc = gg__plug_device(device, "gg_torch_free");
  if (rc < 0) return rc;
  gg_arena_t *a = gg__pt_enter(&gg__plug[device], &me);
  int g = gg__graph_free(device, a, ptr, size > 0 ? (size_t)size : 0, stream,
                         gg__trusted(flags)); /* a graph's block */
  void *other;
  if (g != 0) { /* the pool keeps the block for as long as its graph lives: no stream to wait for
                   now */
    rc = g < 0 ? g : 0;
    while (gg__recorded_take(device, ptr, &other)) {
    }
  } else if (!a)
    rc = gg__err(
        GG_ESTATE,
        "gg_torch_free: no arena is registered for device %d any more; the block stays with the "
        "arena that handed it out",
        device);
  else {
    int joined = 0;
    /* Tensor.record_stream: the arena's stream first waits for those streams' work so far. */
    while (rc >= 0 && gg__recorded_take(device, ptr, &other))
      joined |= (rc = gg__arena_join_stream(a, other)) > 0;
    if (rc >= 0) rc = gg__arena_free_on(a, ptr, stream, &joins);
    joins |= joined;
  }
  gg__pt_leave(me);
  if (!(flags & GG_TORCH_OWN_STATS))
    gg__pt_count(me, device, rc, false, size > 0 ? (size_t)size : 0, joins);
  return rc < 0 ? rc : 0;
}

void gg_torch_free(void *ptr, ssize_t size, int device, void *stream) {
  if (gg_torch_free_ex(ptr, size, device, stream, 0) < 0)
    fprintf(stderr, "gpuguard: gg_torch_free(%p, device %d) failed: %s\n", ptr, device,
            gg_last_error());
}
