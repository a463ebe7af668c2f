/* plugin_threads.c — what each thread calling the allocator plugin keeps for itself, so that calls
 * from many threads write no shared cache line: the arena its call uses (instead of a reader-writer
 * lock on the plugin table) and its deltas of the device's counters (instead of shared counters).
 *
 * On an H200 host, 16 threads making alloc+free pairs through the plugin did 0.8 M pairs/s in all,
 * a tenth of one thread's rate: each call took the table's read lock and updated the device's
 * counters, lines every thread writes. Without both, the same 16 threads did 82 M pairs/s.
 *
 * The table: a call announces itself in its thread's `hold` (set until it is done) and then checks
 * that no writer is at work; a writer raises `gg__pt_writing`, waits until no hold is set, stores
 * and lowers the flag (Dekker's pattern, sequentially consistent: either the call sees the flag and
 * steps back until the writer is done, or the writer sees the call and waits for it). Calls wait
 * only while a writer stores, and a writer only for the calls already under way. A thread that
 * cannot get its record (out of host memory) counts itself in `gg__pt_anon` instead.
 *
 * The counters: each thread adds its calls to a delta per device under its own spin lock (taken by
 * others only to read the statistics) and folds the delta into the device's counters every
 * GG__PT_FOLD calls. Its peak estimate is the device's figure at its last fold plus its own delta
 * since: with one thread allocating, peaks are exact; with several, a peak is the highest figure
 * one thread could see (another thread's calls since this one's last fold are not in it: at most
 * GG__PT_FOLD calls of each). Readers fold every thread first, so current, allocated and freed
 * figures are always exact. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "arena/freelist_internal.h"
#include "core/internal.h"
#include "plugin/plugin_threads_internal.h"

#define GG__PT_FOLD 64 /* calls between folds of a thread's delta */
/* Devices a thread keeps deltas for; more count under the device's lock. */
#define GG__PT_DEVICES 4
#define GG__PT_STATS   9 /* bytes, requested, blocks (x3) of all, small, large (+0, +1, +2) */
#define GG__SMALL_MAX  ((size_t)1 << 20) /* PyTorch's small pool: blocks of at most 1 MiB */

typedef struct gg__pt_counts {
  unsigned long long allocs, frees, waits, failed_allocs, failed_frees;
  gg_plugin_stat_t stat[GG__PT_STATS]; /* in a delta: current wraps below 0, peak is the estimate */
} gg__pt_counts_t;

/* A device's figures, under its spin lock. */
typedef struct gg__pt_device {
  _Alignas(64) atomic_int lock;
  gg__pt_counts_t n;
} gg__pt_device_t;

/* A thread's delta of one device's figures since its last fold. */
typedef struct gg__pt_delta {
  int device; /* -1: unused */
  unsigned calls;
  gg__pt_counts_t d;
  unsigned long long base[GG__PT_STATS]; /* the device's current figures at the last fold */
} gg__pt_delta_t;

struct gg__pt {
  _Alignas(64) atomic_bool hold; /* a call of this thread is under way */
  atomic_int lock;               /* its deltas: its thread, and readers of the statistics */
  gg__pt_t *prev, *next;         /* every thread's record (gg__pt_lock) */
  gg__pt_delta_t delta[GG__PT_DEVICES];
};

static pthread_mutex_t gg__pt_lock = PTHREAD_MUTEX_INITIALIZER; /* the list; writers of the table */
static gg__pt_t *gg__pt_all;
static atomic_uint gg__pt_anon; /* calls under way of threads without a record */
static atomic_bool
    gg__pt_writing; /* a writer waits for the calls under way; new ones wait for it */
static _Thread_local gg__pt_t *gg__pt_mine __attribute__((tls_model("initial-exec")));
static pthread_key_t
    gg__pt_key; /* its destructor folds and frees the record when the thread exits */
static pthread_once_t gg__pt_once = PTHREAD_ONCE_INIT;
static gg__pt_device_t gg__pt_dev[GG_PLUGIN_MAX_DEVICES];

/* ---- counting -------------------------------------------------------------------------------- */

