/* test_arena_model.c — randomized model check: thousands of random alloc/free/scope/trim operations
 * on the host backend against a plain reference model. After every operation: no overlap,
 * alignment, statistics equal to the model's, and the arena's own full consistency check;
 * regularly, every byte of every live block still holds what was written. Seed: fixed, or
 * GG_TEST_SEED to reproduce. The threaded runs do the same from 8 and 16 threads on one arena (with
 * frees of other threads' blocks, scopes every thread allocates in, trims, stats and checks among
 * them), with exact totals whenever the threads are paused. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "arena/arena_internal.h"
#include "arena/freelist_internal.h"
#include "gg_test.h"

#define KiB            ((size_t)1 << 10)
#define MiB            ((size_t)1 << 20)
#define MAX_LIVE       600
#define LIVE_BYTES_MAX (6 * MiB)

typedef struct mblock {
  unsigned char *ptr;
  size_t size, align;
  int depth;
  unsigned id;
} mblock_t;

typedef struct model {
  mblock_t b[MAX_LIVE];
  int n;
  gg_scope_t scopes[8];
  int depth;
  size_t in_use, peak;
  unsigned long long allocs, frees;
  unsigned next_id;
} model_t;

static unsigned long long rng_state;
static unsigned rnd(unsigned n) { /* xorshift64*: reproducible from the seed alone */
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return (unsigned)((rng_state * 2685821657736338717ull) >> 33) % n;
}

static size_t rounded(size_t n) { return (n + 255) / 256 * 256; }
static unsigned char fill_byte(unsigned id) { return (unsigned char)(id * 131u + 17u); }

static void verify_block(const mblock_t *m) {
  unsigned char want = fill_byte(m->id);
  for (size_t i = 0; i < m->size; i++)
    if (m->ptr[i] != want)
      fail_msg("block %u at %p (%zu bytes): byte %zu is %#x, wanted %#x", m->id, (void *)m->ptr,
               m->size, i, m->ptr[i], want);
}

static void check_stats(gg_arena_t *a, const model_t *m, size_t cap) {
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  gg_assert_ok(gg__arena_check(a));
  assert_int_equal(s.bytes_in_use, m->in_use);
  assert_int_equal(s.n_live, (unsigned long long)m->n);
  assert_int_equal(s.n_allocs, m->allocs);
  assert_int_equal(s.n_frees, m->frees);
  assert_int_equal(s.scope_depth, m->depth);
  assert_int_equal(s.peak_in_use, m->peak);
  assert_true(s.bytes_mapped <= cap && s.bytes_mapped >= s.bytes_in_use);
  assert_true(s.largest_free_block + s.bytes_pending <= s.bytes_mapped - s.bytes_in_use);
  assert_true(s.fragmentation >= 0.0 && s.fragmentation <= 1.0);
}

static void model_remove(model_t *m, int i, bool verify) {
  if (verify) verify_block(&m->b[i]);
  m->in_use -= rounded(m->b[i].size);
  m->frees++;
  m->b[i] = m->b[--m->n];
}

static bool boundary_sizes; /* sizes at the free list's class boundaries instead of spread evenly */

/* A size within a quantum or two of a class boundary: the last exact class (32 KiB), a power of
 * two, or a step between two of the 16 classes of a power of two. */
static size_t boundary_size(void) {
  size_t q;
  switch (rnd(3)) {
  case 0: q = 128; break;
  case 1: q = (size_t)1 << (7 + rnd(5)); break;
  default: {
    unsigned e = 7 + rnd(5);
    q = ((size_t)16 + rnd(16)) << (e - 4);
  }
  }
  return (q + rnd(5) - 2) * 256 -
         rnd(2) * (1 + rnd(255)); /* q-2..q+2 quanta, sometimes a little under */
}

