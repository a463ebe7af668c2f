/* host_stream.c — the host backend's simulated streams, events, waits between streams and
 * CUDA-graph capture: work "queued" on a stream completes when a waiter catches it up
 * (GPUGUARD_HOST_BUSY keeps every stream busy), and a capture refuses what a real one refuses. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/host/host_impl.h"
#include "core/internal.h"
#include "gpuguard/host.h"

/* ---- simulated streams and events ------------------------------------------------------------ */

typedef struct gg__hstream gg__hstream_t;

/* What work queued on a stream, or an event, waits for besides its own stream: the held streams'
 * work that a stream_wait (cuStreamWaitEvent) named, as (stream, ticket) pairs, resolved once that
 * stream's completion reaches the ticket. Read without the lock only for `n` (0: nothing to wait
 * for). */
#define GG__HDEPS 8
typedef struct gg__hdeps {
  atomic_int n;
  struct {
    gg__hstream_t *on; /* a reference */
    unsigned long long ticket;
  } d[GG__HDEPS];
} gg__hdeps_t;

struct gg__hstream {
  atomic_int refs;
  atomic_bool held;
  _Atomic unsigned long long submitted, completed;
  gg__hdeps_t deps;              /* waits queued on it */
  struct gg__hstream *next_live; /* in gg__hlive's bucket while the handle is valid */
};

/* The handles gg_host_stream_create() gave and nobody destroyed yet. A stream handle is read only
 * once found here: code written for CUDA hands the host backend CUstreams, cudaStreamPerThread
 * (0x2) or stale handles after an automatic fallback, and reading one of those as a host stream
 * crashed the process. */
#define GG__HLIVE_BUCKETS 64
static struct {
  pthread_mutex_t lock;
  gg__hstream_t *bucket[GG__HLIVE_BUCKETS];
} gg__hlive = {.lock = PTHREAD_MUTEX_INITIALIZER};

static gg__hstream_t **gg__hlive_slot(const void *stream) {
  uintptr_t h = (uintptr_t)stream >> 4; /* calloc'd: the low bits are alignment */
  gg__hstream_t **pp = &gg__hlive.bucket[(h ^ (h >> 6)) % GG__HLIVE_BUCKETS];
  while (*pp && *pp != stream) pp = &(*pp)->next_live;
  return pp;
}

/* CUDA's special handles. Both name a default stream, and on the simulated device work on a default
 * stream is complete at once, so both behave as NULL does, except that the per-thread stream is not
 * the legacy stream for captures (as in CUDA: it can be captured, and touching it does not break
 * others). */
#define GG__HSTREAM_LEGACY     ((void *)(uintptr_t)0x1)
#define GG__HSTREAM_PER_THREAD ((void *)(uintptr_t)0x2)

/* Resolves a stream handle for `op`: *s becomes the live simulated stream, or NULL for a default
 * stream (NULL, 0x1, 0x2); *key the value captures compare (NULL for the legacy stream). With
 * `ref`, *s gets a reference under the lock, so a concurrent destroy cannot free it under the
 * caller. Anything else is refused with GG_EINVAL and never dereferenced. */
static int gg__hstream_get(void *stream, const char *op, bool ref, gg__hstream_t **s,
                           const void **key) {
  *s = NULL;
  if (key) *key = stream == GG__HSTREAM_LEGACY ? NULL : stream;
  if (!stream || stream == GG__HSTREAM_LEGACY || stream == GG__HSTREAM_PER_THREAD) return 0;
  pthread_mutex_lock(&gg__hlive.lock);
  gg__hstream_t *found = *gg__hlive_slot(stream);
  if (found && ref) atomic_fetch_add(&found->refs, 1);
  pthread_mutex_unlock(&gg__hlive.lock);
  if (!found)
    return gg__err(
        GG_EINVAL,
        "%s: stream %p is not a stream of the host backend (one made by gg_host_stream_create() "
        "and not destroyed, NULL, cudaStreamLegacy 0x1 or cudaStreamPerThread 0x2); a CUDA "
        "stream cannot be used with the host backend",
        op, stream);
  *s = found;
  return 0;
}