/* Both locked: moves a delta into its device's figures and starts the next one from them. */
static void gg__pt_fold(gg__pt_device_t *g, gg__pt_delta_t *dl) {
  gg__pt_counts_t *n = &g->n, *d = &dl->d;
  n->allocs += d->allocs;
  n->frees += d->frees;
  n->waits += d->waits;
  n->failed_allocs += d->failed_allocs;
  n->failed_frees += d->failed_frees;
  for (int k = 0; k < GG__PT_STATS; k++) {
    gg_plugin_stat_t *s = &n->stat[k];
    s->current += d->stat[k].current;
    s->allocated += d->stat[k].allocated;
    s->freed += d->stat[k].freed;
    if (d->stat[k].peak > s->peak) s->peak = d->stat[k].peak;
    if (s->current > s->peak) s->peak = s->current;
  }
  memset(d, 0, sizeof *d);
  for (int k = 0; k < GG__PT_STATS; k++) dl->base[k] = n->stat[k].current;
  dl->calls = 0;
}

static inline void gg__pt_up(gg__pt_delta_t *dl, int k, unsigned long long n) {
  gg_plugin_stat_t *s = &dl->d.stat[k];
  s->current += n;
  s->allocated += n;
  if (dl->base[k] + s->current > s->peak) s->peak = dl->base[k] + s->current;
}

static inline void gg__pt_down(gg__pt_delta_t *dl, int k, unsigned long long n) {
  gg_plugin_stat_t *s = &dl->d.stat[k];
  s->current -= n;
  s->freed += n;
}

/* One call into a delta (its owner's lock, or a stand-alone delta). */
static void gg__pt_add(gg__pt_delta_t *dl, int rc, bool add, size_t size, bool joined) {
  gg__pt_counts_t *d = &dl->d;
  if (rc < 0) {
    add ? d->failed_allocs++ : d->failed_frees++;
    return;
  }
  add ? d->allocs++ : d->frees++;
  d->waits += joined; /* streams ordered on the device (n_stream_waits) */
  if (!size) return;
  /* What PyTorch's statistics count for one block: its bytes (rounded as the arena rounds), the
   * bytes asked for and the block itself, in "all" and in its size class. */
  unsigned long long bytes = (size + GG__QUANTUM - 1) & ~(unsigned long long)(GG__QUANTUM - 1);
  int c = size <= GG__SMALL_MAX ? GG_PLUGIN_SMALL : GG_PLUGIN_LARGE;
  const unsigned long long v[3] = {bytes, size, 1}; /* at 3 * g: "all", then 3 * g + c */
  for (int g = 0; g < 3; g++) {
    if (add) {
      gg__pt_up(dl, 3 * g, v[g]);
      gg__pt_up(dl, 3 * g + c, v[g]);
    } else {
      gg__pt_down(dl, 3 * g, v[g]);
      gg__pt_down(dl, 3 * g + c, v[g]);
    }
  }
}

static gg__pt_device_t *gg__pt_device_lock(int device) {
  gg__spin_lock(&gg__pt_dev[device].lock);
  return &gg__pt_dev[device];
}

/* This thread's delta for device (claimed on first use), its record locked; NULL (unlocked) if
 * none. */
static gg__pt_delta_t *gg__pt_delta_lock(gg__pt_t *me, int device) {
  gg__spin_lock(&me->lock);
  if (GG__LIKELY(me->delta[0].device == device)) return &me->delta[0]; /* a thread's first device */
  for (int i = 1; i < GG__PT_DEVICES; i++)
    if (me->delta[i].device == device) return &me->delta[i];
  for (int i = 0; i < GG__PT_DEVICES; i++)
    if (me->delta[i].device < 0) {
      gg__pt_delta_t *dl = &me->delta[i];
      gg__pt_device_t *g = gg__pt_device_lock(device);
      dl->device = device;
      gg__pt_fold(g, dl); /* empty: takes the device's figures as its base */
      gg__spin_unlock(&g->lock);
      return dl;
    }
  gg__spin_unlock(&me->lock);
  return NULL;
}