static void do_alloc(gg_arena_t *a, model_t *m, bool held) {
  static const size_t aligns[] = {0, 0, 0, 0, 512, 4096, 64 * KiB};
  unsigned r = rnd(100);
  size_t size = r < 70   ? 1 + rnd(4096)
                : r < 95 ? 4096 + rnd(128 * KiB)
                         : 128 * KiB + rnd(1024 * KiB);
  if (boundary_sizes && rnd(4)) size = boundary_size();
  size_t align = aligns[rnd(7)];
  if (m->n == MAX_LIVE || m->in_use + rounded(size) > LIVE_BYTES_MAX) return;
  void *p = NULL;
  char tag[16];
  snprintf(tag, sizeof tag, "t%u", rnd(5));
  int rc = gg_alloc_ex(a, size, align, rnd(2) ? tag : NULL, &p);
  if (rc == GG_ENOMEM && held)
    return; /* released memory is not reusable while the stream is held */
  if (rc != 0)
    fail_msg("alloc %zu (align %zu): %s: %s", size, align, gg_err_name(rc), gg_last_error());
  size_t want_align = align < 256 ? 256 : align;
  assert_int_equal((uintptr_t)p % want_align, 0);
  unsigned char *q = p;
  for (int i = 0; i < m->n; i++) { /* no overlap with any live block */
    const mblock_t *o = &m->b[i];
    if (q < o->ptr + rounded(o->size) && o->ptr < q + rounded(size))
      fail_msg("new block %p+%zu overlaps block %u at %p+%zu", p, size, o->id, (void *)o->ptr,
               o->size);
  }
  mblock_t *b = &m->b[m->n++];
  *b = (mblock_t){q, size, align, m->depth, ++m->next_id};
  if (rnd(4) == 0) { /* through the arena's copy, or directly (host memory is real) */
    unsigned char *buf = malloc(size);
    memset(buf, fill_byte(b->id), size);
    gg_assert_ok(gg_arena_copy_to_device(a, p, buf, size));
    free(buf);
  } else {
    memset(p, fill_byte(b->id), size);
  }
  m->in_use += rounded(size), m->allocs++;
  if (m->in_use > m->peak) m->peak = m->in_use;
}

static void run_model(const char *label, bool vmm, unsigned flags, unsigned long long seed,
                      int ops) {
  setenv("GPUGUARD_HOST_VMM", vmm ? "1" : "0", 1);
  rng_state = seed ? seed : 1;
  printf("model run '%s': seed %llu, %d operations (reproduce with GG_TEST_SEED=%llu)\n", label,
         seed, ops, seed);
  void *stream = NULL;
  gg_assert_ok(gg_host_stream_create(&stream));
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  size_t cap = 32 * MiB;
  o.capacity = cap, o.chunk_size = 256 * KiB, o.flags = flags, o.stream = stream, o.name = label;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  model_t *m = calloc(1, sizeof *m);
  bool held = false;
  unsigned long long n_ops[8] = {0};
  for (int step = 0; step < ops; step++) {
    unsigned op = rnd(100);
    if (op < 45) {
      do_alloc(a, m, held), n_ops[0]++;
    } else if (op < 75) {
      if (m->n) {
        int i = (int)rnd((unsigned)m->n);
        verify_block(&m->b[i]);
        gg_assert_ok(gg_free(a, m->b[i].ptr));
        model_remove(m, i, false);
        n_ops[1]++;
      }
    } else if (op < 83) {
      if (m->depth < 7) {
        gg_assert_ok(gg_scope_begin(a, &m->scopes[m->depth++]));
        n_ops[2]++;
      }
    } else if (op < 91) {
      if (m->depth) {
        if (m->depth > 1 && rnd(4) == 0) { /* out of order: refused, nothing changes */
          gg_assert_fails(gg_scope_end(&m->scopes[rnd((unsigned)m->depth - 1)]), GG_ESTATE,
                          "reverse order");
        }
        for (int i = m->n - 1; i >= 0; i--)
          if (m->b[i].depth == m->depth) model_remove(m, i, rnd(8) == 0);
        gg_assert_ok(gg_scope_end(&m->scopes[--m->depth]));
        gg_assert_fails(gg_scope_end(&m->scopes[m->depth]), GG_ESTATE, "ended already");
        n_ops[3]++;
      }
    } else if (op < 94) {
      size_t keep = rnd(2) ? 0 : (size_t)rnd(16) * MiB;
      int rc = gg_arena_trim(a, keep);
      if (rc != 0 && !(held && rc == GG_ETIMEDOUT)) fail_msg("trim: %s", gg_last_error());
      if (rc == 0 && keep == 0) { /* nothing wholly free stays mapped */
        gg_arena_stats_t s;
        gg_assert_ok(gg_arena_stats(a, &s));
        /* Every chunk left holds part of a live block; a block touches at most size/64K + 2 chunks.
         * */
        unsigned long long touched = 0;
        for (int i = 0; i < m->n; i++) touched += rounded(m->b[i].size) / (64 * KiB) + 2;
        assert_true(s.n_chunks <= touched);
        assert_int_equal(s.bytes_pending, 0);
      }
      n_ops[4]++;
    } else if (op < 97) {
      if (!(flags & GG_ARENA_NO_STREAM)) {
        held = !held;
        gg_assert_ok(held ? gg_host_stream_hold(stream) : gg_host_stream_release(stream));
        n_ops[5]++;
      }
    } else {
      if (m->n) { /* bad input in the middle of it all changes nothing */
        mblock_t *b = &m->b[rnd((unsigned)m->n)];
        if (b->size > 256) gg_assert_fails(gg_free(a, b->ptr + 256), GG_EINVAL, "middle");
        n_ops[6]++;
      }
    }
    check_stats(a, m, cap);
    if (step % 64 == 0)
      for (int i = 0; i < m->n; i++) verify_block(&m->b[i]);
  }
  for (int i = 0; i < m->n; i++) verify_block(&m->b[i]);
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  printf("  allocs %llu, frees %llu, scope begins %llu, ends %llu, trims %llu, holds %llu, bad "
         "frees %llu; "
         "peak in use %zu, peak mapped %zu, fragmentation now %.3f\n",
         n_ops[0], n_ops[1], n_ops[2], n_ops[3], n_ops[4], n_ops[5], n_ops[6], s.peak_in_use,
         s.peak_mapped, s.fragmentation);
  if (held) gg_assert_ok(gg_host_stream_release(stream));
  while (m->depth) gg_assert_ok(gg_scope_end(&m->scopes[--m->depth]));
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(stream);
  free(m);
}