/* GPUGUARD_HOST_BUSY: the device never catches up by itself; work recorded so far completes only
 * when somebody waits (a stream or event sync). */
static _Atomic unsigned long long gg__busy_submitted, gg__busy_completed;

typedef struct gg__hevent {
  gg__hstream_t *stream; /* NULL: complete */
  gg__hdeps_t deps;      /* the waits queued on its stream before it was recorded */
  const void
      *rec_key; /* the stream it was last recorded on, compared only (captures), never read */
  bool recorded;
  unsigned long long ticket;
  unsigned long long
      busy_ticket; /* GPUGUARD_HOST_BUSY: complete once gg__busy_completed reaches it */
} gg__hevent_t;

/* ---- simulated CUDA graph capture
 * ---------------------------------------------------------------- As in CUDA's global capture
 * mode: while a stream captures, recording or waiting on it (events included) invalidates its
 * capture, and so does any such operation on the legacy (NULL) stream while any capture is
 * underway. An invalidated capture still runs until gg_host_stream_capture_end(), which then fails
 * naming the first offending operation. Objects retained by a capture are released (their callbacks
 * run) when its graph is destroyed, or at the end of an invalidated capture. */

typedef struct gg__hretain {
  void (*destroy)(void *user);
  void *user;
} gg__hretain_t;

typedef struct gg__hcapture {
  const void *stream; /* the capturing stream, compared only */
  unsigned long long id;
  char invalidated[192]; /* the first operation that invalidated it; "" while valid */
  gg__hretain_t *retained;
  size_t nretained, capretained;
  struct gg__hcapture *next;
} gg__hcapture_t;

static struct {
  pthread_mutex_t lock;
  gg__hcapture_t *capturing; /* captures underway */
  gg__hcapture_t *graphs;    /* ended captures whose graph lives */
  unsigned long long last_id;
} gg__hcap = {.lock = PTHREAD_MUTEX_INITIALIZER};
static atomic_int gg__hcap_underway; /* read without the lock on every stream operation */

static gg__hcapture_t **gg__hcap_find(gg__hcapture_t **list, const void *stream) {
  while (*list && (*list)->stream != stream) list = &(*list)->next;
  return list;
}

/* An operation on `stream` (event_record, event_query, ...): invalidates the capture(s) it breaks
 * and fails as the driver does; 0 when no capture is affected. */
static int gg__hcap_touch(const void *stream, const char *op) {
  if (GG__LIKELY(atomic_load(&gg__hcap_underway) == 0)) return 0;
  int hit = 0;
  pthread_mutex_lock(&gg__hcap.lock);
  for (gg__hcapture_t *c = gg__hcap.capturing; c; c = c->next) {
    if (stream && c->stream != stream) continue;
    if (!c->invalidated[0])
      snprintf(c->invalidated, sizeof c->invalidated, "%s on %s", op,
               stream ? "the capturing stream" : "the legacy default stream while it captured");
    hit++;
  }
  pthread_mutex_unlock(&gg__hcap.lock);
  if (!hit) return 0;
  return gg__err(GG_EDRIVER,
                 "host backend: %s on %s during a stream capture invalidates the capture", op,
                 stream ? "the capturing stream" : "the legacy default stream");
}

static void gg__hcap_release(gg__hcapture_t *c) {
  for (size_t i = 0; i < c->nretained; i++) c->retained[i].destroy(c->retained[i].user);
  free(c->retained);
  free(c);
}

