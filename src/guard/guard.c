/* guard.c — guards: the list of live guards, each guard's LIFO cleanups and attached objects, and the
 * teardown (cleanups, leak report, context reset and release) on every path: destroy, exit(), signals. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "guard/guard_internal.h"
#include "core/internal.h"
#include "core/json_internal.h"
#include "core/symbol_internal.h"
#include "proc/proc_internal.h"
#include "guard/signal_internal.h"
#include "proc/teardown_internal.h"
#include "core/vec_internal.h"

#define GG__DEFAULT_TIMEOUT_MS 10000
#define GG__DEFAULT_GRACE_MS   2000

typedef struct gg__entry {
  unsigned long long id;
  gg_cleanup_fn fn;            /* a user cleanup, or NULL for an attached object */
  void *user;                  /* fn's argument, or the attached object */
  const gg__attach_ops_t *ops; /* attached objects only */
  char name[64];
} gg__entry_t;

enum gg__state { GG__LIVE, GG__TEARING, GG__DEAD };

enum gg__dest { GG__TO_NONE, GG__TO_STDERR, GG__TO_STDOUT, GG__TO_FILE };

typedef struct gg__report_opts {
  enum gg__dest dest;
  bool json;
  bool asked; /* an explicit destination: report at every teardown, empty or not */
  char path[1024];
} gg__report_opts_t;

struct gg_guard {
  /* Live-list lock: */
  gg_guard_t *next;        /* newer to older */
  int refs;                /* the live list's, plus callers working on it without the list lock */
  bool destroying;         /* gg_guard_destroy() has claimed it */
  unsigned long long seen; /* teardown-all pass that visited it last */
  /* Fixed at creation: */
  unsigned fork_gen;
  unsigned signals;
  bool run_at_exit, reset_context;
  int timeout_ms, device, grace_ms;
  char name[64];
  gg__report_opts_t report;
  /* lock: */
  pthread_mutex_t lock;
  pthread_cond_t cond; /* state and running changes */
  enum gg__state state;
  pthread_t owner;            /* the thread running the teardown (state GG__TEARING) */
  unsigned long long running; /* id of the entry whose cleanup is running, 0 none */
  gg__entry_t *entries;
  size_t n, cap;
  gg__dev_t *dev; /* released by the teardown */
  const char *backend;
};

/* The live guards of this process (not the per-user session registry of registry.c). */
static struct {
  pthread_mutex_t lock; /* lock order (fork.c): this, then a guard's lock, then signal.c's */
  gg_guard_t *head;     /* newest first */
  unsigned long long next_id, pass;
  bool wired; /* the hooks below are given to the lower layers in this process */
} gg__live = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void gg__guard_fork_prepare(void) { pthread_mutex_lock(&gg__live.lock); }
static void gg__guard_fork_parent(void) { pthread_mutex_unlock(&gg__live.lock); }
static void gg__guard_fork_child(void) {
  gg__live.wired = false; /* the child's crash-hook table starts empty */
  pthread_mutex_unlock(&gg__live.lock);
}
GG__FORK_REGISTER(GG__FORK_GUARDS, gg__guard_fork_prepare, gg__guard_fork_parent, gg__guard_fork_child)

/* Why a teardown runs. */
enum gg__reason { GG__BY_DESTROY, GG__BY_EXIT, GG__BY_SIGNAL };

static const char *gg__reason_name(enum gg__reason why) {
  return why == GG__BY_DESTROY ? "gg_guard_destroy" : why == GG__BY_EXIT ? "exit" : "signal";
}

/* ---- options ------------------------------------------------------------------------------------------ */

void gg_guard_options_init(gg_guard_options_t *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof *opts);
  opts->signals = GG_GUARD_SIGNALS_ALL;
  opts->run_at_exit = true;
  opts->teardown_timeout_ms = GG__DEFAULT_TIMEOUT_MS;
  opts->child_grace_ms = GG__DEFAULT_GRACE_MS;
}

/* "stderr", "stdout", "none", PATH, each optionally "json:" or "text:" first. */
static int gg__parse_report(const char *what, const char *text, gg__report_opts_t *r) {
  memset(r, 0, sizeof *r);
  r->dest = GG__TO_STDERR;
  if (!text) return 0;
  r->asked = true;
  const char *v = text;
  if (strncmp(v, "json:", 5) == 0)
    r->json = true, v += 5;
  else if (strncmp(v, "text:", 5) == 0)
    v += 5;
  else if (strcmp(v, "json") == 0)
    return (r->json = true), 0;
  if (!*v) return gg__err(GG_EINVAL, "%s='%s': nothing after the format prefix", what, text);
  if (strcmp(v, "stderr") == 0) return 0;
  if (strcmp(v, "stdout") == 0) return (r->dest = GG__TO_STDOUT), 0;
  if (!strcmp(v, "none") || !strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "no"))
    return (r->dest = GG__TO_NONE), 0;
  if (strlen(v) >= sizeof r->path) return gg__err(GG_EINVAL, "%s: the path is too long", what);
  r->dest = GG__TO_FILE;
  gg__strlcpy(r->path, v, sizeof r->path);
  return 0;
}