static unsigned long long seed_from_env(unsigned long long dflt) {
  const char *v = getenv("GG_TEST_SEED");
  return v && *v ? strtoull(v, NULL, 0) : dflt;
}

static int ops_count(void) {
  const char *v = getenv("GG_TEST_OPS");
  return v && *v ? atoi(v) : 6000;
}

/* ---- many threads on one arena --------------------------------------------------------------- */

#define TM_THREADS 16
#define TM_SLOTS   48
#define TM_MAIL    128

typedef struct tblock {
  unsigned char *ptr;
  size_t size;
  int depth;
  unsigned char fill;
} tblock_t;

typedef struct tworker {
  int id;
  unsigned long long rng;
  tblock_t b[TM_SLOTS];
  int n;
  unsigned long long allocs, frees, ops[8];
  size_t in_use;
  char error[300];
} tworker_t;

/* Ordinary operations run under the gate's read side; scope begins and ends, and exact totals,
 * under its write side, with every other thread paused between two operations. */
static struct {
  gg_arena_t *arena;
  pthread_rwlock_t gate;
  pthread_mutex_t
      mail_lock; /* blocks handed from one thread to another, freed by whoever takes them */
  tblock_t mail[TM_MAIL];
  int n_mail;
  size_t mail_in_use;
  gg_scope_t scopes[8];
  int depth;
  unsigned long long scope_frees;
  int n_threads, ops;
  tworker_t w[TM_THREADS];
  atomic_bool stop;
} tm;

static unsigned trnd(tworker_t *w, unsigned n) {
  w->rng ^= w->rng >> 12, w->rng ^= w->rng << 25, w->rng ^= w->rng >> 27;
  return (unsigned)((w->rng * 2685821657736338717ull) >> 33) % n;
}

static bool tblock_intact(const tblock_t *b) {
  for (size_t i = 0; i < b->size; i += 61)
    if (b->ptr[i] != b->fill) return false;
  return b->ptr[b->size - 1] == b->fill;
}