int gg_host_stream_capture_begin(void *stream) {
  if (!stream || stream == GG__HSTREAM_LEGACY)
    return gg__err(
        GG_EINVAL,
        "gg_host_stream_capture_begin: the legacy default stream (%p) cannot be captured", stream);
  gg__hstream_t *s = NULL;
  int rc = gg__hstream_get(stream, "gg_host_stream_capture_begin", false, &s, NULL);
  if (rc < 0) return rc;
  gg__hcapture_t *c = calloc(1, sizeof *c);
  if (!c) return gg__err(GG_ENOMEM, "gg_host_stream_capture_begin: out of host memory");
  pthread_mutex_lock(&gg__hcap.lock);
  if (*gg__hcap_find(&gg__hcap.capturing, stream)) {
    pthread_mutex_unlock(&gg__hcap.lock);
    free(c);
    return gg__err(GG_ESTATE, "gg_host_stream_capture_begin: the stream is capturing already");
  }
  c->stream = stream;
  c->id = ++gg__hcap.last_id;
  c->next = gg__hcap.capturing; /* owned by the list until capture_end */
  gg__hcap.capturing = c;
  atomic_fetch_add(&gg__hcap_underway, 1);
  pthread_mutex_unlock(&gg__hcap.lock);
  return 0;
}

int gg_host_stream_capture_end(void *stream, unsigned long long *graph_id) {
  if (graph_id) *graph_id = 0;
  pthread_mutex_lock(&gg__hcap.lock);
  gg__hcapture_t **pp = gg__hcap_find(&gg__hcap.capturing, stream), *c = *pp;
  if (c) {
    *pp = c->next;
    atomic_fetch_sub(&gg__hcap_underway, 1);
    if (!c->invalidated[0]) {
      c->next = gg__hcap.graphs;
      gg__hcap.graphs = c;
    }
  }
  pthread_mutex_unlock(&gg__hcap.lock);
  if (!c) return gg__err(GG_ESTATE, "gg_host_stream_capture_end: the stream is not capturing");
  if (c->invalidated[0]) {
    /* As cuStreamEndCapture: no graph comes out, and what the capture retained is released. */
    int rc = gg__err(GG_ESTATE, "gg_host_stream_capture_end: capture %llu was invalidated by %s",
                     c->id, c->invalidated);
    gg__hcap_release(c);
    return rc;
  }
  if (graph_id) *graph_id = c->id;
  return 0;
}

int gg_host_graph_destroy(unsigned long long graph_id) {
  pthread_mutex_lock(&gg__hcap.lock);
  gg__hcapture_t **pp = &gg__hcap.graphs;
  while (*pp && (*pp)->id != graph_id) pp = &(*pp)->next;
  gg__hcapture_t *c = *pp;
  if (c) *pp = c->next;
  pthread_mutex_unlock(&gg__hcap.lock);
  if (!c) return gg__err(GG_EINVAL, "gg_host_graph_destroy: no live graph has id %llu", graph_id);
  gg__hcap_release(c); /* outside the lock: callbacks may call into the library */
  return 0;
}

int gg__h_stream_capture(gg__dev_t *d, void *stream, unsigned long long *capture_id) {
  (void)d;
  *capture_id = 0;
  int rc = gg__op(GG__OP_stream_capture);
  gg__hstream_t *s = NULL;
  if (rc == 0) rc = gg__hstream_get(stream, "host backend: stream_capture", false, &s, NULL);
  if (rc < 0) return rc;
  if (stream == GG__HSTREAM_LEGACY) stream = NULL;
  if (atomic_load(&gg__hcap_underway) == 0) return rc;
  pthread_mutex_lock(&gg__hcap.lock);
  if (!stream) {
    rc = gg__hcap.capturing != NULL; /* the legacy stream while some stream captures */
  } else {
    gg__hcapture_t *c = *gg__hcap_find(&gg__hcap.capturing, stream);
    if (c) *capture_id = c->id;
  }
  pthread_mutex_unlock(&gg__hcap.lock);
  return rc;
}

