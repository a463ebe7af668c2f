/* plugin.c — the allocator plugin: PyTorch's CUDAPluggableAllocator entry points over one registered
 * arena per device, and their counters. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gpuguard/plugin.h"
#include "internal.h"
#include "plugin_graph.h"
#include "plugin_internal.h"

typedef struct gg__plug_counters {
  atomic_ullong allocs, frees, failed_allocs, failed_frees, syncs;
} gg__plug_counters_t;

/* The table is read on every allocation and written only at registration: a reader-writer lock lets
 * allocations run in parallel and lets a writer know that nobody still uses the arena it replaces. */
static pthread_rwlock_t gg__plug_lock = PTHREAD_RWLOCK_INITIALIZER;
static gg_arena_t *gg__plug[GG_PLUGIN_MAX_DEVICES];
static gg__plug_counters_t gg__plug_count[GG_PLUGIN_MAX_DEVICES];
static pthread_once_t gg__plug_once = PTHREAD_ONCE_INIT;

/* GPUGUARD_PLUGIN_TRACE=FILE records every call, for bench_replay: `a PTR SIZE STREAM`, `f PTR STREAM`.
 * Opened at the first call; a name that cannot be opened is reported once and tracing stays off. */
static pthread_once_t gg__trace_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t gg__trace_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *gg__trace;