#define TFAIL(w, ...)                                    \
  do {                                                   \
    snprintf((w)->error, sizeof(w)->error, __VA_ARGS__); \
    atomic_store(&tm.stop, true);                        \
    return false;                                        \
  } while (0)

/* Write side held: the totals of every thread's model against the arena's statistics, its full
 * check, and every live block's contents. */
static bool tm_exact(tworker_t *me) {
  size_t in_use = tm.mail_in_use;
  unsigned long long live = (unsigned long long)tm.n_mail, allocs = 0, frees = tm.scope_frees;
  for (int t = 0; t < tm.n_threads; t++) {
    const tworker_t *w = &tm.w[t];
    in_use += w->in_use, live += (unsigned long long)w->n, allocs += w->allocs, frees += w->frees;
    for (int i = 0; i < w->n; i++)
      if (!tblock_intact(&w->b[i]))
        TFAIL(me, "thread %d's block %p was overwritten", t, (void *)w->b[i].ptr);
  }
  for (int i = 0; i < tm.n_mail; i++)
    if (!tblock_intact(&tm.mail[i]))
      TFAIL(me, "a handed-over block %p was overwritten", (void *)tm.mail[i].ptr);
  gg_arena_stats_t s;
  if (gg_arena_stats(tm.arena, &s) < 0 || gg__arena_check(tm.arena) < 0)
    TFAIL(me, "%s", gg_last_error());
  if (s.bytes_in_use != in_use || s.n_live != live || s.n_allocs != allocs || s.n_frees != frees ||
      s.scope_depth != tm.depth || s.peak_in_use < s.bytes_in_use)
    TFAIL(me,
          "stats: in use %zu (model %zu), live %llu (%llu), allocs %llu (%llu), frees %llu (%llu), "
          "depth %d (%d), peak %zu",
          s.bytes_in_use, in_use, s.n_live, live, s.n_allocs, allocs, s.n_frees, frees,
          s.scope_depth, tm.depth, s.peak_in_use);
  return true;
}

/* Write side held: a scope begins (every thread's next allocations belong to it) or the innermost
 * one ends (whichever thread allocated its blocks, and whichever cached them). */
static bool tm_scope_op(tworker_t *w) {
  if (trnd(w, 2)) return tm_exact(w);                   /* totals alone */
  if (tm.depth < 6 && (tm.depth == 0 || !trnd(w, 4))) { /* scopes stay short: caches run between */
    if (gg_scope_begin(tm.arena, &tm.scopes[tm.depth]) < 0)
      TFAIL(w, "scope begin: %s", gg_last_error());
    tm.depth++;
    return tm_exact(w);
  }
  for (int t = 0; t < tm.n_threads; t++) {
    tworker_t *o = &tm.w[t];
    for (int i = o->n - 1; i >= 0; i--)
      if (o->b[i].depth == tm.depth)
        o->in_use -= rounded(o->b[i].size), tm.scope_frees++, o->b[i] = o->b[--o->n];
  }
  for (int i = tm.n_mail - 1; i >= 0; i--)
    if (tm.mail[i].depth == tm.depth)
      tm.mail_in_use -= rounded(tm.mail[i].size), tm.scope_frees++,
          tm.mail[i] = tm.mail[--tm.n_mail];
  if (gg_scope_end(&tm.scopes[--tm.depth]) < 0) TFAIL(w, "scope end: %s", gg_last_error());
  return tm_exact(w);
}