void gg__pt_count(gg__pt_t *me, int device, int rc, bool add, size_t size, bool joined) {
  gg__pt_delta_t *dl = me ? gg__pt_delta_lock(me, device) : NULL;
  if (GG__LIKELY(dl != NULL)) {
    gg__pt_add(dl, rc, add, size, joined);
    if (++dl->calls >= GG__PT_FOLD) {
      gg__pt_device_t *g = gg__pt_device_lock(device);
      gg__pt_fold(g, dl);
      gg__spin_unlock(&g->lock);
    }
    gg__spin_unlock(&me->lock);
    return;
  }
  gg__pt_device_t *g = gg__pt_device_lock(device); /* no record, or more devices than it holds */
  gg__pt_delta_t one = {.device = device};
  for (int k = 0; k < GG__PT_STATS; k++) one.base[k] = g->n.stat[k].current;
  gg__pt_add(&one, rc, add, size, joined);
  gg__pt_fold(g, &one);
  gg__spin_unlock(&g->lock);
}

/* The list locked: folds the device's delta of every thread (device < 0: every device of `only`).
 * */
static void gg__pt_fold_every(int device, gg__pt_t *only) {
  for (gg__pt_t *pt = only ? only : gg__pt_all; pt; pt = only ? NULL : pt->next) {
    gg__spin_lock(&pt->lock);
    for (int i = 0; i < GG__PT_DEVICES; i++) {
      gg__pt_delta_t *dl = &pt->delta[i];
      if (dl->device < 0 || (device >= 0 && dl->device != device)) continue;
      gg__pt_device_t *g = gg__pt_device_lock(dl->device);
      gg__pt_fold(g, dl);
      gg__spin_unlock(&g->lock);
    }
    gg__spin_unlock(&pt->lock);
  }
}

void gg__pt_read(int device, gg_plugin_stats_t *out) {
  pthread_mutex_lock(&gg__pt_lock);
  gg__pt_fold_every(device, NULL);
  gg__pt_device_t *g = gg__pt_device_lock(device);
  gg__pt_counts_t *n = &g->n;
  out->n_allocs = n->allocs;
  out->n_frees = n->frees;
  out->n_stream_waits = n->waits;
  out->n_failed_allocs = n->failed_allocs;
  out->n_failed_frees = n->failed_frees;
  for (int c = 0; c < 3; c++) {
    out->bytes[c] = n->stat[c];
    out->requested[c] = n->stat[3 + c];
    out->blocks[c] = n->stat[6 + c];
  }
  gg__spin_unlock(&g->lock);
  pthread_mutex_unlock(&gg__pt_lock);
}

void gg__pt_reset(int device, bool peaks, bool totals) {
  pthread_mutex_lock(&gg__pt_lock);
  gg__pt_fold_every(device, NULL);
  gg__pt_device_t *g = gg__pt_device_lock(device);
  for (int k = 0; k < GG__PT_STATS; k++) {
    gg_plugin_stat_t *s = &g->n.stat[k];
    if (peaks) s->peak = s->current;
    if (totals) s->allocated = s->freed = 0;
  }
  gg__spin_unlock(
      &g->lock); /* the deltas, folded, start from these figures: current did not move */
  pthread_mutex_unlock(&gg__pt_lock);
}

/* ---- a thread's record ----------------------------------------------------------------------- */

static void gg__pt_unlink(gg__pt_t *pt) {
  if (pt->prev)
    pt->prev->next = pt->next;
  else
    gg__pt_all = pt->next;
  if (pt->next) pt->next->prev = pt->prev;
}

static void gg__pt_exit(void *arg) {
  gg__pt_t *pt = arg;
  pthread_mutex_lock(&gg__pt_lock);
  gg__pt_fold_every(-1, pt);
  gg__pt_unlink(pt);
  pthread_mutex_unlock(&gg__pt_lock);
  if (gg__pt_mine == pt) gg__pt_mine = NULL;
  free(pt);
}

static void gg__pt_key_init(void) { pthread_key_create(&gg__pt_key, gg__pt_exit); }

/* This thread's record, made at its first call; NULL without host memory. */
static gg__pt_t *gg__pt_self(void) {
  gg__pt_t *pt = gg__pt_mine;
  if (GG__LIKELY(pt != NULL)) return pt;
  pthread_once(&gg__pt_once, gg__pt_key_init);
  pt = calloc(1, sizeof *pt);
  if (!pt) return NULL;
  for (int i = 0; i < GG__PT_DEVICES; i++) pt->delta[i].device = -1;
  if (pthread_setspecific(gg__pt_key, pt) != 0) {
    free(pt);
    return NULL;
  }
  pthread_mutex_lock(&gg__pt_lock);
  pt->next = gg__pt_all;
  if (gg__pt_all) gg__pt_all->prev = pt;
  gg__pt_all = pt;
  pthread_mutex_unlock(&gg__pt_lock);
  return gg__pt_mine = pt;
}