static int gg__check_options(const gg_guard_options_t *o, gg__report_opts_t *report) {
  if (o->device < 0) return gg__err(GG_EINVAL, "gg_guard_create: options.device=%d is negative", o->device);
  if (o->signals & ~(unsigned)GG_GUARD_SIGNALS_ALL)
    return gg__err(GG_EINVAL, "gg_guard_create: options.signals=0x%x has bits that are not GG_GUARD_SIG*",
                   o->signals);
  if (o->teardown_timeout_ms < 0)
    return gg__err(GG_EINVAL, "gg_guard_create: options.teardown_timeout_ms=%d is negative",
                   o->teardown_timeout_ms);
  if (o->child_grace_ms < 0 || o->child_grace_ms > 600000)
    return gg__err(GG_EINVAL, "gg_guard_create: options.child_grace_ms=%d is not in 0..600000",
                   o->child_grace_ms);
  if (o->leak_report) return gg__parse_report("options.leak_report", o->leak_report, report);
  return gg__parse_report("GPUGUARD_LEAK_REPORT", gg__env("GPUGUARD_LEAK_REPORT"), report);
}

/* ---- the at-exit path --------------------------------------------------------------------------------- */

static void gg__teardown_all(enum gg__reason why, int code);

/* A cleanup that calls exit() from inside the exit-path teardown starts a nested exit(), which runs
 * only the handlers not yet run: gg__at_exit is one of those already running. So the exit path first
 * registers a second handler (run by the nested exit, or after this one returns, when it finds nothing
 * left to do) that resumes the teardown the cleanup interrupted. */
#ifdef __GLIBC__
static void gg__at_exit_resume(int status, void *arg) {
  (void)arg;
  gg__teardown_all(GG__BY_EXIT, status);
}
static void gg__at_exit(int status, void *arg) {
  (void)arg;
  on_exit(gg__at_exit_resume, NULL);
  gg__sig_set_exiting(true);
  gg__teardown_all(GG__BY_EXIT, status);
  gg__sig_set_exiting(false);
}
static void gg__register_exit(void) { on_exit(gg__at_exit, NULL); }
#else
/* Without on_exit() the status is unknown: a watchdog ending a hung teardown exits with 1. */
static void gg__at_exit_resume(void) { gg__teardown_all(GG__BY_EXIT, 1); }
static void gg__at_exit(void) {
  atexit(gg__at_exit_resume);
  gg__sig_set_exiting(true);
  gg__teardown_all(GG__BY_EXIT, 1);
  gg__sig_set_exiting(false);
}
static void gg__register_exit(void) { atexit(gg__at_exit); }
#endif
static pthread_once_t gg__exit_once = PTHREAD_ONCE_INIT;

/* ---- the live list ------------------------------------------------------------------------------------ */

static void gg__free(gg_guard_t *g) {
  /* A child recorded after the teardown's look at the set (a spawn racing the teardown) is ended now,
   * not forgotten; then the set goes, since the key may be reused. */
  if (g->fork_gen == gg__fork_generation()) {
    gg__err_saved_t saved;
    gg__err_save(&saved);
    gg__proc_teardown_set(g, 0, NULL);
    gg__err_restore(&saved);
    gg__proc_forget_set(g);
  }
  pthread_mutex_destroy(&g->lock);
  pthread_cond_destroy(&g->cond);
  free(g->entries);
  free(g);
}

/* Drops a reference; call with the live-list lock held. Returns the guard to free, or NULL. */
static gg_guard_t *gg__unref_locked(gg_guard_t *g) { return --g->refs == 0 ? g : NULL; }

static void gg__unref(gg_guard_t *g) {
  pthread_mutex_lock(&gg__live.lock);
  gg_guard_t *dead = gg__unref_locked(g);
  pthread_mutex_unlock(&gg__live.lock);
  if (dead) gg__free(dead);
}

/* Finds a handle among the live guards without touching it (a freed handle is never dereferenced). */
static bool gg__known(const gg_guard_t *g) {
  for (const gg_guard_t *p = gg__live.head; p; p = p->next)
    if (p == g) return true;
  return false;
}