static void gg__trace_open(void) {
  const char *path = gg__env("GPUGUARD_PLUGIN_TRACE");
  if (!path) return;
  if (!(gg__trace = fopen(path, "w")))
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

/* fork() while another thread holds the lock would leave it held forever in the child: take it around
 * the fork. The child's table starts empty (the parent's arenas refuse use there anyway). */
static void gg__plug_prepare(void) { pthread_rwlock_wrlock(&gg__plug_lock); }
static void gg__plug_parent(void) { pthread_rwlock_unlock(&gg__plug_lock); }
static void gg__plug_child(void) {
  memset(gg__plug, 0, sizeof gg__plug);
  pthread_rwlock_unlock(&gg__plug_lock);
}
static void gg__plug_install(void) { pthread_atfork(gg__plug_prepare, gg__plug_parent, gg__plug_child); }

static int gg__plug_device(int device, const char *call) {
  if (device < 0 || device >= GG_PLUGIN_MAX_DEVICES)
    return gg__err(GG_EINVAL, "%s: device %d is out of range (0..%d)", call, device,
                   GG_PLUGIN_MAX_DEVICES - 1);
  return 0;
}

int gg_plugin_set_arena(int device, gg_arena_t *arena) {
  int rc = gg__plug_device(device, "gg_plugin_set_arena");
  if (rc < 0) return rc;
  if (arena) {
    gg_arena_stats_t probe; /* validates the handle: live, not torn down, not inherited through fork */
    if ((rc = gg_arena_stats(arena, &probe)) < 0) return rc;
  }
  pthread_once(&gg__plug_once, gg__plug_install);
  pthread_rwlock_wrlock(&gg__plug_lock);
  gg__plug[device] = arena;
  pthread_rwlock_unlock(&gg__plug_lock);
  return 0;
}

int gg_plugin_get_arena(int device, gg_arena_t **arena) {
  if (!arena) return gg__err(GG_EINVAL, "gg_plugin_get_arena: arena (the out-pointer) is NULL");
  int rc = gg__plug_device(device, "gg_plugin_get_arena");
  if (rc < 0) return rc;
  pthread_rwlock_rdlock(&gg__plug_lock);
  *arena = gg__plug[device];
  pthread_rwlock_unlock(&gg__plug_lock);
  return 0;
}

int gg_plugin_stats(int device, gg_plugin_stats_t *stats) {
  if (!stats) return gg__err(GG_EINVAL, "gg_plugin_stats: stats is NULL");
  int rc = gg__plug_device(device, "gg_plugin_stats");
  if (rc < 0) return rc;
  gg__plug_counters_t *c = &gg__plug_count[device];
  stats->n_allocs = atomic_load(&c->allocs);
  stats->n_frees = atomic_load(&c->frees);
  stats->n_failed_allocs = atomic_load(&c->failed_allocs);
  stats->n_failed_frees = atomic_load(&c->failed_frees);
  stats->n_stream_syncs = atomic_load(&c->syncs);
  pthread_rwlock_rdlock(&gg__plug_lock);
  stats->arena = gg__plug[device];
  pthread_rwlock_unlock(&gg__plug_lock);
  return 0;
}

void gg__plugin_forget(const gg_arena_t *arena) {
  /* Called by every gg_arena_destroy(): a cheap read first, the write lock only when it is registered. */
  bool registered = false;
  pthread_rwlock_rdlock(&gg__plug_lock);
  for (int i = 0; i < GG_PLUGIN_MAX_DEVICES && !registered; i++) registered = gg__plug[i] == arena;
  pthread_rwlock_unlock(&gg__plug_lock);
  if (!registered) return;
  pthread_rwlock_wrlock(&gg__plug_lock);
  for (int i = 0; i < GG_PLUGIN_MAX_DEVICES; i++)
    if (gg__plug[i] == arena) gg__plug[i] = NULL;
  pthread_rwlock_unlock(&gg__plug_lock);
}

void *gg_torch_alloc(ssize_t size, int device, void *stream) {
  if (size == 0) return NULL;
  int synced = 0;
  int rc = gg__plug_device(device, "gg_torch_alloc");
  void *p = NULL;
  if (rc == 0 && size < 0) rc = gg__err(GG_EINVAL, "gg_torch_alloc: size %zd is negative", size);
  if (rc == 0) {
    pthread_rwlock_rdlock(&gg__plug_lock);
    gg_arena_t *a = gg__plug[device];
    int g = gg__graph_alloc(device, a, (size_t)size, stream, &p); /* under a CUDA graph capture */
    if (g != 0)
      rc = g < 0 ? g : 0;
    else if (!a)
      rc = gg__err(GG_ESTATE, "gg_torch_alloc: no arena is registered for device %d (gg_plugin_set_arena)",
                   device);
    else
      rc = gg__arena_alloc_on(a, (size_t)size, stream, &p, &synced);
    pthread_rwlock_unlock(&gg__plug_lock);
  }
  if (rc < 0) {
    if (device >= 0 && device < GG_PLUGIN_MAX_DEVICES)
      atomic_fetch_add(&gg__plug_count[device].failed_allocs, 1);
    fprintf(stderr, "gpuguard: gg_torch_alloc(%zd bytes, device %d) failed: %s\n", size, device,
            gg_last_error());
    return NULL;
  }
  if (synced) atomic_fetch_add_explicit(&gg__plug_count[device].syncs, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&gg__plug_count[device].allocs, 1, memory_order_relaxed);
  gg__trace_line('a', p, size, stream);
  return p;
}

void gg_torch_free(void *ptr, ssize_t size, int device, void *stream) {
  (void)size; /* the arena knows every block's size */
  if (!ptr) return;
  gg__trace_line('f', ptr, 0, stream);
  int synced = 0;
  int rc = gg__plug_device(device, "gg_torch_free");
  if (rc == 0) {
    pthread_rwlock_rdlock(&gg__plug_lock);
    gg_arena_t *a = gg__plug[device];
    int g = gg__graph_free(device, a, ptr, size > 0 ? (size_t)size : 0, stream); /* a graph's block */
    if (g != 0)
      rc = g < 0 ? g : 0;
    else if (!a)
      rc = gg__err(GG_ESTATE,
                   "gg_torch_free: no arena is registered for device %d any more; the block stays with the "
                   "arena that handed it out",
                   device);
    else
      rc = gg__arena_free_on(a, ptr, stream, &synced);
    pthread_rwlock_unlock(&gg__plug_lock);
  }
  if (rc < 0) {
    if (device >= 0 && device < GG_PLUGIN_MAX_DEVICES)
      atomic_fetch_add(&gg__plug_count[device].failed_frees, 1);
    fprintf(stderr, "gpuguard: gg_torch_free(%p, device %d) failed: %s\n", ptr, device, gg_last_error());
    return;
  }
  if (synced) atomic_fetch_add_explicit(&gg__plug_count[device].syncs, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&gg__plug_count[device].frees, 1, memory_order_relaxed);
}