/* Read side held: one ordinary operation. */
static bool tm_op(tworker_t *w, unsigned op) {
  if (op < 40) { /* allocate */
    if (w->n == TM_SLOTS) return true;
    unsigned r = trnd(w, 100);
    size_t size = r < 70   ? 1 + trnd(w, 4096)
                  : r < 95 ? 4096 + trnd(w, 60 * 1024)
                           : 64 * 1024 + trnd(w, 192 * 1024);
    size_t align = trnd(w, 8) ? 0 : 4096;
    void *p;
    if (gg_alloc_ex(tm.arena, size, align, trnd(w, 3) ? NULL : "t", &p) < 0)
      TFAIL(w, "alloc %zu: %s", size, gg_last_error());
    if ((uintptr_t)p % (align ? align : 256)) TFAIL(w, "block %p is not aligned to %zu", p, align);
    tblock_t *b = &w->b[w->n++];
    *b = (tblock_t){p, size, tm.depth, (unsigned char)(w->id * 16 + trnd(w, 16) + 1)};
    memset(p, b->fill, size);
    w->in_use += rounded(size), w->allocs++, w->ops[0]++;
  } else if (op < 70) { /* free one of its own */
    if (!w->n) return true;
    int i = (int)trnd(w, (unsigned)w->n);
    if (!tblock_intact(&w->b[i])) TFAIL(w, "block %p was overwritten", (void *)w->b[i].ptr);
    if (gg_free(tm.arena, w->b[i].ptr) < 0) TFAIL(w, "free: %s", gg_last_error());
    w->in_use -= rounded(w->b[i].size), w->frees++, w->ops[1]++;
    w->b[i] = w->b[--w->n];
  } else if (op < 78) { /* hand one to whichever thread takes it */
    if (!w->n) return true;
    int i = (int)trnd(w, (unsigned)w->n);
    pthread_mutex_lock(&tm.mail_lock);
    if (tm.n_mail < TM_MAIL) {
      tm.mail[tm.n_mail++] = w->b[i], tm.mail_in_use += rounded(w->b[i].size);
      w->in_use -= rounded(w->b[i].size), w->b[i] = w->b[--w->n], w->ops[2]++;
    }
    pthread_mutex_unlock(&tm.mail_lock);
  } else if (op < 86) { /* free one another thread allocated */
    pthread_mutex_lock(&tm.mail_lock);
    tblock_t b = {0};
    if (tm.n_mail) {
      int i = (int)trnd(w, (unsigned)tm.n_mail);
      b = tm.mail[i], tm.mail[i] = tm.mail[--tm.n_mail];
    }
    pthread_mutex_unlock(&tm.mail_lock);
    if (!b.ptr) return true;
    if (!tblock_intact(&b)) TFAIL(w, "handed-over block %p was overwritten", (void *)b.ptr);
    if (gg_free(tm.arena, b.ptr) < 0)
      TFAIL(w, "free of another thread's block: %s", gg_last_error());
    pthread_mutex_lock(&tm.mail_lock);
    tm.mail_in_use -= rounded(b.size);
    pthread_mutex_unlock(&tm.mail_lock);
    w->frees++, w->ops[3]++;
  } else if (op <
             90) { /* a copy into one of its blocks: the arena must find it wherever it is cached */
    if (!w->n) return true;
    tblock_t *b = &w->b[trnd(w, (unsigned)w->n)];
    unsigned char buf[64];
    size_t n = b->size < sizeof buf ? b->size : sizeof buf;
    memset(buf, b->fill, n);
    if (gg_arena_copy_to_device(tm.arena, b->ptr, buf, n) < 0)
      TFAIL(w, "copy: %s", gg_last_error());
    w->ops[4]++;
  } else if (op < 94) { /* statistics and the full check, while the others run */
    gg_arena_stats_t s;
    if (gg_arena_stats(tm.arena, &s) < 0) TFAIL(w, "stats: %s", gg_last_error());
    if (s.peak_in_use < s.bytes_in_use || s.n_frees > s.n_allocs || s.bytes_in_use > s.bytes_mapped)
      TFAIL(w, "stats inconsistent: peak %zu, in use %zu, mapped %zu", s.peak_in_use,
            s.bytes_in_use, s.bytes_mapped);
    if (gg__arena_check(tm.arena) < 0) TFAIL(w, "%s", gg_last_error());
    w->ops[5]++;
  } else if (op < 96) {
    if (gg_arena_trim(tm.arena, trnd(w, 2) ? 0 : 4 * MiB) < 0)
      TFAIL(w, "trim: %s", gg_last_error());
    w->ops[6]++;
  }
  return true;
}