/* Checks a handle for a call; on success returns with the live-list and guard locks held. */
static int gg__enter(gg_guard_t *g, const char *call) {
  if (!g) return gg__err(GG_EINVAL, "%s: guard is NULL", call);
  pthread_mutex_lock(&gg__live.lock);
  if (!gg__known(g)) {
    pthread_mutex_unlock(&gg__live.lock);
    return gg__err(GG_EINVAL, "%s: %p is not a live guard (destroyed already?)", call, (void *)g);
  }
  int rc = gg__check_fork(g->fork_gen, call);
  if (rc < 0) {
    pthread_mutex_unlock(&gg__live.lock);
    return rc;
  }
  pthread_mutex_lock(&g->lock);
  if (g->state != GG__LIVE || g->destroying) {
    /* The message first: once unlocked, another thread may free g. */
    rc = gg__err(GG_ESTATE, "%s: the guard '%s' is being torn down or was torn down", call, g->name);
    pthread_mutex_unlock(&g->lock);
    pthread_mutex_unlock(&gg__live.lock);
    return rc;
  }
  return 0;
}

static void gg__leave(gg_guard_t *g) {
  pthread_mutex_unlock(&g->lock);
  pthread_mutex_unlock(&gg__live.lock);
}

/* The process part asks this before it records a child for a guard (proc.c's key check). */
static int gg__check_live_key(const void *key, const char *call) {
  gg_guard_t *g = (gg_guard_t *)(uintptr_t)key; /* only compared until gg__known() vouches for it */
  int rc = gg__enter(g, call);
  if (rc == 0) gg__leave(g);
  return rc;
}

/* Appends an entry; call with the live-list and guard locks held. */
static int gg__push(gg_guard_t *g, gg_cleanup_fn fn, void *user, const gg__attach_ops_t *ops,
                    const char *name, unsigned long long *id) {
  gg__entry_t *grown = gg__vec_reserve(g->entries, &g->cap, g->n + 1, sizeof *g->entries);
  if (!grown) return gg__err(GG_ENOMEM, "gg_guard_on_teardown: out of host memory");
  g->entries = grown;
  gg__entry_t *e = &g->entries[g->n++];
  e->id = ++gg__live.next_id, e->fn = fn, e->user = user, e->ops = ops;
  gg__strlcpy(e->name, name ? name : "cleanup", sizeof e->name);
  if (id) *id = e->id;
  return 0;
}

static void gg__teardown_for_signal(int sig);

/* Gives the lower layers what they call back, once per process (under the live-list lock): the
 * process part's fatal kill goes into the crash-hook table, and spawn/adopt ask us about a guard. */
static int gg__wire_locked(void) {
  if (gg__live.wired) return 0;
  int slot;
  int rc = gg__crash_hook_add(gg__proc_fatal_kill, NULL, &slot);
  if (rc < 0) return rc;
  gg__proc_set_key_check(gg__check_live_key);
  gg__live.wired = true;
  return 0;
}

int gg_guard_create(gg_guard_t **guard, const gg_guard_options_t *opts) {
  if (!guard) return gg__err(GG_EINVAL, "gg_guard_create: guard is NULL");
  gg_guard_options_t defaults;
  if (!opts) gg_guard_options_init(&defaults), opts = &defaults;
  gg__report_opts_t report;
  int rc = gg__check_options(opts, &report);
  if (rc < 0) return rc;
  gg_guard_t *g = calloc(1, sizeof *g);
  if (!g) return gg__err(GG_ENOMEM, "gg_guard_create: out of host memory");
  g->fork_gen = gg__fork_generation();
  g->signals = opts->signals, g->run_at_exit = opts->run_at_exit, g->reset_context = opts->reset_context;
  g->timeout_ms = opts->teardown_timeout_ms, g->device = opts->device, g->report = report;
  g->grace_ms = opts->child_grace_ms;
  gg__strlcpy(g->name, opts->name ? opts->name : "guard", sizeof g->name);
  g->refs = 1;
  pthread_mutex_init(&g->lock, NULL);
  pthread_cond_init(&g->cond, NULL);
  if ((rc = gg__dev_open(opts->backend, opts->device, &g->dev)) < 0) {
    gg__free(g);
    return rc;
  }
  g->backend = g->dev->ops->name;
  /* Also without run_at_exit: a cleanup that calls exit() during gg_guard_destroy() must not lose the
   * cleanups registered before it (the exit path finishes this guard's teardown). */
  pthread_once(&gg__exit_once, gg__register_exit);
  pthread_mutex_lock(&gg__live.lock);
  rc = gg__wire_locked();
  if (rc == 0) rc = gg__sig_acquire(g->signals, gg__teardown_for_signal);
  if (rc == 0) g->next = gg__live.head, gg__live.head = g;
  pthread_mutex_unlock(&gg__live.lock);
  if (rc < 0) {
    gg__dev_close(g->dev);
    gg__free(g);
    return rc;
  }
  *guard = g;
  return 0;
}

