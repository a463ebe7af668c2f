/* guard.c — guards: the list of live guards, each guard's LIFO cleanups and attached objects, and
 * the teardown (cleanups, leak report, context reset and release) on every path: destroy, exit(),
 * signals. The leak report's grouping and writing are guard_report.c's. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "guard/guard_internal.h"
#include "guard/guard_report_internal.h"
#include "core/internal.h"
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
GG__FORK_REGISTER(GG__FORK_GUARDS, gg__guard_fork_prepare, gg__guard_fork_parent,
                  gg__guard_fork_child)

/* Why a teardown runs. */
enum gg__reason { GG__BY_DESTROY, GG__BY_EXIT, GG__BY_SIGNAL };

/* How a teardown came, as the leak report says it: the signal's name, the call, or "exit". */
static const char *gg__reason_how(enum gg__reason why, int code) {
  if (why == GG__BY_SIGNAL) return gg__sig_name(code);
  return why == GG__BY_DESTROY ? "gg_guard_destroy" : "exit";
}

/* ---- options --------------------------------------------------------------------------------- */

void gg_guard_options_init(gg_guard_options_t *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof *opts);
  opts->signals = GG_GUARD_SIGNALS_ALL;
  opts->run_at_exit = true;
  opts->teardown_timeout_ms = GG__DEFAULT_TIMEOUT_MS;
  opts->child_grace_ms = GG__DEFAULT_GRACE_MS;
}

static int gg__check_options(const gg_guard_options_t *o, gg__report_opts_t *report) {
  if (o->device < 0)
    return gg__err(GG_EINVAL, "gg_guard_create: options.device=%d is negative", o->device);
  if (o->signals & ~(unsigned)GG_GUARD_SIGNALS_ALL)
    return gg__err(GG_EINVAL,
                   "gg_guard_create: options.signals=0x%x has bits that are not GG_GUARD_SIG*",
                   o->signals);
  if (o->teardown_timeout_ms < 0)
    return gg__err(GG_EINVAL, "gg_guard_create: options.teardown_timeout_ms=%d is negative",
                   o->teardown_timeout_ms);
  if (o->child_grace_ms < 0 || o->child_grace_ms > 600000)
    return gg__err(GG_EINVAL, "gg_guard_create: options.child_grace_ms=%d is not in 0..600000",
                   o->child_grace_ms);
  if (o->leak_report) return gg__report_parse("options.leak_report", o->leak_report, report);
  return gg__report_parse("GPUGUARD_LEAK_REPORT", gg__env("GPUGUARD_LEAK_REPORT"), report);
}

/* ---- the at-exit path ------------------------------------------------------------------------ */

static void gg__teardown_all(enum gg__reason why, int code);

/* A cleanup that calls exit() from inside the exit-path teardown starts a nested exit(), which runs
 * only the handlers not yet run: gg__at_exit is one of those already running. So the exit path
 * first registers a second handler (run by the nested exit, or after this one returns, when it
 * finds nothing left to do) that resumes the teardown the cleanup interrupted. */
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

/* ---- the live list --------------------------------------------------------------------------- */