int gg__h_graph_retain(gg__dev_t *d, void *stream, void (*destroy)(void *user), void *user) {
  (void)d;
  int rc = gg__op(GG__OP_graph_retain);
  if (rc < 0) return rc;
  pthread_mutex_lock(&gg__hcap.lock);
  gg__hcapture_t *c = stream ? *gg__hcap_find(&gg__hcap.capturing, stream) : NULL;
  if (!c) {
    rc = gg__err(GG_ESTATE, "host backend: graph_retain: the stream is not capturing");
  } else {
    if (c->nretained == c->capretained) {
      size_t cap = c->capretained ? 2 * c->capretained : 4;
      gg__hretain_t *r = realloc(c->retained, cap * sizeof *r);
      if (r) {
        c->retained = r;
        c->capretained = cap;
      }
    }
    if (c->nretained < c->capretained)
      c->retained[c->nretained++] = (gg__hretain_t){destroy, user};
    else
      rc = gg__err(GG_ENOMEM, "host backend: graph_retain: out of host memory");
  }
  pthread_mutex_unlock(&gg__hcap.lock);
  return rc;
}

static void gg__busy_catch_up(void) {
  atomic_store(&gg__busy_completed, atomic_load(&gg__busy_submitted));
}

static void gg__hdeps_clear(gg__hdeps_t *ds);

static void gg__hstream_unref(gg__hstream_t *s) {
  if (s && atomic_fetch_sub(&s->refs, 1) == 1) {
    gg__hdeps_clear(&s->deps);
    free(s);
  }
}

/* ---- waits between streams (stream_wait) ----------------------------------------------------- */

static pthread_mutex_t gg__hdeps_lock = PTHREAD_MUTEX_INITIALIZER;
static gg__hdeps_t
    gg__hdefault_deps; /* the default streams' (one set: they are never held themselves) */

static gg__hdeps_t *gg__hdeps_of(gg__hstream_t *s) { return s ? &s->deps : &gg__hdefault_deps; }

/* Drops what is resolved (lock held); the references to drop go to out[], returned count. */
static int gg__hdeps_prune_locked(gg__hdeps_t *ds, gg__hstream_t **out) {
  int n = atomic_load(&ds->n), k = 0, dropped = 0;
  for (int i = 0; i < n; i++) {
    if (atomic_load(&ds->d[i].on->completed) >= ds->d[i].ticket)
      out[dropped++] = ds->d[i].on;
    else
      ds->d[k++] = ds->d[i];
  }
  atomic_store(&ds->n, k);
  return dropped;
}

static void gg__hunref_all(gg__hstream_t **s, int n) {
  for (int i = 0; i < n; i++) gg__hstream_unref(s[i]);
}

/* Whether some wait of the set is still pending. */
static bool gg__hdeps_pending(gg__hdeps_t *ds) {
  if (!atomic_load(&ds->n)) return false;
  gg__hstream_t *drop[GG__HDEPS];
  pthread_mutex_lock(&gg__hdeps_lock);
  int dropped = gg__hdeps_prune_locked(ds, drop);
  bool pending = atomic_load(&ds->n) != 0;
  pthread_mutex_unlock(&gg__hdeps_lock);
  gg__hunref_all(drop, dropped);
  return pending;
}

static void gg__hdeps_clear(gg__hdeps_t *ds) {
  if (!atomic_load(&ds->n)) return;
  gg__hstream_t *drop[GG__HDEPS];
  pthread_mutex_lock(&gg__hdeps_lock);
  int n = atomic_load(&ds->n);
  for (int i = 0; i < n; i++) drop[i] = ds->d[i].on;
  atomic_store(&ds->n, 0);
  pthread_mutex_unlock(&gg__hdeps_lock);
  gg__hunref_all(drop, n);
}