int gg_guard_on_teardown_ex(gg_guard_t *guard, gg_cleanup_fn fn, void *user, const char *name,
                            unsigned long long *id) {
  if (!fn) return gg__err(GG_EINVAL, "gg_guard_on_teardown: fn is NULL");
  int rc = gg__enter(guard, "gg_guard_on_teardown");
  if (rc < 0) return rc;
  rc = gg__push(guard, fn, user, NULL, name, id);
  gg__leave(guard);
  return rc;
}

int gg_guard_on_teardown(gg_guard_t *guard, gg_cleanup_fn fn, void *user, const char *name) {
  return gg_guard_on_teardown_ex(guard, fn, user, name, NULL);
}

/* Removes entry id from g; call with g's lock held. */
static bool gg__remove(gg_guard_t *g, unsigned long long id) {
  for (size_t i = g->n; i-- > 0;) {
    if (g->entries[i].id != id) continue;
    memmove(&g->entries[i], &g->entries[i + 1], (g->n - i - 1) * sizeof *g->entries);
    g->n--;
    return true;
  }
  return false;
}

int gg_guard_cancel(gg_guard_t *guard, unsigned long long id) {
  if (id == 0) return gg__err(GG_EINVAL, "gg_guard_cancel: id 0 is never a registration");
  int rc = gg__enter(guard, "gg_guard_cancel");
  if (rc < 0) return rc;
  if (!gg__remove(guard, id)) /* the message while locked: once unlocked, another thread may free it */
    rc = gg__err(GG_ENOTFOUND, "gg_guard_cancel: guard '%s' holds no registration %llu (cancelled already?)",
                 guard->name, id);
  gg__leave(guard);
  return rc;
}

/* ---- attached objects --------------------------------------------------------------------------------- */

int gg__guard_attach(const char *backend, int device, const gg__attach_ops_t *ops, void *obj,
                     unsigned long long *token) {
  *token = 0;
  unsigned gen = gg__fork_generation();
  int rc = 0;
  pthread_mutex_lock(&gg__live.lock);
  for (gg_guard_t *g = gg__live.head; g; g = g->next) {
    if (g->fork_gen != gen || g->destroying || g->device != device || strcmp(g->backend, backend) != 0)
      continue;
    pthread_mutex_lock(&g->lock);
    bool live = g->state == GG__LIVE;
    if (live) rc = gg__push(g, NULL, obj, ops, ops->kind, token);
    pthread_mutex_unlock(&g->lock);
    if (live) break;
  }
  pthread_mutex_unlock(&gg__live.lock);
  return rc;
}

int gg__guard_detach(unsigned long long token) {
  if (token == 0) return 0;
  pthread_mutex_lock(&gg__live.lock);
  unsigned gen = gg__fork_generation();
  for (gg_guard_t *g = gg__live.head; g; g = g->next) {
    if (g->fork_gen != gen) continue; /* a parent's guard: its lock may have been held at fork() */
    pthread_mutex_lock(&g->lock);
    if (gg__remove(g, token)) {
      pthread_mutex_unlock(&g->lock);
      pthread_mutex_unlock(&gg__live.lock);
      return 1;
    }
    if (g->running == token) {
      /* The teardown is working on this object now: wait for that step, without the live-list lock. */
      g->refs++;
      pthread_mutex_unlock(&gg__live.lock);
      while (g->running == token) pthread_cond_wait(&g->cond, &g->lock);
      pthread_mutex_unlock(&g->lock);
      gg__unref(g);
      return 0;
    }
    pthread_mutex_unlock(&g->lock);
  }
  pthread_mutex_unlock(&gg__live.lock);
  return 0;
}

/* ---- the leak report ---------------------------------------------------------------------------------- */

/* Surviving blocks of one tag allocated at one site (GG_ARENA_BACKTRACE). */
typedef struct gg__site_row {
  const void *key; /* the arena's interned frames: one per site, alive while the visit lasts */
  void *pc[8];
  int n;
  unsigned long long count, bytes;
} gg__site_row_t;

typedef struct gg__tag_row {
  char tag[64];
  unsigned long long count, bytes;
  gg__site_row_t *sites;
  size_t n_sites, cap_sites;
} gg__tag_row_t;

#define GG__REPORT_TOP_SITES 3 /* sites printed under each tag, most bytes first */

typedef struct gg__obj_row {
  char name[64], backend[16];
  unsigned long long count, bytes;
  gg__tag_row_t *tags;
  size_t n_tags, cap_tags;
  bool truncated; /* out of host memory while grouping */
} gg__obj_row_t;