static void gg__free(gg_guard_t *g) {
  /* A child recorded after the teardown's look at the set (a spawn racing the teardown) is ended
   * now, not forgotten; then the set goes, since the key may be reused. */
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
static gg_guard_t *gg__unref_locked(gg_guard_t *g) {
  GG__ASSERT(g->refs > 0); /* a reference dropped twice would free a guard still in use */
  return --g->refs == 0 ? g : NULL;
}

static void gg__unref(gg_guard_t *g) {
  pthread_mutex_lock(&gg__live.lock);
  gg_guard_t *dead = gg__unref_locked(g);
  pthread_mutex_unlock(&gg__live.lock);
  if (dead) gg__free(dead);
}

/* Finds a handle among the live guards without touching it (a freed handle is never
 * dereferenced). */
static bool gg__known(const gg_guard_t *g) {
  for (const gg_guard_t *p = gg__live.head; p; p = p->next)
    if (p == g) return true;
  return false;
}

/* For GG__ASSERT_EXPENSIVE: the entries are in registration order (ids rising), which is what
 * makes popping from the end run the cleanups newest first; under g's lock. */
static bool gg__entries_in_order(const gg_guard_t *g) {
  for (size_t i = 1; i < g->n && i < GG__WALK_MAX; i++)
    if (g->entries[i - 1].id >= g->entries[i].id) return false;
  return true;
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
    rc =
        gg__err(GG_ESTATE, "%s: the guard '%s' is being torn down or was torn down", call, g->name);
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
  GG__ASSERT(g->state == GG__LIVE); /* a tearing guard has popped its list: a push is lost */
  gg__entry_t *grown = gg__vec_reserve(g->entries, &g->cap, g->n + 1, sizeof *g->entries);
  if (!grown) return gg__err(GG_ENOMEM, "gg_guard_on_teardown: out of host memory");
  g->entries = grown;
  gg__entry_t *e = &g->entries[g->n++];
  e->id = ++gg__live.next_id;
  e->fn = fn;
  e->user = user;
  e->ops = ops;
  gg__strlcpy(e->name, name ? name : "cleanup", sizeof e->name);
  if (id) *id = e->id;
  GG__ASSERT_EXPENSIVE(gg__entries_in_order(g));
  return 0;
}

static void gg__teardown_for_signal(int sig);

/* Gives the lower layers what they call back, once per process (under the live-list lock): the
 * process part's fatal kill goes into the crash-hook table, and spawn/adopt ask us about a
 * guard. */
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
  if (!opts) {
    gg_guard_options_init(&defaults);
    opts = &defaults;
  }
  gg__report_opts_t report;
  int rc = gg__check_options(opts, &report);
  if (rc < 0) return rc;
  gg_guard_t *g = calloc(1, sizeof *g);
  if (!g) return gg__err(GG_ENOMEM, "gg_guard_create: out of host memory");
  g->fork_gen = gg__fork_generation();
  g->signals = opts->signals;
  g->run_at_exit = opts->run_at_exit;
  g->reset_context = opts->reset_context;
  g->timeout_ms = opts->teardown_timeout_ms;
  g->device = opts->device;
  g->report = report;
  g->grace_ms = opts->child_grace_ms;
  gg__strlcpy(g->name, opts->name ? opts->name : "guard", sizeof g->name);
  g->refs = 1;
  pthread_mutex_init(&g->lock, NULL);
  pthread_cond_init(&g->cond, NULL);
  rc = gg__dev_open(opts->backend, opts->device, &g->dev);
  if (rc < 0) {
    gg__free(g);
    return rc;
  }
  g->backend = g->dev->ops->name;
  /* Also without run_at_exit: a cleanup that calls exit() during gg_guard_destroy() must not lose
   * the cleanups registered before it (the exit path finishes this guard's teardown). */
  pthread_once(&gg__exit_once, gg__register_exit);
  pthread_mutex_lock(&gg__live.lock);
  rc = gg__wire_locked();
  if (rc == 0) rc = gg__sig_acquire(g->signals, gg__teardown_for_signal);
  if (rc == 0) {
    GG__ASSERT_EXPENSIVE(!gg__known(g)); /* listed twice: destroy would unlink only one */
    g->next = gg__live.head;
    gg__live.head = g;
  }
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
    GG__ASSERT_EXPENSIVE(gg__entries_in_order(g));
    return true;
  }
  return false;
}

int gg_guard_cancel(gg_guard_t *guard, unsigned long long id) {
  if (id == 0) return gg__err(GG_EINVAL, "gg_guard_cancel: id 0 is never a registration");
  int rc = gg__enter(guard, "gg_guard_cancel");
  if (rc < 0) return rc;
  /* the message while locked: once unlocked, another thread may free it */
  if (!gg__remove(guard, id))
    rc = gg__err(GG_ENOTFOUND,
                 "gg_guard_cancel: guard '%s' holds no registration %llu (cancelled already?)",
                 guard->name, id);
  gg__leave(guard);
  return rc;
}

/* ---- attached objects ------------------------------------------------------------------------ */