/* Adds (on, ticket) to a set, lock held: one entry per stream, the later ticket kept. */
static int gg__hdeps_add_locked(gg__hdeps_t *ds, gg__hstream_t *on, unsigned long long ticket) {
  int n = atomic_load(&ds->n);
  for (int i = 0; i < n; i++)
    if (ds->d[i].on == on) {
      if (ticket > ds->d[i].ticket) ds->d[i].ticket = ticket;
      return 0;
    }
  if (n == GG__HDEPS)
    return gg__err(
        GG_ENOMEM,
        "host backend: stream_wait: a stream may wait for at most %d held streams at once",
        GG__HDEPS);
  atomic_fetch_add(&on->refs, 1);
  ds->d[n].on = on;
  ds->d[n].ticket = ticket;
  atomic_store(&ds->n, n + 1);
  return 0;
}

/* Adds every pending wait of src to dst (an event takes its stream's; a stream an event's). */
static int gg__hdeps_copy(gg__hdeps_t *dst, gg__hdeps_t *src) {
  if (!gg__hdeps_pending(src)) return 0;
  int rc = 0;
  pthread_mutex_lock(&gg__hdeps_lock);
  int n = atomic_load(&src->n);
  for (int i = 0; i < n && rc == 0; i++)
    rc = gg__hdeps_add_locked(dst, src->d[i].on, src->d[i].ticket);
  pthread_mutex_unlock(&gg__hdeps_lock);
  return rc;
}

int gg_host_stream_create(void **stream) {
  if (!stream) return gg__err(GG_EINVAL, "gg_host_stream_create: stream is NULL");
  gg__hstream_t *s = calloc(1, sizeof *s);
  if (!s) return gg__err(GG_ENOMEM, "gg_host_stream_create: out of host memory");
  atomic_init(&s->refs, 1);
  pthread_mutex_lock(&gg__hlive.lock);
  gg__hstream_t **slot = gg__hlive_slot(s);
  *slot = s; /* the end of its bucket: a fresh allocation is never in the set */
  pthread_mutex_unlock(&gg__hlive.lock);
  *stream = s;
  return 0;
}

/* A live stream made by gg_host_stream_create(); the default streams have nothing to hold. */
static int gg__hstream_own(void *stream, const char *op, gg__hstream_t **s) {
  if (!stream)
    return gg__err(GG_EINVAL, "%s: stream is NULL (a default stream has nothing to hold)", op);
  int rc = gg__hstream_get(stream, op, false, s, NULL);
  if (rc == 0 && !*s)
    rc = gg__err(GG_EINVAL,
                 "%s: stream %p is a default stream; pass one made by gg_host_stream_create()", op,
                 stream);
  return rc;
}

int gg_host_stream_hold(void *stream) {
  gg__hstream_t *s = NULL;
  int rc = gg__hstream_own(stream, "gg_host_stream_hold", &s);
  if (rc == 0) atomic_store(&s->held, true);
  return rc;
}

int gg_host_stream_release(void *stream) {
  gg__hstream_t *s = NULL;
  int rc = gg__hstream_own(stream, "gg_host_stream_release", &s);
  if (rc < 0) return rc;
  atomic_store(&s->held, false);
  atomic_store(&s->completed, atomic_load(&s->submitted));
  return 0;
}

int gg_host_stream_destroy(void *stream) {
  if (!stream) return 0;
  pthread_mutex_lock(&gg__hlive.lock);
  gg__hstream_t **slot = gg__hlive_slot(stream), *s = *slot;
  if (s) *slot = s->next_live; /* invalid from now on; events recorded on it keep it in memory */
  pthread_mutex_unlock(&gg__hlive.lock);
  if (!s)
    return gg__err(
        GG_EINVAL,
        "gg_host_stream_destroy: %p is not a live stream made by gg_host_stream_create()", stream);
  gg__hstream_unref(s);
  return 0;
}

int gg__h_event_create(gg__dev_t *d, void **ev) {
  (void)d;
  int rc = gg__op(GG__OP_event_create);
  if (rc < 0) return rc;
  gg__hevent_t *e = calloc(1, sizeof *e);
  if (!e) return gg__err(GG_ENOMEM, "host backend: event_create: out of host memory");
  *ev = e;
  return 0;
}