typedef struct gg__report {
  gg__obj_row_t *objs;
  size_t n_objs, cap_objs;
  unsigned long long count, bytes;
} gg__report_t;

/* Counts a block under its site in tag row t. */
static void gg__visit_site(gg__obj_row_t *o, gg__tag_row_t *t, const gg_block_info_t *b) {
  if (b->n_frames <= 0 || !b->frames) return;
  for (size_t i = 0; i < t->n_sites; i++) {
    if (t->sites[i].key == (const void *)b->frames) {
      t->sites[i].count++, t->sites[i].bytes += b->size;
      return;
    }
  }
  gg__site_row_t *r = gg__vec_reserve(t->sites, &t->cap_sites, t->n_sites + 1, sizeof *r);
  if (!r) {
    o->truncated = true;
    return;
  }
  t->sites = r;
  r = &t->sites[t->n_sites++];
  r->key = b->frames, r->n = b->n_frames < 8 ? b->n_frames : 8, r->count = 1, r->bytes = b->size;
  memcpy(r->pc, b->frames, (size_t)r->n * sizeof *r->pc);
}

static int gg__visit_block(const gg_block_info_t *b, void *user) {
  gg__obj_row_t *o = user;
  const char *tag = b->tag ? b->tag : "";
  o->count++, o->bytes += b->size;
  for (size_t i = 0; i < o->n_tags; i++) {
    if (strcmp(o->tags[i].tag, tag) == 0) {
      o->tags[i].count++, o->tags[i].bytes += b->size;
      gg__visit_site(o, &o->tags[i], b);
      return 0;
    }
  }
  gg__tag_row_t *t = gg__vec_reserve(o->tags, &o->cap_tags, o->n_tags + 1, sizeof *t);
  if (!t) return (o->truncated = true), 0;
  o->tags = t;
  t = &o->tags[o->n_tags++];
  memset(t, 0, sizeof *t);
  gg__strlcpy(t->tag, tag, sizeof t->tag);
  t->count = 1, t->bytes = b->size;
  gg__visit_site(o, t, b);
  return 0;
}

static int gg__site_row_cmp(const void *x, const void *y) {
  const gg__site_row_t *a = x, *b = y;
  return a->bytes != b->bytes ? (a->bytes < b->bytes ? 1 : -1)
                              : (a->count < b->count) - (a->count > b->count);
}

/* The sites under one tag (sorted, most bytes first): the top few, each frame named. */
static void gg__render_sites(FILE *f, const gg__tag_row_t *t, bool json) {
  size_t shown = t->n_sites < GG__REPORT_TOP_SITES ? t->n_sites : GG__REPORT_TOP_SITES;
  char name[512];
  if (json) fputs(",\"sites\":[", f);
  for (size_t i = 0; i < shown; i++) {
    const gg__site_row_t *r = &t->sites[i];
    if (json)
      fprintf(f, "%s{\"count\":%llu,\"bytes\":%llu,\"frames\":[", i ? "," : "", r->count, r->bytes);
    else
      fprintf(f, "gpuguard:       %llu block%s, %llu bytes allocated at:\n", r->count,
              r->count == 1 ? "" : "s", r->bytes);
    for (int k = 0; k < r->n; k++) {
      gg__site_name(r->pc[k], name, sizeof name);
      if (json)
        fputs(k ? "," : "", f), gg__json_fputs(f, name);
      else
        fprintf(f, "gpuguard:         #%d %s\n", k, name);
    }
    if (json) fputs("]}", f);
  }
  if (json)
    fputs("]", f);
  else if (t->n_sites > shown)
    fprintf(f, "gpuguard:       (%zu more site%s)\n", t->n_sites - shown, t->n_sites - shown == 1 ? "" : "s");
}

/* Adds an attached object's live blocks (before its teardown releases them). */
static void gg__report_add(gg__report_t *r, const gg__entry_t *e) {
  if (!e->ops->foreach_block) return;
  gg__obj_row_t *objs = gg__vec_reserve(r->objs, &r->cap_objs, r->n_objs + 1, sizeof *objs);
  if (!objs) return;
  r->objs = objs;
  gg__obj_row_t *o = &objs[r->n_objs];
  memset(o, 0, sizeof *o);
  gg__strlcpy(o->name, e->ops->name ? e->ops->name(e->user) : e->ops->kind, sizeof o->name);
  gg__strlcpy(o->backend, e->ops->backend ? e->ops->backend(e->user) : "", sizeof o->backend);
  gg__err_saved_t saved;
  gg__err_save(&saved);
  e->ops->foreach_block(e->user, gg__visit_block, o);
  gg__err_restore(&saved);
  for (size_t k = 0; k < o->n_tags; k++)
    if (o->tags[k].n_sites > 1) /* none: sites is NULL, which qsort must not be given */
      qsort(o->tags[k].sites, o->tags[k].n_sites, sizeof *o->tags[k].sites, gg__site_row_cmp);
  if (o->count == 0) {
    free(o->tags);
    return; /* nothing leaked: not listed */
  }
  r->n_objs++, r->count += o->count, r->bytes += o->bytes;
}