int gg__guard_attach(const char *backend, int device, const gg__attach_ops_t *ops, void *obj,
                     unsigned long long *token) {
  *token = 0;
  unsigned gen = gg__fork_generation();
  int rc = 0;
  pthread_mutex_lock(&gg__live.lock);
  for (gg_guard_t *g = gg__live.head; g; g = g->next) {
    if (g->fork_gen != gen || g->destroying || g->device != device ||
        strcmp(g->backend, backend) != 0)
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
      /* The teardown is working on this object now: wait for that step, without the live-list
       * lock. */
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

/* ---- the teardown ---------------------------------------------------------------------------- */

/* Pops and runs the cleanups still registered, newest first; with g's lock held, which it drops
 * around each one. Attached objects add their live blocks to the report before they are
 * released. */
static void gg__run_cleanups_locked(gg_guard_t *g, gg__report_t *report) {
  /* Only the thread that moved the guard to TEARING pops entries: two poppers would run one
   * cleanup twice. */
  GG__ASSERT(g->state == GG__TEARING && pthread_equal(g->owner, pthread_self()));
  while (g->n > 0) {
    gg__entry_t e = g->entries[--g->n];
    g->running = e.id;
    pthread_mutex_unlock(&g->lock);
    if (e.ops) {
      gg__report_add(report, e.ops, e.user);
      e.ops->teardown(e.user);
    } else {
      e.fn(e.user);
    }
    pthread_mutex_lock(&g->lock);
    g->running = 0;
    pthread_cond_broadcast(&g->cond);
  }
}

/* After the cleanups: the child processes (bounded: grace + about 300 ms, so the watchdog limit
 * should allow for it), the leak report, the context, then the guard is dead. */
static int gg__finish_teardown(gg_guard_t *g, enum gg__reason why, int code, gg__report_t *report) {
  pthread_mutex_lock(&g->lock);
  gg__dev_t *dev = g->dev;
  g->dev = NULL;
  pthread_mutex_unlock(&g->lock);
  int rc = gg__proc_teardown_set(g, g->grace_ms, NULL);
  if (rc < 0 && why != GG__BY_DESTROY)
    fprintf(stderr, "gpuguard: guard '%s': ending its child processes: %s\n", g->name,
            gg_last_error());
  gg__report_emit(&g->report, g->name, report, gg__reason_how(why, code));
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
  /* States only move forward, and DEAD only after every cleanup ran (none registered since). */
  GG__ASSERT(g->state == GG__TEARING && g->n == 0);
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
    /* another thread's teardown */
    while (g->state != GG__DEAD) pthread_cond_wait(&g->cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
    return 0;
  }
  GG__ASSERT(g->running == 0); /* no cleanup runs before the teardown starts */
  g->state = GG__TEARING;
  g->owner = pthread_self();
  bool watched = why != GG__BY_DESTROY && g->timeout_ms > 0;
  int wd = watched ? gg__watchdog_arm(why == GG__BY_SIGNAL ? GG__WD_BY_SIGNAL : GG__WD_BY_EXIT,
                                      code, g->timeout_ms, g->name)
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

/* Picks the next guard the path covers (newest first, each once per pass); under the live-list
 * lock. *resume is set for a guard this thread is tearing down already (a cleanup called
 * exit()). */
static gg_guard_t *gg__pick_locked(enum gg__reason why, int code, unsigned long long pass,
                                   bool *resume) {
  unsigned gen = gg__fork_generation(), bit = why == GG__BY_SIGNAL ? gg__bit_of_sig(code) : 0;
  for (gg_guard_t *g = gg__live.head; g; g = g->next) {
    /* a forked child never runs its parent's */
    if (g->seen == pass || g->fork_gen != gen) continue;
    GG__ASSERT(g->seen < pass); /* passes only rise: an older pass would visit a guard twice */
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
    return gg__err(GG_EINVAL, "gg_guard_destroy: %p is not a live guard (destroyed already?)",
                   (void *)guard);
  }
  int rc = gg__check_fork(guard->fork_gen, "gg_guard_destroy");
  if (rc == 0) {
    pthread_mutex_lock(&guard->lock);
    if (guard->state == GG__TEARING && pthread_equal(guard->owner, pthread_self()))
      rc = gg__err(GG_ESTATE, "gg_guard_destroy: called from a cleanup of the guard '%s' itself",
                   guard->name);
    pthread_mutex_unlock(&guard->lock);
  }
  if (rc == 0 && guard->destroying)
    rc = gg__err(GG_EINVAL, "gg_guard_destroy: guard '%s' is being destroyed by another call",
                 guard->name);
  if (rc < 0) {
    pthread_mutex_unlock(&gg__live.lock);
    return rc;
  }
  GG__ASSERT(guard->refs > 0);
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
  GG__ASSERT_EXPENSIVE(!gg__known(guard)); /* unlinked, and listed once only */
  gg__sig_release(guard->signals);
  gg_guard_t *dead = gg__unref_locked(guard);
  pthread_mutex_unlock(&gg__live.lock);
  if (dead) gg__free(dead);
  return rc;
}