int gg__h_event_record(gg__dev_t *d, void *ev, void *stream) {
  (void)d;
  int rc = gg__op(GG__OP_event_record);
  gg__hstream_t *s = NULL;
  const void *key = NULL;
  if (rc == 0) rc = gg__hstream_get(stream, "host backend: event_record", true, &s, &key);
  if (rc < 0) return rc;
  rc = gg__hcap_touch(key, "event_record");
  if (rc < 0) {
    gg__hstream_unref(s);
    return rc;
  }
  gg__hevent_t *e = ev;
  e->rec_key = key;
  e->recorded = true;
  gg__hstream_unref(e->stream);
  e->stream = NULL;
  gg__hdeps_clear(&e->deps);
  /* Completes only after the waits queued on its stream before it (stream_wait). */
  rc = gg__hdeps_copy(&e->deps, gg__hdeps_of(s));
  if (rc < 0) {
    gg__hstream_unref(s);
    return rc;
  }
  e->busy_ticket = gg__host.busy ? atomic_fetch_add(&gg__busy_submitted, 1) + 1 : 0;
  if (s && atomic_load(&s->held)) {
    e->stream = s; /* keeps the reference taken above */
    e->ticket = atomic_fetch_add(&s->submitted, 1) + 1;
  } else {
    gg__hstream_unref(s);
  }
  return 0;
}

int gg__h_event_query(gg__dev_t *d, void *ev) {
  (void)d;
  int rc = gg__op(GG__OP_event_query);
  gg__hevent_t *e = ev;
  if (rc == 0 && e->recorded) rc = gg__hcap_touch(e->rec_key, "event_query");
  if (rc < 0) return rc;
  if (e->busy_ticket > atomic_load(&gg__busy_completed)) return 0;
  return (!e->stream || atomic_load(&e->stream->completed) >= e->ticket) &&
         !gg__hdeps_pending(&e->deps);
}

int gg__h_event_sync(gg__dev_t *d, void *ev) {
  (void)d;
  int rc = gg__op(GG__OP_event_sync);
  gg__hevent_t *e = ev;
  if (rc == 0 && e->recorded) rc = gg__hcap_touch(e->rec_key, "event_sync");
  if (rc < 0) return rc;
  if ((e->stream && atomic_load(&e->stream->completed) < e->ticket) || gg__hdeps_pending(&e->deps))
    return gg__err(GG_ETIMEDOUT,
                   "host backend: waiting on an event of a held stream would never return; "
                   "release the stream first");
  gg__busy_catch_up();
  return 0;
}

int gg__h_event_destroy(gg__dev_t *d, void *ev) {
  (void)d;
  int rc = gg__op(GG__OP_event_destroy);
  gg__hevent_t *e = ev;
  if (e) {
    gg__hstream_unref(e->stream);
    gg__hdeps_clear(&e->deps);
  }
  free(
      e); /* freed even when a fault is injected: a real destroy failure does not leak the handle */
  return rc;
}

int gg__h_stream_sync(gg__dev_t *d, void *stream) {
  (void)d;
  int rc = gg__op(GG__OP_stream_sync);
  gg__hstream_t *s = NULL;
  const void *key = NULL;
  if (rc == 0) rc = gg__hstream_get(stream, "host backend: stream_sync", false, &s, &key);
  if (rc == 0) rc = gg__hcap_touch(key, "stream_sync");
  if (rc < 0) return rc;
  /* A held stream stands for one with a kernel still running: waiting for it (or for a stream that
   * waits for it) would never return. */
  if ((s && (atomic_load(&s->held) || atomic_load(&s->completed) < atomic_load(&s->submitted))) ||
      gg__hdeps_pending(gg__hdeps_of(s)))
    return gg__err(GG_ETIMEDOUT,
                   "host backend: stream is held with pending work; release it first");
  gg__busy_catch_up(); /* GPUGUARD_HOST_BUSY: the queued work is done once waited for */
  return 0;
}