static void *tm_worker(void *arg) {
  tworker_t *w = arg;
  for (int step = 0; step < tm.ops && !atomic_load(&tm.stop); step++) {
    unsigned op = trnd(w, 100);
    bool ok;
    if (op >= 96) {
      pthread_rwlock_wrlock(&tm.gate);
      ok = tm_scope_op(w);
      w->ops[7]++;
    } else {
      pthread_rwlock_rdlock(&tm.gate);
      ok = tm_op(w, op);
    }
    pthread_rwlock_unlock(&tm.gate);
    if (!ok) break;
  }
  return NULL;
}

static void run_threads(int threads, unsigned long long seed, int ops) {
  printf("threaded model run: %d threads, seed %llu, %d operations each\n", threads, seed, ops);
  void *stream = NULL;
  gg_assert_ok(gg_host_stream_create(&stream));
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 48 * MiB, o.chunk_size = 256 * KiB, o.stream = stream, o.name = "threads";
  memset(&tm, 0, sizeof tm);
  gg_assert_ok(gg_arena_create(&tm.arena, &o));
  pthread_rwlock_init(&tm.gate, NULL);
  pthread_mutex_init(&tm.mail_lock, NULL);
  tm.n_threads = threads, tm.ops = ops;
  pthread_t tid[TM_THREADS];
  for (int t = 0; t < threads; t++) {
    tm.w[t].id = t, tm.w[t].rng = seed * 7919 + (unsigned long long)t + 1;
    pthread_create(&tid[t], NULL, tm_worker, &tm.w[t]);
  }
  for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
  for (int t = 0; t < threads; t++)
    if (tm.w[t].error[0])
      fail_msg("thread %d: %s (reproduce with GG_TEST_SEED=%llu)", t, tm.w[t].error, seed);
  tworker_t *w = &tm.w[0]; /* the threads are gone: their caches went back to the arena */
  if (!tm_exact(w)) fail_msg("after the threads: %s", w->error);
  gg__arena_probe_t pr;
  gg_assert_ok(gg__arena_probe(tm.arena, &pr));
  printf("  %llu allocations served by the threads' caches\n", pr.cached_allocs);
  assert_true(pr.cached_allocs > 0);
  unsigned long long sum[8] = {0};
  for (int t = 0; t < threads; t++)
    for (int k = 0; k < 8; k++) sum[k] += tm.w[t].ops[k];
  printf(
      "  allocs %llu, own frees %llu, handed over %llu, freed by another thread %llu, copies %llu, "
      "stats+checks %llu, trims %llu, scope ops %llu\n",
      sum[0], sum[1], sum[2], sum[3], sum[4], sum[5], sum[6], sum[7]);
  for (int t = 0; t < threads; t++)
    for (int i = 0; i < tm.w[t].n; i++) gg_assert_ok(gg_free(tm.arena, tm.w[t].b[i].ptr));
  for (int i = 0; i < tm.n_mail; i++) gg_assert_ok(gg_free(tm.arena, tm.mail[i].ptr));
  while (tm.depth) gg_assert_ok(gg_scope_end(&tm.scopes[--tm.depth]));
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(tm.arena, &s));
  assert_int_equal(s.bytes_in_use, 0);
  assert_int_equal(s.n_live, 0);
  gg_assert_ok(gg__arena_check(tm.arena));
  gg_assert_ok(gg_arena_trim(tm.arena, 0));
  gg_assert_ok(gg_arena_stats(tm.arena, &s));
  assert_int_equal(s.bytes_mapped, 0); /* nothing stayed in a cache */
  gg_assert_ok(gg_arena_destroy(tm.arena));
  pthread_rwlock_destroy(&tm.gate);
  pthread_mutex_destroy(&tm.mail_lock);
  gg_host_stream_destroy(stream);
}

static void test_threads_8(void **state) {
  (void)state;
  run_threads(8, seed_from_env(8), ops_count() / 2);
}
static void test_threads_16(void **state) {
  (void)state;
  run_threads(16, seed_from_env(16), ops_count() / 4);
}

static int setup(void **state) {
  (void)state;
  gg_test_use_host("64M", "64K");
  return 0;
}

