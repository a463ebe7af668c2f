/* host.c — the host backend: a simulated device in host memory (mmap reserve, commit, decommit),
 * with a capacity, simulated streams and deterministic fault injection of every operation. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "gpuguard/host.h"
#include "core/internal.h"

#define GG__HOST_DEFAULT_CAPACITY    (1ull << 30)
#define GG__HOST_DEFAULT_GRANULARITY (2ull << 20)

/* ---- fault injection ------------------------------------------------------------------------- */

#define GG__HOST_OPS(X) \
  X(open)               \
  X(mem_info)           \
  X(reserve)            \
  X(release)            \
  X(map)                \
  X(unmap)              \
  X(unmap_range)        \
  X(copy)               \
  X(set)                \
  X(event_create)       \
  X(event_record)       \
  X(event_query)        \
  X(event_sync)         \
  X(event_destroy)      \
  X(stream_sync)        \
  X(stream_query)       \
  X(stream_wait)        \
  X(ctx_reset)          \
  X(stream_capture)     \
  X(graph_retain)       \
  X(ctx_sync)

enum gg__host_op {
#define GG__OP_ENUM(n) GG__OP_##n,
  GG__HOST_OPS(GG__OP_ENUM)
#undef GG__OP_ENUM
      GG__OP_COUNT
};

static const char *const gg__op_names[GG__OP_COUNT] = {
#define GG__OP_NAME(n) #n,
    GG__HOST_OPS(GG__OP_NAME)
#undef GG__OP_NAME
};

typedef struct gg__fault {
  unsigned long long nth; /* 0: not armed */
  bool sticky;            /* fail the nth call and every later one */
  int code;
} gg__fault_t;

/* The simulated device is process-wide, like a real one. Everything here is reset when the device
 * goes from no open handle to one (env re-read) or by gg_host_fault_set (faults and counters). */
static struct {
  pthread_mutex_t lock;
  int opens;
  size_t capacity, granularity, used;
  bool vmm;
  bool populate; /* commit pages at map time (resident memory grows), as cuMemCreate does */
  bool busy;     /* every stream always has work queued: queries say busy, waits return at once */
  bool range_unmap; /* one unmap may span several mappings (GPUGUARD_HOST_RANGE_UNMAP) */
  gg__fault_t faults[GG__OP_COUNT];
  _Atomic unsigned long long calls[GG__OP_COUNT];
  atomic_bool
      armed; /* some fault is armed: only then does an operation read the table under the lock */
} gg__host = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool gg__any_armed(const gg__fault_t f[GG__OP_COUNT]) {
  for (int i = 0; i < GG__OP_COUNT; i++)
    if (f[i].nth) return true;
  return false;
}

static int gg__op_index(const char *name, size_t len) {
  for (int i = 0; i < GG__OP_COUNT; i++)
    if (strlen(gg__op_names[i]) == len && strncmp(gg__op_names[i], name, len) == 0) return i;
  return -1;
}