static void gg__report_render(FILE *f, const gg_guard_t *g, const gg__report_t *r, enum gg__reason why,
                              int code) {
  char how[64];
  if (why == GG__BY_SIGNAL)
    snprintf(how, sizeof how, "%s", gg__sig_name(code));
  else
    snprintf(how, sizeof how, "%s", gg__reason_name(why));
  if (g->report.json) {
    fprintf(f, "{\"gpuguard\":\"leak_report\",\"pid\":%ld,\"guard\":", (long)getpid());
    gg__json_fputs(f, g->name);
    fprintf(f, ",\"teardown\":\"%s\",\"live_blocks\":%llu,\"live_bytes\":%llu,\"arenas\":[", how, r->count,
            r->bytes);
    for (size_t i = 0; i < r->n_objs; i++) {
      const gg__obj_row_t *o = &r->objs[i];
      fputs(i ? ",{\"name\":" : "{\"name\":", f);
      gg__json_fputs(f, o->name);
      fputs(",\"backend\":", f);
      gg__json_fputs(f, o->backend);
      fprintf(f, ",\"live_blocks\":%llu,\"live_bytes\":%llu,\"truncated\":%s,\"tags\":[", o->count, o->bytes,
              o->truncated ? "true" : "false");
      for (size_t k = 0; k < o->n_tags; k++) {
        fputs(k ? ",{\"tag\":" : "{\"tag\":", f);
        gg__json_fputs(f, o->tags[k].tag);
        fprintf(f, ",\"count\":%llu,\"bytes\":%llu", o->tags[k].count, o->tags[k].bytes);
        if (o->tags[k].n_sites) gg__render_sites(f, &o->tags[k], true);
        fputc('}', f);
      }
      fputs("]}", f);
    }
    fputs("]}\n", f);
    return;
  }
  fprintf(f,
          "gpuguard: leak report of guard '%s' (pid %ld, teardown by %s): %llu live block%s, %llu bytes in "
          "%zu arena%s\n",
          g->name, (long)getpid(), how, r->count, r->count == 1 ? "" : "s", r->bytes, r->n_objs,
          r->n_objs == 1 ? "" : "s");
  for (size_t i = 0; i < r->n_objs; i++) {
    const gg__obj_row_t *o = &r->objs[i];
    fprintf(f, "gpuguard:   arena '%s' (%s): %llu live block%s, %llu bytes%s\n", o->name, o->backend,
            o->count, o->count == 1 ? "" : "s", o->bytes,
            o->truncated ? " (some tags left out: out of memory)" : "");
    for (size_t k = 0; k < o->n_tags; k++) {
      fprintf(f, "gpuguard:     tag '%s': %llu block%s, %llu bytes\n",
              o->tags[k].tag[0] ? o->tags[k].tag : "(none)", o->tags[k].count,
              o->tags[k].count == 1 ? "" : "s", o->tags[k].bytes);
      if (o->tags[k].n_sites) gg__render_sites(f, &o->tags[k], false);
    }
  }
}

/* A report file is a regular file: a symbolic link is not followed (root appending its report to the
 * file another user's link names) and a FIFO or device is refused at once (opening a FIFO nobody reads
 * blocks, and the teardown with it, past any signal). -1 with a message on stderr. */
static int gg__report_open(const gg_guard_t *g) {
  int fd = open(g->report.path,
                O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0644);
  struct stat st;
  const char *why = fd < 0 ? strerror(errno) : NULL;
  if (fd < 0 && errno == ELOOP) why = "a symbolic link (not followed)";
  if (fd < 0 && errno == ENXIO) why = "a FIFO nobody reads (not a regular file)";
  if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) why = "not a regular file";
  if (!why) return fd;
  if (fd >= 0) close(fd);
  fprintf(stderr, "gpuguard: guard '%s': cannot open the leak report file '%s': %s\n", g->name,
          g->report.path, why);
  return -1;
}

/* Writes len bytes within about two seconds in all: stdout or stderr may be a pipe nobody reads, and a
 * teardown must end. After poll says there is room, a write of at most PIPE_BUF bytes does not block. */