/* ---- the table's readers and writers --------------------------------------------------------- */

/* Waits while a writer changes the table (a short store, once the calls under way ended). */
static void gg__pt_await_writer(void) {
  while (atomic_load(&gg__pt_writing)) sched_yield();
}

gg_arena_t *gg__pt_enter(_Atomic(gg_arena_t *) *slot, gg__pt_t **me) {
  gg__pt_t *pt = *me = gg__pt_self();
  for (;;) {
    if (GG__LIKELY(pt != NULL))
      atomic_store(&pt->hold, true); /* before the flag: a writer that raised it first is seen */
    else
      atomic_fetch_add(&gg__pt_anon, 1);
    if (GG__LIKELY(!atomic_load(&gg__pt_writing))) break;
    gg__pt_leave(pt);
    gg__pt_await_writer();
  }
  return atomic_load(slot);
}

void gg__pt_leave(gg__pt_t *me) {
  if (GG__LIKELY(me != NULL))
    atomic_store_explicit(&me->hold, false, memory_order_release);
  else
    atomic_fetch_sub_explicit(&gg__pt_anon, 1, memory_order_release);
}

/* Waits until no call is under way, while new calls wait until gg__pt_exclude_end(): what is
 * written meanwhile is seen whole by every later call, as under a reader-writer lock (the graph
 * state binds to the arena a call read, and two calls with different arenas would rebind it under
 * each other). */
static void gg__pt_exclude_begin(void) {
  pthread_mutex_lock(&gg__pt_lock);
  atomic_store(&gg__pt_writing, true);
  for (gg__pt_t *pt = gg__pt_all; pt; pt = pt->next)
    while (atomic_load(&pt->hold)) sched_yield();
  while (atomic_load(&gg__pt_anon)) sched_yield();
}

static void gg__pt_exclude_end(void) {
  atomic_store(&gg__pt_writing, false);
  pthread_mutex_unlock(&gg__pt_lock);
}

void gg__pt_quiesce(void) {
  gg__pt_exclude_begin();
  gg__pt_exclude_end();
}

void gg__pt_publish(_Atomic(gg_arena_t *) *slot, gg_arena_t *arena) {
  gg__pt_exclude_begin();
  atomic_store(slot, arena);
  gg__pt_exclude_end();
}

void gg__pt_retract(_Atomic(gg_arena_t *) *slot, gg_arena_t *arena) {
  gg__pt_exclude_begin();
  atomic_compare_exchange_strong(slot, &arena, NULL);
  gg__pt_exclude_end();
}

/* ---- fork ------------------------------------------------------------------------------------ */

void gg__pt_fork_prepare(void) { pthread_mutex_lock(&gg__pt_lock); }

void gg__pt_fork_parent(void) { pthread_mutex_unlock(&gg__pt_lock); }

/* Only the forking thread exists in the child: the others' records go (their calls under way, and
 * what they had not folded, were the parent's), and every spin lock starts free; the list's lock is
 * this thread's own from prepare, unlocked as in the parent. */
void gg__pt_fork_child(void) {
  for (gg__pt_t *pt = gg__pt_all, *next; pt; pt = next) {
    next = pt->next;
    if (pt != gg__pt_mine) free(pt);
  }
  gg__pt_all = gg__pt_mine;
  if (gg__pt_mine) {
    gg__pt_mine->prev = gg__pt_mine->next = NULL;
    atomic_store(&gg__pt_mine->lock, 0);
    atomic_store(&gg__pt_mine->hold, false);
  }
  atomic_store(&gg__pt_anon, 0);
  atomic_store(&gg__pt_writing, false);
  for (int i = 0; i < GG_PLUGIN_MAX_DEVICES; i++) atomic_store(&gg__pt_dev[i].lock, 0);
  pthread_mutex_unlock(&gg__pt_lock); /* this thread took it in prepare */
}