/* Parses a fault spec into out[]; on error nothing is changed by the caller. */
static int gg__fault_parse(const char *what, const char *spec, gg__fault_t out[GG__OP_COUNT]) {
  memset(out, 0, sizeof(gg__fault_t) * GG__OP_COUNT);
  const char *p = spec ? spec : "";
  while (*p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char item[64];
    if (len == 0 || len >= sizeof item)
      return gg__err(GG_EINVAL, "%s='%s': empty or overlong item", what, spec);
    memcpy(item, p, len);
    item[len] = '\0';
    char *colon = strchr(item, ':');
    int op = colon ? gg__op_index(item, (size_t)(colon - item)) : -1;
    if (op < 0)
      return gg__err(GG_EINVAL, "%s='%s': '%s' does not start with a known operation and ':'", what,
                     spec, item);
    gg__fault_t f = {.code = GG_EDRIVER};
    char *eq = strchr(colon, '=');
    if (eq) {
      if (strcmp(eq, "=nomem") != 0)
        return gg__err(GG_EINVAL, "%s='%s': '%s' (only '=nomem' may follow the count)", what, spec,
                       eq);
      f.code = GG_ENOMEM;
      *eq = '\0';
    }
    const char *n = colon + 1;
    size_t nlen = strlen(n);
    if (strcmp(n, "*") == 0) {
      f.nth = 1, f.sticky = true;
    } else {
      if (nlen && n[nlen - 1] == '+') f.sticky = true, colon[nlen] = '\0';
      long v;
      if (*n < '0' || *n > '9' ||
          gg__parse_int(what, n, 1, 1000000000L, &v) < 0) /* digits only: no ' 3' */
        return gg__err(GG_EINVAL, "%s='%s': '%s' needs a call number >= 1, 'N+' or '*'", what, spec,
                       item);
      f.nth = (unsigned long long)v;
    }
    out[op] = f;
    if (end && !end[1]) return gg__err(GG_EINVAL, "%s='%s': a trailing ','", what, spec);
    p = end ? end + 1 : p + len;
  }
  return 0;
}

int gg_host_fault_set(const char *spec) {
  gg__fault_t parsed[GG__OP_COUNT];
  int rc = gg__fault_parse("gg_host_fault_set", spec, parsed);
  if (rc < 0) return rc;
  pthread_mutex_lock(&gg__host.lock);
  memcpy(gg__host.faults, parsed, sizeof parsed);
  for (int i = 0; i < GG__OP_COUNT; i++) atomic_store(&gg__host.calls[i], 0);
  atomic_store(&gg__host.armed, gg__any_armed(parsed));
  pthread_mutex_unlock(&gg__host.lock);
  return 0;
}

unsigned long long gg_host_op_count(const char *op) {
  int i = op ? gg__op_index(op, strlen(op)) : -1;
  return i < 0 ? 0 : atomic_load(&gg__host.calls[i]);
}

/* Counts the call and fails it when a fault is armed for it. */
static int gg__op(enum gg__host_op op) {
  unsigned long long n = atomic_fetch_add(&gg__host.calls[op], 1) + 1;
  if (!atomic_load(&gg__host.armed))
    return 0; /* no lock on the common path: threads call in together */
  pthread_mutex_lock(&gg__host.lock);
  gg__fault_t f = gg__host.faults[op];
  pthread_mutex_unlock(&gg__host.lock);
  if (f.nth && (n == f.nth || (f.sticky && n > f.nth)))
    return gg__err(f.code, "host backend: injected fault in '%s' (call %llu)", gg__op_names[op], n);
  return 0;
}

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
  gg__hstream_t *s;
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
  c->stream = stream, c->id = ++gg__hcap.last_id;
  c->next = gg__hcap.capturing, gg__hcap.capturing = c; /* owned by the list until capture_end */
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
    if (!c->invalidated[0]) c->next = gg__hcap.graphs, gg__hcap.graphs = c;
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