static void gg__report_write(int fd, const char *buf, size_t len) {
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (size_t off = 0; off < len;) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    long spent = (long)(now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    int ready = spent >= 2000 ? 0 : poll(&pf, 1, (int)(2000 - spent));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0 || (pf.revents & (POLLERR | POLLHUP | POLLNVAL))) return;
    size_t chunk = len - off < PIPE_BUF ? len - off : PIPE_BUF;
    ssize_t w = write(fd, buf + off, chunk);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) return;
    off += (size_t)w;
  }
}

/* Renders into memory first, so the report reaches its destination in one write. */
static void gg__report_emit(const gg_guard_t *g, gg__report_t *r, enum gg__reason why, int code) {
  if (g->report.dest == GG__TO_NONE || (!g->report.asked && r->count == 0)) return;
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  if (!m) return;
  gg__report_render(m, g, r, why, code);
  fclose(m);
  int fd = g->report.dest == GG__TO_STDOUT ? 1 : 2;
  bool own = g->report.dest == GG__TO_FILE;
  if (own) fd = gg__report_open(g);
  if (g->report.dest == GG__TO_STDOUT) fflush(stdout);
  if (fd >= 0) gg__report_write(fd, buf, len);
  if (own && fd >= 0) close(fd);
  free(buf);
}

static void gg__report_free(gg__report_t *r) {
  for (size_t i = 0; i < r->n_objs; i++) {
    for (size_t k = 0; k < r->objs[i].n_tags; k++) free(r->objs[i].tags[k].sites);
    free(r->objs[i].tags);
  }
  free(r->objs);
}

/* ---- the teardown ------------------------------------------------------------------------------------- */

/* Pops and runs the cleanups still registered, newest first; with g's lock held, which it drops around
 * each one. Attached objects add their live blocks to the report before they are released. */
static void gg__run_cleanups_locked(gg_guard_t *g, gg__report_t *report) {
  while (g->n > 0) {
    gg__entry_t e = g->entries[--g->n];
    g->running = e.id;
    pthread_mutex_unlock(&g->lock);
    if (e.ops) {
      gg__report_add(report, &e);
      e.ops->teardown(e.user);
    } else {
      e.fn(e.user);
    }
    pthread_mutex_lock(&g->lock);
    g->running = 0;
    pthread_cond_broadcast(&g->cond);
  }
}

/* After the cleanups: the child processes (bounded: grace + about 300 ms, so the watchdog limit should
 * allow for it), the leak report, the context, then the guard is dead. */
static int gg__finish_teardown(gg_guard_t *g, enum gg__reason why, int code, gg__report_t *report) {
  pthread_mutex_lock(&g->lock);
  gg__dev_t *dev = g->dev;
  g->dev = NULL;
  pthread_mutex_unlock(&g->lock);
  int rc = gg__proc_teardown_set(g, g->grace_ms, NULL);
  if (rc < 0 && why != GG__BY_DESTROY)
    fprintf(stderr, "gpuguard: guard '%s': ending its child processes: %s\n", g->name, gg_last_error());
  gg__report_emit(g, report, why, code);
  gg__report_free(report);
  if (g->reset_context && dev) {
    int r = dev->ops->ctx_reset(dev);
    if (rc == 0) rc = r;
    if (r < 0 && why != GG__BY_DESTROY)
      fprintf(stderr, "gpuguard: guard '%s': context reset at teardown failed: %s\n", g->name,
              gg_last_error());
  }
  gg__dev_close(dev);
  pthread_mutex_lock(&g->lock);
  g->state = GG__DEAD;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->lock);
  return rc;
}

/* Runs g's teardown once. code: the signal (GG__BY_SIGNAL) or the exit status (GG__BY_EXIT). */
static int gg__teardown(gg_guard_t *g, enum gg__reason why, int code) {
  pthread_mutex_lock(&g->lock);
  if (g->state == GG__TEARING && pthread_equal(g->owner, pthread_self())) {
    pthread_mutex_unlock(&g->lock);
    return gg__err(GG_ESTATE, "guard '%s': teardown called from one of its own cleanups", g->name);
  }
  if (g->state != GG__LIVE) {
    while (g->state != GG__DEAD) pthread_cond_wait(&g->cond, &g->lock); /* another thread's teardown */
    pthread_mutex_unlock(&g->lock);
    return 0;
  }
  g->state = GG__TEARING, g->owner = pthread_self();
  bool watched = why != GG__BY_DESTROY && g->timeout_ms > 0;
  int wd = watched ? gg__watchdog_arm(why == GG__BY_SIGNAL ? GG__WD_BY_SIGNAL : GG__WD_BY_EXIT, code,
                                      g->timeout_ms, g->name)
                   : 0;
  gg__report_t report = {0};
  gg__run_cleanups_locked(g, &report);
  pthread_mutex_unlock(&g->lock);
  int rc = gg__finish_teardown(g, why, code, &report);
  gg__watchdog_disarm(wd);
  return rc;
}