/* Is some live stream busy (held, or with work recorded and not yet completed)? */
static bool gg__hlive_busy(void) {
  bool busy = false;
  pthread_mutex_lock(&gg__hlive.lock);
  for (int b = 0; b < GG__HLIVE_BUCKETS && !busy; b++)
    for (const gg__hstream_t *s = gg__hlive.bucket[b]; s && !busy; s = s->next_live)
      busy = atomic_load(&s->held) || atomic_load(&s->completed) < atomic_load(&s->submitted);
  pthread_mutex_unlock(&gg__hlive.lock);
  return busy;
}

/* cuCtxSynchronize: every stream of the simulated device. A held stream stands for a kernel still
 * running: it is waited for until released, up to the limit. */
int gg__h_ctx_sync(gg__dev_t *d, int timeout_ms) {
  (void)d;
  int rc = gg__op(GG__OP_ctx_sync);
  if (rc == 0) rc = gg__hcap_touch(NULL, "ctx_sync");
  if (rc < 0) return rc;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (gg__hlive_busy()) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long ms =
        (long long)(now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
    if (timeout_ms >= 0 && ms >= timeout_ms)
      return gg__err(GG_ETIMEDOUT, "host backend: ctx_sync: a stream still has work after %d ms",
                     timeout_ms);
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  gg__busy_catch_up();
  return 0;
}

int gg__h_stream_query(gg__dev_t *d, void *stream) {
  (void)d;
  int rc = gg__op(GG__OP_stream_query);
  gg__hstream_t *s = NULL;
  const void *key = NULL;
  if (rc == 0) rc = gg__hstream_get(stream, "host backend: stream_query", false, &s, &key);
  if (rc == 0) rc = gg__hcap_touch(key, "stream_query");
  if (rc < 0) return rc;
  /* A held stream stands for one with a kernel still running: it is busy whatever was recorded. */
  if (gg__host.busy) return 0;
  return (!s ||
          (!atomic_load(&s->held) && atomic_load(&s->completed) >= atomic_load(&s->submitted))) &&
         !gg__hdeps_pending(gg__hdeps_of(s));
}

/* cuStreamWaitEvent: work queued on `stream` from now on runs after what the event covers. */
int gg__h_stream_wait(gg__dev_t *d, void *stream, void *ev) {
  (void)d;
  int rc = gg__op(GG__OP_stream_wait);
  gg__hstream_t *s = NULL;
  const void *key = NULL;
  gg__hevent_t *e = ev;
  if (rc == 0) rc = gg__hstream_get(stream, "host backend: stream_wait", true, &s, &key);
  if (rc < 0) return rc;
  rc = gg__hcap_touch(key, "stream_wait");
  if (rc == 0 && e->recorded) rc = gg__hcap_touch(e->rec_key, "stream_wait");
  if (rc == 0) rc = gg__hdeps_copy(gg__hdeps_of(s), &e->deps);
  if (rc == 0 && e->stream && atomic_load(&e->stream->completed) < e->ticket) {
    pthread_mutex_lock(&gg__hdeps_lock);
    rc = gg__hdeps_add_locked(gg__hdeps_of(s), e->stream, e->ticket);
    pthread_mutex_unlock(&gg__hdeps_lock);
  }
  gg__hstream_unref(s);
  return rc;
}

int gg__h_stream_check(gg__dev_t *d, void *stream, const char *op) {
  (void)d;
  gg__hstream_t *s = NULL;
  return gg__hstream_get(stream, op, false, &s, NULL);
}

void gg__hstreams_reset(void) {
  atomic_store(&gg__busy_submitted, 0);
  atomic_store(&gg__busy_completed, 0);
  gg__hdeps_clear(&gg__hdefault_deps);
}

void gg__hstreams_fork_lock(void) { pthread_mutex_lock(&gg__hlive.lock); }

void gg__hstreams_fork_unlock(void) { pthread_mutex_unlock(&gg__hlive.lock); }