static int gg__h_stream_capture(gg__dev_t *d, void *stream, unsigned long long *capture_id) {
  (void)d;
  *capture_id = 0;
  int rc = gg__op(GG__OP_stream_capture);
  gg__hstream_t *s;
  if (rc < 0 || (rc = gg__hstream_get(stream, "host backend: stream_capture", false, &s, NULL)) < 0)
    return rc;
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

static int gg__h_graph_retain(gg__dev_t *d, void *stream, void (*destroy)(void *user), void *user) {
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
      if (r) c->retained = r, c->capretained = cap;
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
  ds->d[n].on = on, ds->d[n].ticket = ticket;
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
  gg__hstream_t *s;
  int rc = gg__hstream_own(stream, "gg_host_stream_hold", &s);
  if (rc == 0) atomic_store(&s->held, true);
  return rc;
}

int gg_host_stream_release(void *stream) {
  gg__hstream_t *s;
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

static int gg__h_event_create(gg__dev_t *d, void **ev) {
  (void)d;
  int rc = gg__op(GG__OP_event_create);
  if (rc < 0) return rc;
  gg__hevent_t *e = calloc(1, sizeof *e);
  if (!e) return gg__err(GG_ENOMEM, "host backend: event_create: out of host memory");
  *ev = e;
  return 0;
}

static int gg__h_event_record(gg__dev_t *d, void *ev, void *stream) {
  (void)d;
  int rc = gg__op(GG__OP_event_record);
  gg__hstream_t *s;
  const void *key;
  if (rc < 0 || (rc = gg__hstream_get(stream, "host backend: event_record", true, &s, &key)) < 0)
    return rc;
  if ((rc = gg__hcap_touch(key, "event_record")) < 0) {
    gg__hstream_unref(s);
    return rc;
  }
  gg__hevent_t *e = ev;
  e->rec_key = key, e->recorded = true;
  gg__hstream_unref(e->stream);
  e->stream = NULL;
  gg__hdeps_clear(&e->deps);
  /* Completes only after the waits queued on its stream before it (stream_wait). */
  if ((rc = gg__hdeps_copy(&e->deps, gg__hdeps_of(s))) < 0) {
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

static int gg__h_event_query(gg__dev_t *d, void *ev) {
  (void)d;
  int rc = gg__op(GG__OP_event_query);
  gg__hevent_t *e = ev;
  if (rc == 0 && e->recorded) rc = gg__hcap_touch(e->rec_key, "event_query");
  if (rc < 0) return rc;
  if (e->busy_ticket > atomic_load(&gg__busy_completed)) return 0;
  return (!e->stream || atomic_load(&e->stream->completed) >= e->ticket) &&
         !gg__hdeps_pending(&e->deps);
}

static int gg__h_event_sync(gg__dev_t *d, void *ev) {
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

static int gg__h_event_destroy(gg__dev_t *d, void *ev) {
  (void)d;
  int rc = gg__op(GG__OP_event_destroy);
  gg__hevent_t *e = ev;
  if (e) gg__hstream_unref(e->stream), gg__hdeps_clear(&e->deps);
  free(
      e); /* freed even when a fault is injected: a real destroy failure does not leak the handle */
  return rc;
}

static int gg__h_stream_sync(gg__dev_t *d, void *stream) {
  (void)d;
  int rc = gg__op(GG__OP_stream_sync);
  gg__hstream_t *s;
  const void *key;
  if (rc < 0 || (rc = gg__hstream_get(stream, "host backend: stream_sync", false, &s, &key)) < 0 ||
      (rc = gg__hcap_touch(key, "stream_sync")) < 0)
    return rc;
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
static int gg__h_ctx_sync(gg__dev_t *d, int timeout_ms) {
  (void)d;
  int rc = gg__op(GG__OP_ctx_sync);
  if (rc < 0 || (rc = gg__hcap_touch(NULL, "ctx_sync")) < 0) return rc;
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

static int gg__h_stream_query(gg__dev_t *d, void *stream) {
  (void)d;
  int rc = gg__op(GG__OP_stream_query);
  gg__hstream_t *s;
  const void *key;
  if (rc < 0 || (rc = gg__hstream_get(stream, "host backend: stream_query", false, &s, &key)) < 0 ||
      (rc = gg__hcap_touch(key, "stream_query")) < 0)
    return rc;
  /* A held stream stands for one with a kernel still running: it is busy whatever was recorded. */
  if (gg__host.busy) return 0;
  return (!s ||
          (!atomic_load(&s->held) && atomic_load(&s->completed) >= atomic_load(&s->submitted))) &&
         !gg__hdeps_pending(gg__hdeps_of(s));
}

/* cuStreamWaitEvent: work queued on `stream` from now on runs after what the event covers. */
static int gg__h_stream_wait(gg__dev_t *d, void *stream, void *ev) {
  (void)d;
  int rc = gg__op(GG__OP_stream_wait);
  gg__hstream_t *s;
  const void *key;
  gg__hevent_t *e = ev;
  if (rc < 0 || (rc = gg__hstream_get(stream, "host backend: stream_wait", true, &s, &key)) < 0)
    return rc;
  if ((rc = gg__hcap_touch(key, "stream_wait")) == 0 && e->recorded)
    rc = gg__hcap_touch(e->rec_key, "stream_wait");
  if (rc == 0) rc = gg__hdeps_copy(gg__hdeps_of(s), &e->deps);
  if (rc == 0 && e->stream && atomic_load(&e->stream->completed) < e->ticket) {
    pthread_mutex_lock(&gg__hdeps_lock);
    rc = gg__hdeps_add_locked(gg__hdeps_of(s), e->stream, e->ticket);
    pthread_mutex_unlock(&gg__hdeps_lock);
  }
  gg__hstream_unref(s);
  return rc;
}

static int gg__h_stream_check(gg__dev_t *d, void *stream, const char *op) {
  (void)d;
  gg__hstream_t *s;
  return gg__hstream_get(stream, op, false, &s, NULL);
}

/* ---- memory ---------------------------------------------------------------------------------- */

/* Mapped chunks of one open device, so copies can be checked like a real device checks addresses.
 * */
typedef struct gg__hmap {
  uintptr_t ptr;
  size_t size;
  struct gg__hmap *next;
} gg__hmap_t;

typedef struct gg__hdev {
  pthread_mutex_t lock;
  gg__hmap_t *maps;
  size_t mapped;
} gg__hdev_t;

static int gg__h_mem_info(gg__dev_t *d, size_t *free_b, size_t *total_b) {
  (void)d;
  int rc = gg__op(GG__OP_mem_info);
  if (rc < 0) return rc;
  pthread_mutex_lock(&gg__host.lock);
  *total_b = gg__host.capacity;
  *free_b = gg__host.capacity - gg__host.used;
  pthread_mutex_unlock(&gg__host.lock);
  return 0;
}

static int gg__h_va_reserve(gg__dev_t *d, size_t size, uintptr_t *base) {
  int rc = gg__op(GG__OP_reserve);
  if (rc < 0) return rc;
  if (size == 0 || size % d->granularity)
    return gg__err(GG_EINVAL, "host backend: reserve of %zu bytes is not a multiple of %zu", size,
                   d->granularity);
  if (!d->contiguous) return (*base = 0), 0;
  /* Over-reserve by one granule so the range can start on a granule boundary. */
  size_t g = d->granularity;
  if (size > SIZE_MAX - g)
    return gg__err(GG_ENOMEM, "host backend: reserve of %zu bytes overflows", size);
  void *p = mmap(NULL, size + g, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return gg__err(GG_ENOMEM, "host backend: reserving %zu bytes of address space: %s", size,
                   strerror(errno));
  uintptr_t a = (uintptr_t)p, aligned = (a + g - 1) & ~(uintptr_t)(g - 1);
  if (aligned > a) munmap(p, aligned - a);
  if (aligned + size < a + size + g)
    munmap((void *)(aligned + size), a + size + g - (aligned + size));
  *base = aligned;
  return 0;
}

static int gg__h_va_release(gg__dev_t *d, uintptr_t base, size_t size) {
  int rc = gg__op(GG__OP_release);
  if (rc < 0) return rc;
  if (d->contiguous && base && munmap((void *)base, size) != 0)
    return gg__err(GG_EDRIVER, "host backend: releasing range %#jx: %s", (uintmax_t)base,
                   strerror(errno));
  return 0;
}

static int gg__h_map(gg__dev_t *d, uintptr_t at, size_t size, gg__chunk_t *out) {
  int rc = gg__op(GG__OP_map);
  if (rc < 0) return rc;
  gg__hdev_t *h = d->impl;
  size_t g = d->granularity;
  if (size == 0 || size % g || (d->contiguous && (at == 0 || at % g)) || (!d->contiguous && at))
    return gg__err(GG_EINVAL, "host backend: map of %zu bytes at %#jx is not granule-aligned (%zu)",
                   size, (uintmax_t)at, g);
  gg__hmap_t *m = malloc(sizeof *m);
  if (!m) return gg__err(GG_ENOMEM, "host backend: map: out of host memory");
  pthread_mutex_lock(&gg__host.lock);
  bool fits = size <= gg__host.capacity - gg__host.used;
  if (fits) gg__host.used += size;
  size_t used = gg__host.used, cap = gg__host.capacity;
  pthread_mutex_unlock(&gg__host.lock);
  if (!fits) {
    free(m);
    return gg__err(GG_ENOMEM,
                   "host backend: out of device memory mapping %zu bytes (%zu of %zu in use)", size,
                   used, cap);
  }
  /* MAP_POPULATE commits the pages now, as cuMemCreate does: resident memory really grows. */
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (gg__host.populate ? MAP_POPULATE : MAP_NORESERVE) |
              (d->contiguous ? MAP_FIXED : 0);
  void *p = mmap(d->contiguous ? (void *)at : NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    pthread_mutex_lock(&gg__host.lock);
    gg__host.used -= size;
    pthread_mutex_unlock(&gg__host.lock);
    free(m);
    return gg__err(GG_ENOMEM, "host backend: committing %zu bytes: %s", size, strerror(e));
  }
  m->ptr = (uintptr_t)p, m->size = size;
  pthread_mutex_lock(&h->lock);
  m->next = h->maps, h->maps = m, h->mapped += size;
  pthread_mutex_unlock(&h->lock);
  *out = (gg__chunk_t){.ptr = (uintptr_t)p, .size = size, .handle = 0};
  return 0;
}

static int gg__h_unmap(gg__dev_t *d, const gg__chunk_t *c) {
  int rc = gg__op(GG__OP_unmap);
  if (rc < 0) return rc;
  gg__hdev_t *h = d->impl;
  pthread_mutex_lock(&h->lock);
  gg__hmap_t **pp = &h->maps;
  while (*pp && !((*pp)->ptr == c->ptr && (*pp)->size == c->size)) pp = &(*pp)->next;
  gg__hmap_t *m = *pp;
  if (m) *pp = m->next, h->mapped -= m->size;
  pthread_mutex_unlock(&h->lock);
  if (!m)
    return gg__err(GG_EINVAL, "host backend: unmap of %zu bytes at %#jx: no such mapping", c->size,
                   (uintmax_t)c->ptr);
  free(m);
  /* Decommit: replace with an inaccessible, unbacked mapping (contiguous) or drop it (chunks). */
  if (d->contiguous)
    mmap((void *)c->ptr, c->size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  else
    munmap((void *)c->ptr, c->size);
  pthread_mutex_lock(&gg__host.lock);
  gg__host.used -= c->size;
  pthread_mutex_unlock(&gg__host.lock);
  return 0;
}

/* One unmap over [lo, lo + size): as cuMemUnmap, refused (nothing changed) unless the range is made
 * of whole mappings without a gap; with GPUGUARD_HOST_RANGE_UNMAP=0, also unless it is one mapping
 * (a driver that does not take a range spanning several). */
static int gg__h_unmap_span(gg__dev_t *d, uintptr_t lo, size_t size) {
  int rc = gg__op(GG__OP_unmap_range);
  if (rc < 0) return rc;
  gg__hdev_t *h = d->impl;
  uintptr_t hi = lo + size;
  size_t covered = 0, count = 0;
  bool partial = false;
  pthread_mutex_lock(&h->lock);
  for (gg__hmap_t *m = h->maps; m; m = m->next) {
    if (m->ptr >= hi || m->ptr + m->size <= lo) continue;
    if (m->ptr < lo || m->ptr + m->size > hi) partial = true;
    covered += m->size, count++;
  }
  if (!partial && covered == size && (count == 1 || gg__host.range_unmap)) {
    for (gg__hmap_t **pp = &h->maps; *pp;) {
      gg__hmap_t *m = *pp;
      if (m->ptr >= lo && m->ptr < hi)
        *pp = m->next, h->mapped -= m->size, free(m);
      else
        pp = &m->next;
    }
  }
  pthread_mutex_unlock(&h->lock);
  if (partial || covered != size)
    return gg__err(GG_EINVAL, "host backend: unmap of %zu bytes at %#jx: %s", size, (uintmax_t)lo,
                   partial ? "the range cuts a mapping" : "the range is not wholly mapped");
  if (count > 1 && !gg__host.range_unmap)
    return gg__err(GG_EINVAL,
                   "host backend: unmap of %zu bytes at %#jx spans %zu mappings (refused: "
                   "GPUGUARD_HOST_RANGE_UNMAP=0)",
                   size, (uintmax_t)lo, count);
  mmap((void *)lo, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  pthread_mutex_lock(&gg__host.lock);
  gg__host.used -= size;
  pthread_mutex_unlock(&gg__host.lock);
  return 0;
}

/* One range unmap where the simulated driver takes it; refused as a driver would refuse a range
 * spanning several mappings, chunk by chunk from the highest, as the CUDA backend does then. */
static int gg__h_unmap_run(gg__dev_t *d, gg__chunk_t *const *chunks, size_t n, size_t *done) {
  *done = 0;
  if (n == 0) return 0;
  if (n > 1 && d->contiguous) {
    uintptr_t lo = chunks[0]->ptr;
    int rc = gg__h_unmap_span(d, lo, chunks[n - 1]->ptr + chunks[n - 1]->size - lo);
    if (rc == 0) return (*done = n), 0;
    if (rc != GG_EINVAL) return rc;
  }
  for (size_t k = n; k-- > 0; ++*done) {
    int rc = gg__h_unmap(d, chunks[k]);
    if (rc < 0) return rc;
  }
  return 0;
}

/* A real device rejects addresses that are not mapped; so does the simulation. */
static int gg__h_check_range(gg__dev_t *d, uintptr_t p, size_t n, const char *op) {
  gg__hdev_t *h = d->impl;
  size_t covered = 0;
  if (p > UINTPTR_MAX - n) return gg__err(GG_EINVAL, "host backend: %s: range wraps around", op);
  pthread_mutex_lock(&h->lock);
  for (gg__hmap_t *m = h->maps; m; m = m->next) {
    uintptr_t lo = p > m->ptr ? p : m->ptr,
              hi = p + n < m->ptr + m->size ? p + n : m->ptr + m->size;
    if (hi > lo) covered += hi - lo;
  }
  pthread_mutex_unlock(&h->lock);
  if (covered != n)
    return gg__err(GG_EINVAL,
                   "host backend: %s of %zu bytes at %#jx touches unmapped device memory", op, n,
                   (uintmax_t)p);
  return 0;
}

static int gg__h_copy_to_dev(gg__dev_t *d, uintptr_t dst, const void *src, size_t n) {
  int rc = gg__op(GG__OP_copy);
  if (rc < 0) return rc;
  if ((rc = gg__h_check_range(d, dst, n, "copy to device")) < 0) return rc;
  if (n) memcpy((void *)dst, src, n);
  return 0;
}

static int gg__h_copy_from_dev(gg__dev_t *d, void *dst, uintptr_t src, size_t n) {
  int rc = gg__op(GG__OP_copy);
  if (rc < 0) return rc;
  if ((rc = gg__h_check_range(d, src, n, "copy from device")) < 0) return rc;
  if (n) memcpy(dst, (const void *)src, n);
  return 0;
}

static int gg__h_set_d8(gg__dev_t *d, uintptr_t dst, unsigned char v, size_t n) {
  int rc = gg__op(GG__OP_set);
  if (rc < 0) return rc;
  if ((rc = gg__h_check_range(d, dst, n, "set")) < 0) return rc;
  if (n) memset((void *)dst, v, n);
  return 0;
}

static int gg__h_ctx_reset(gg__dev_t *d) {
  (void)d;
  return gg__op(GG__OP_ctx_reset);
}

static void gg__h_close(gg__dev_t *d) {
  if (!d) return;
  gg__hdev_t *h = d->impl;
  /* Whatever the user left mapped is given back, as the driver does when a context goes away. */
  size_t leaked = 0;
  for (gg__hmap_t *m = h->maps, *next; m; m = next) {
    next = m->next;
    munmap((void *)m->ptr, m->size);
    leaked += m->size;
    free(m);
  }
  pthread_mutex_destroy(&h->lock);
  free(h);
  pthread_mutex_lock(&gg__host.lock);
  gg__host.used -= leaked;
  gg__host.opens--;
  pthread_mutex_unlock(&gg__host.lock);
  free(d);
}

static const gg__backend_ops_t gg__host_ops = {
    .name = "host",
    .mem_info = gg__h_mem_info,
    .va_reserve = gg__h_va_reserve,
    .va_release = gg__h_va_release,
    .map = gg__h_map,
    .unmap = gg__h_unmap,
    .unmap_run = gg__h_unmap_run,
    .copy_to_dev = gg__h_copy_to_dev,
    .copy_from_dev = gg__h_copy_from_dev,
    .set_d8 = gg__h_set_d8,
    .event_create = gg__h_event_create,
    .event_record = gg__h_event_record,
    .event_query = gg__h_event_query,
    .event_sync = gg__h_event_sync,
    .event_destroy = gg__h_event_destroy,
    .stream_sync = gg__h_stream_sync,
    .stream_query = gg__h_stream_query,
    .stream_wait = gg__h_stream_wait,
    .stream_check = gg__h_stream_check,
    .stream_capture = gg__h_stream_capture,
    .graph_retain = gg__h_graph_retain,
    .ctx_sync = gg__h_ctx_sync,
    .ctx_reset = gg__h_ctx_reset,
    .close = gg__h_close,
};

/* Reads the environment into the device settings; called when the first handle opens. */
static int gg__host_configure(void) {
  size_t cap = GG__HOST_DEFAULT_CAPACITY, gran = GG__HOST_DEFAULT_GRANULARITY;
  bool vmm = true, populate = true, busy = false, range_unmap = true;
  const char *v;
  int rc;
  if ((v = gg__env("GPUGUARD_HOST_CAPACITY")) &&
      (rc = gg__parse_size("GPUGUARD_HOST_CAPACITY", v, &cap)) < 0)
    return rc;
  const char *gv = gg__env("GPUGUARD_HOST_GRANULARITY"); /* kept: the check below names it */
  if (gv && (rc = gg__parse_size("GPUGUARD_HOST_GRANULARITY", gv, &gran)) < 0) return rc;
  if ((v = gg__env("GPUGUARD_HOST_VMM")) && (rc = gg__parse_bool("GPUGUARD_HOST_VMM", v, &vmm)) < 0)
    return rc;
  if ((v = gg__env("GPUGUARD_HOST_POPULATE")) &&
      (rc = gg__parse_bool("GPUGUARD_HOST_POPULATE", v, &populate)) < 0)
    return rc;
  if ((v = gg__env("GPUGUARD_HOST_BUSY")) &&
      (rc = gg__parse_bool("GPUGUARD_HOST_BUSY", v, &busy)) < 0)
    return rc;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (gran < page || (gran & (gran - 1)))
    return gg__err(GG_EINVAL, "GPUGUARD_HOST_GRANULARITY='%s': must be a power of two >= %zu",
                   gv ? gv : "", page);
  if (cap == 0) return gg__err(GG_EINVAL, "GPUGUARD_HOST_CAPACITY: must be more than 0 bytes");
  if ((v = gg__env("GPUGUARD_HOST_RANGE_UNMAP")) &&
      (rc = gg__parse_bool("GPUGUARD_HOST_RANGE_UNMAP", v, &range_unmap)) < 0)
    return rc;
  gg__fault_t faults[GG__OP_COUNT];
  bool have_faults = (v = gg__env("GPUGUARD_HOST_FAULT")) != NULL;
  if (have_faults && (rc = gg__fault_parse("GPUGUARD_HOST_FAULT", v, faults)) < 0) return rc;
  gg__host.capacity = cap, gg__host.granularity = gran, gg__host.vmm = vmm, gg__host.used = 0;
  gg__host.populate = populate, gg__host.busy = busy, gg__host.range_unmap = range_unmap;
  atomic_store(&gg__busy_submitted, 0),
      atomic_store(&gg__busy_completed, 0); /* no event is outstanding */
  gg__hdeps_clear(
      &gg__hdefault_deps); /* a held stream destroyed unreleased no longer blocks them */
  if (have_faults) {
    memcpy(gg__host.faults, faults, sizeof faults);
    for (int i = 0; i < GG__OP_COUNT; i++) atomic_store(&gg__host.calls[i], 0);
    atomic_store(&gg__host.armed, gg__any_armed(faults));
  }
  return 0;
}

int gg__host_props(int index, gg__dev_props_t *p) {
  if (index != 0)
    return gg__err(GG_ENODEV,
                   "host backend: device %d does not exist (the host backend has device 0 only)",
                   index);
  memset(p, 0, sizeof *p);
  gg__strlcpy(p->name, "gpuguard host device", sizeof p->name);
  gg__strlcpy(p->uuid, "GPU-00000000-0000-0000-0000-000000000000", sizeof p->uuid);
  pthread_mutex_lock(&gg__host.lock);
  int rc = gg__host.opens ? 0 : gg__host_configure();
  p->total_mem = gg__host.capacity;
  p->vmm = gg__host.vmm;
  pthread_mutex_unlock(&gg__host.lock);
  return rc;
}

/* fork() while another thread holds the simulated device's lock would leave it held in the child,
 * whose first open would hang: the lock is taken around fork. The forking thread owns it in the
 * child. */
static void gg__host_fork_prepare(void) {
  pthread_mutex_lock(&gg__host.lock);
  pthread_mutex_lock(&gg__hlive.lock);
}
static void gg__host_fork_release(void) {
  pthread_mutex_unlock(&gg__hlive.lock);
  pthread_mutex_unlock(&gg__host.lock);
}
GG__FORK_REGISTER(GG__FORK_HOST, gg__host_fork_prepare, gg__host_fork_release,
                  gg__host_fork_release)

int gg__host_open(int index, gg__dev_t **out) {
  if (index != 0)
    return gg__err(GG_ENODEV,
                   "host backend: device %d does not exist (the host backend has device 0 only)",
                   index);
  gg__dev_t *d = calloc(1, sizeof *d);
  gg__hdev_t *h = calloc(1, sizeof *h);
  if (!d || !h) {
    free(d), free(h);
    return gg__err(GG_ENOMEM, "host backend: open: out of host memory");
  }
  pthread_mutex_lock(&gg__host.lock);
  int rc = gg__host.opens ? 0 : gg__host_configure();
  if (rc == 0) gg__host.opens++;
  pthread_mutex_unlock(&gg__host.lock);
  if (rc == 0 && (rc = gg__op(GG__OP_open)) < 0) {
    pthread_mutex_lock(&gg__host.lock);
    gg__host.opens--;
    pthread_mutex_unlock(&gg__host.lock);
  }
  if (rc < 0) {
    free(d), free(h);
    return rc;
  }
  pthread_mutex_init(&h->lock, NULL);
  d->ops = &gg__host_ops;
  d->index = index;
  d->impl = h;
  d->granularity = gg__host.granularity;
  d->contiguous = gg__host.vmm;
  d->fork_gen = gg__fork_generation();
  gg__host_props(index, &d->props);
  *out = d;
  return 0;
}