/* A cleanup of g called exit(): this thread's teardown of g will never resume, so the exit path
 * finishes it here, on the same stack: the cleanups registered before that one still run, once. */
static void gg__teardown_resume_on_exit(gg_guard_t *g, int code) {
  int wd = g->timeout_ms > 0 ? gg__watchdog_arm(GG__WD_BY_EXIT, code, g->timeout_ms, g->name) : 0;
  gg__report_t report = {0};
  pthread_mutex_lock(&g->lock);
  gg__run_cleanups_locked(g, &report);
  pthread_mutex_unlock(&g->lock);
  gg__finish_teardown(g, GG__BY_EXIT, code, &report);
  gg__watchdog_disarm(wd);
}

/* Picks the next guard the path covers (newest first, each once per pass); under the live-list lock.
 * *resume is set for a guard this thread is tearing down already (a cleanup called exit()). */
static gg_guard_t *gg__pick_locked(enum gg__reason why, int code, unsigned long long pass, bool *resume) {
  unsigned gen = gg__fork_generation(), bit = why == GG__BY_SIGNAL ? gg__bit_of_sig(code) : 0;
  for (gg_guard_t *g = gg__live.head; g; g = g->next) {
    if (g->seen == pass || g->fork_gen != gen) continue; /* a forked child never runs its parent's */
    pthread_mutex_lock(&g->lock);
    bool mine = g->state == GG__TEARING && pthread_equal(g->owner, pthread_self());
    bool dead = g->state == GG__DEAD;
    pthread_mutex_unlock(&g->lock);
    bool covered = why == GG__BY_EXIT     ? g->run_at_exit || mine
                   : why == GG__BY_SIGNAL ? (g->signals & bit) != 0
                                          : true;
    if (!covered) continue;
    g->seen = pass;
    if (dead || (mine && why != GG__BY_EXIT)) continue;
    *resume = mine;
    g->refs++;
    return g;
  }
  return NULL;
}

/* Tears down every guard of this process that the path covers, newest first, each at most once. */
static void gg__teardown_all(enum gg__reason why, int code) {
  pthread_mutex_lock(&gg__live.lock);
  unsigned long long pass = ++gg__live.pass;
  for (;;) {
    bool resume = false;
    gg_guard_t *pick = gg__pick_locked(why, code, pass, &resume);
    pthread_mutex_unlock(&gg__live.lock);
    if (!pick) return;
    if (resume)
      gg__teardown_resume_on_exit(pick, code);
    else
      gg__teardown(pick, why, code);
    pthread_mutex_lock(&gg__live.lock);
    gg_guard_t *dead = gg__unref_locked(pick);
    if (dead) {
      pthread_mutex_unlock(&gg__live.lock);
      gg__free(dead);
      pthread_mutex_lock(&gg__live.lock);
    }
  }
}

static void gg__teardown_for_signal(int sig) { gg__teardown_all(GG__BY_SIGNAL, sig); }

int gg_guard_destroy(gg_guard_t *guard) {
  if (!guard) return 0;
  pthread_mutex_lock(&gg__live.lock);
  if (!gg__known(guard)) {
    pthread_mutex_unlock(&gg__live.lock);
    return gg__err(GG_EINVAL, "gg_guard_destroy: %p is not a live guard (destroyed already?)", (void *)guard);
  }
  int rc = gg__check_fork(guard->fork_gen, "gg_guard_destroy");
  if (rc == 0) {
    pthread_mutex_lock(&guard->lock);
    if (guard->state == GG__TEARING && pthread_equal(guard->owner, pthread_self()))
      rc =
          gg__err(GG_ESTATE, "gg_guard_destroy: called from a cleanup of the guard '%s' itself", guard->name);
    pthread_mutex_unlock(&guard->lock);
  }
  if (rc == 0 && guard->destroying)
    rc = gg__err(GG_EINVAL, "gg_guard_destroy: guard '%s' is being destroyed by another call", guard->name);
  if (rc < 0) {
    pthread_mutex_unlock(&gg__live.lock);
    return rc;
  }
  guard->destroying = true;
  pthread_mutex_unlock(&gg__live.lock);

  rc = gg__teardown(guard, GG__BY_DESTROY, 0);

  pthread_mutex_lock(&gg__live.lock);
  for (gg_guard_t **p = &gg__live.head; *p; p = &(*p)->next) {
    if (*p == guard) {
      *p = guard->next;
      break;
    }
  }
  gg__sig_release(guard->signals);
  gg_guard_t *dead = gg__unref_locked(guard);
  pthread_mutex_unlock(&gg__live.lock);
  if (dead) gg__free(dead);
  return rc;
}