static void test_vmm_stream(void **state) {
  (void)state;
  run_model("vmm, stream tracked", true, 0, seed_from_env(20240601), ops_count());
}
static void test_vmm_no_stream(void **state) {
  (void)state;
  run_model("vmm, no stream", true, GG_ARENA_NO_STREAM, seed_from_env(7), ops_count());
}
static void test_novmm_stream(void **state) {
  (void)state;
  run_model("no vmm, stream tracked", false, 0, seed_from_env(99), ops_count());
}
static void test_novmm_no_stream(void **state) {
  (void)state;
  run_model("no vmm, no stream", false, GG_ARENA_NO_STREAM, seed_from_env(31337), ops_count());
}
static void test_class_boundaries(void **state) {
  (void)state;
  boundary_sizes = true;
  run_model("class boundaries, stream tracked", true, 0, seed_from_env(4711), ops_count());
  run_model("class boundaries, no stream", false, GG_ARENA_NO_STREAM, seed_from_env(815),
            ops_count());
  boundary_sizes = false;
}

/* ---- the free list on its own: which block a fit takes --------------------------------------- */

#define Q ((size_t)256)

static gg__block_t *fl_put(gg__freelist_t *fl, uintptr_t addr, size_t size) {
  gg_assert_ok(gg__freelist_reserve(fl, 4));
  gg__block_t *b = gg__freelist_put(fl, addr, size, NULL, NULL);
  const char *w = gg__freelist_check(fl);
  if (w) fail_msg("after putting %#jx+%zu: %s", (uintmax_t)addr, size, w);
  return b;
}

static size_t fl_fit(gg__freelist_t *fl, size_t n, size_t a) {
  gg__block_t *b = gg__freelist_fit(fl, n, a);
  return b ? b->size : 0;
}

/* Blocks far apart (none merge), sizes on both sides of class boundaries: a fit takes the smallest
 * block that holds the request, whether it shares the request's class, sits in the next one or
 * further up. */
static void test_freelist_best_fit_across_classes(void **state) {
  (void)state;
  gg__freelist_t fl = {0};
  uintptr_t base = (uintptr_t)1 << 40, step = (uintptr_t)1 << 30;
  const size_t sizes[] = {127 * Q, 128 * Q, 129 * Q,  144 * Q, 150 * Q,
                          255 * Q, 256 * Q, 4096 * Q, 4100 * Q};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) fl_put(&fl, base + i * step, sizes[i]);
  assert_int_equal(fl_fit(&fl, 127 * Q, Q), 127 * Q); /* the last exact class */
  assert_int_equal(fl_fit(&fl, 126 * Q, Q), 127 * Q); /* empty exact class: the next one up */
  assert_int_equal(fl_fit(&fl, 128 * Q, Q), 128 * Q); /* first class of a power of two */
  assert_int_equal(fl_fit(&fl, 129 * Q, Q), 129 * Q); /* same class as 128 (8 quanta wide) */
  assert_int_equal(fl_fit(&fl, 130 * Q, Q),
                   144 * Q); /* nothing big enough in its class: next class */
  assert_int_equal(fl_fit(&fl, 145 * Q, Q), 150 * Q); /* in the class, the block that fits */
  assert_int_equal(fl_fit(&fl, 151 * Q, Q), 255 * Q);
  assert_int_equal(fl_fit(&fl, 256 * Q, Q), 256 * Q);
  assert_int_equal(fl_fit(&fl, 4097 * Q, Q), 4100 * Q);
  assert_int_equal(fl_fit(&fl, 4101 * Q, Q), 0);
  assert_int_equal(gg__freelist_largest(&fl)->size, 4100 * Q);
  /* Over-aligned: every block starts at base + i GiB, so all are 1 GiB-aligned and the smallest
   * fits. */
  assert_int_equal(fl_fit(&fl, 130 * Q, (size_t)1 << 20), 144 * Q);
  gg__freelist_free(&fl);
}

/* Blocks whose start is not aligned: an aligned fit must skip those where the padding leaves too
 * little. */
static void test_freelist_alignment(void **state) {
  (void)state;
  gg__freelist_t fl = {0};
  uintptr_t base = (uintptr_t)1 << 40;
  fl_put(&fl, base + Q, 64 * Q); /* 64 KiB-aligned only after 255 quanta: too far */
  fl_put(&fl, base + ((uintptr_t)1 << 30), 64 * Q); /* aligned */
  gg__block_t *b = gg__freelist_fit(&fl, 64 * Q, 64 * KiB);
  assert_non_null(b);
  assert_int_equal(b->addr, base + ((uintptr_t)1 << 30));
  gg_assert_ok(gg__freelist_reserve(&fl, 2));
  b = gg__freelist_carve(&fl, b, 64 * Q, 64 * KiB);
  assert_int_equal(b->addr % (64 * KiB), 0);
  assert_null(gg__freelist_check(&fl));
  gg__freelist_give_record(&fl, b);
  /* A block large enough to hold any padding: the fallback class is used. */
  fl_put(&fl, base + ((uintptr_t)2 << 30) + Q, 2048 * Q);
  b = gg__freelist_fit(&fl, 512 * Q, (size_t)1 << 18);
  assert_non_null(b);
  assert_int_equal(b->size, 2048 * Q);
  gg_assert_ok(gg__freelist_reserve(&fl, 2));
  b = gg__freelist_carve(&fl, b, 512 * Q,
                         (size_t)1 << 18); /* a piece before it and one after stay free */
  assert_int_equal(b->addr % ((size_t)1 << 18), 0);
  assert_null(gg__freelist_check(&fl));
  assert_int_equal(fl.bytes, 64 * Q + (2048 - 512) * Q);
  gg__freelist_give_record(&fl, b);
  gg__freelist_free(&fl);
}

/* Ranges that touch merge whatever their classes: below, above and both; the merged block moves to
 * the class of its new size, and a carve from the front leaves the rest listed in its own class. */
static void test_freelist_coalescing_across_classes(void **state) {
  (void)state;
  gg__freelist_t fl = {0};
  uintptr_t b0 = (uintptr_t)1 << 40;
  fl_put(&fl, b0, 3 * Q);              /* exact class 3 */
  fl_put(&fl, b0 + 200 * Q, 1000 * Q); /* two blocks with a 197-quantum hole between */
  fl_put(&fl, b0 + 3 * Q, 100 * Q);    /* merges below: 103 quanta, still an exact class */
  assert_int_equal(fl.count, 2);
  fl_put(&fl, b0 + 103 * Q, 97 * Q); /* fills the hole: one block of 1200 quanta */
  assert_int_equal(fl.count, 1);
  assert_int_equal(gg__freelist_largest(&fl)->size, 1200 * Q);
  assert_int_equal(fl_fit(&fl, 3 * Q, Q), 1200 * Q); /* the small classes are empty now */
  gg_assert_ok(gg__freelist_reserve(&fl, 2));
  gg__block_t *u = gg__freelist_carve(&fl, gg__freelist_fit(&fl, 1100 * Q, Q), 1100 * Q, Q);
  assert_int_equal(u->addr, b0);
  assert_null(gg__freelist_check(&fl));
  assert_int_equal(fl_fit(&fl, 100 * Q, Q), 100 * Q); /* the rest: exact class 100 */
  fl_put(&fl, u->addr, u->size);                      /* back: one block again, records reused */
  gg__freelist_give_record(&fl, u);
  assert_int_equal(fl.count, 1);
  assert_int_equal(fl.bytes, 1200 * Q);
  gg__freelist_free(&fl);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_vmm_stream, setup),
      cmocka_unit_test_setup(test_vmm_no_stream, setup),
      cmocka_unit_test_setup(test_novmm_stream, setup),
      cmocka_unit_test_setup(test_novmm_no_stream, setup),
      cmocka_unit_test_setup(test_class_boundaries, setup),
      cmocka_unit_test(test_freelist_best_fit_across_classes),
      cmocka_unit_test(test_freelist_alignment),
      cmocka_unit_test(test_freelist_coalescing_across_classes),
      cmocka_unit_test_setup(test_threads_8, setup),
      cmocka_unit_test_setup(test_threads_16, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
