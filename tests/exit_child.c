/* exit_child.c — one guarded program per exit path, judged from outside by test_exit_paths:
 * cleanups and hooks append lines to the file named by GG_CHILD_COUNTER; GG_CHILD_NO_GUARD=1 runs
 * the same path without gpuguard, so the harness can compare exit statuses. Usage: exit_child MODE.
 * */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "gpuguard/gpuguard.h"
#include "guard/guard_internal.h"
#include "guard/signal_internal.h"

static const char *counter_path;
static gg_guard_t *guard;
static volatile sig_atomic_t user_handler_ran;

/* Appends one line to the counter file: open, write, close are async-signal-safe. */
static void note(const char *line) {
  if (!counter_path) return;
  int fd = open(counter_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  char buf[256], *p = buf, *end = buf + sizeof buf - 1;
  p = gg__fmt_str(p, end, line);
  *p++ = '\n';
  ssize_t w = write(fd, buf, (size_t)(p - buf));
  (void)w;
  close(fd);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void cleanup_note(void *user) { note((const char *)user); }
static void cleanup_nothing(void *user) { (void)user; }

/* Blocks for a long time (a cleanup stuck in the driver). */
static void cleanup_hang(void *user) {
  note((const char *)user);
  for (int i = 0; i < 600; i++) sleep_ms(100);
  note("cleanup hang returned");
}

static void crash_hook(int sig, void *user) {
  (void)user;
  char buf[64], *p = buf, *end = buf + sizeof buf;
  p = gg__fmt_str(p, end, "crash-hook ");
  p = gg__fmt_str(p, end, sig ? gg__sig_name(sig) : "exit");
  *p = '\0';
  note(buf);
}

static void user_handler(int sig, siginfo_t *info, void *ctx) {
  (void)ctx;
  char buf[96], *p = buf, *end = buf + sizeof buf - 1;
  p = gg__fmt_str(p, end, "user-handler ");
  p = gg__fmt_str(p, end, gg__sig_name(sig));
  p = gg__fmt_str(p, end, " si_pid=");
  p = gg__fmt_u(p, end, info ? (unsigned long long)info->si_pid : 0);
  *p = '\0';
  note(buf);
  user_handler_ran = 1;
}

static void ready(void) {
  const char *fd = getenv("GG_CHILD_READY_FD");
  if (!fd) return;
  char b = 'R';
  ssize_t w = write(atoi(fd), &b, 1);
  (void)w;
  close(atoi(fd));
}

static _Noreturn void wait_for_signals(void) {
  for (;;) pause();
}

__attribute__((no_sanitize("address", "undefined"))) static void null_write(void) {
  volatile int *p = NULL;
  *p = 42;
}

/* A fake arena for the leak report: three live blocks in two tags. */
static int fake_foreach(void *obj, gg__held_visit_fn visit, void *user) {
  (void)obj;
  static const gg__held_block_t blocks[] = {
      {1024, "weights", 0, NULL}, {2048, "weights", 0, NULL}, {512, "", 0, NULL}};
  for (size_t i = 0; i < 3; i++)
    if (visit(&blocks[i], user)) break;
  return 0;
}
static const char *fake_name(void *obj) { return (void)obj, "fake-arena"; }
static const char *fake_backend(void *obj) { return (void)obj, "host"; }
static void fake_teardown(void *obj) { (void)obj, note("cleanup fake-arena"); }
static const gg__attach_ops_t fake_ops = {"arena", fake_teardown, fake_name, fake_backend,
                                          fake_foreach};

/* Threads busy inside guard calls while a signal arrives. */
static atomic_long busy_iterations;
static atomic_int stop_threads;

static void *register_cancel_loop(void *arg) {
  (void)arg;
  while (!atomic_load(&stop_threads)) {
    unsigned long long id = 0;
    if (gg_guard_on_teardown_ex(guard, cleanup_note, "cleanup W", "w", &id) != 0)
      break; /* torn down */
    if (gg_guard_cancel(guard, id) != 0) break;
    atomic_fetch_add(&busy_iterations, 1);
  }
  return NULL;
}

static void *create_destroy_loop(void *arg) {
  (void)arg;
  gg_guard_options_t o;
  gg_guard_options_init(&o);
  o.signals = GG_GUARD_SIGHUP, o.run_at_exit = false;
  while (!atomic_load(&stop_threads)) {
    gg_guard_t *g = NULL;
    if (gg_guard_create(&g, &o) != 0) continue;
    gg_guard_on_teardown(g, cleanup_nothing, NULL, "x");
    gg_guard_destroy(g);
    atomic_fetch_add(&busy_iterations, 1);
  }
  return NULL;
}

/* gpu-hold: device memory mapped through the backend in a context retained twice (like the CUDA
 * runtime or PyTorch would), then an explicit teardown while the process lives on, for the parent
 * to measure. GG_CHILD_GPU_LEAK=1: no cleanup unmaps it; GG_CHILD_EXTRA_RETAIN=1: the second retain
 * stays. */
static volatile sig_atomic_t go;
static void on_usr1(int sig) { (void)sig, go = 1; }
static gg__dev_t *extra;
static gg__chunk_t chunk;
static void unmap_chunk(void *user) {
  (void)user;
  if (extra->ops->unmap(extra, &chunk) == 0) note("cleanup unmap");
}
static void close_extra(void *user) {
  (void)user;
  gg__dev_close(extra);
  note("cleanup close-extra");
}

static int gpu_hold(void) {
  signal(SIGUSR1, on_usr1);
  size_t bytes = (size_t)1 << 30;
  int rc = gg__dev_open(NULL, 0, &extra);
  uintptr_t base = 0;
  if (rc == 0 && extra->contiguous) rc = extra->ops->va_reserve(extra, bytes, &base);
  if (rc == 0) rc = extra->ops->map(extra, base, bytes, &chunk);
  if (rc == 0)
    rc = extra->ops->set_d8(extra, chunk.ptr, 0x5a, bytes); /* touch it: really resident */
  if (rc != 0) {
    fprintf(stderr, "exit_child: gpu-hold: %s: %s\n", gg_err_name(rc), gg_last_error());
    return 71;
  }
  if (guard) {
    if (!getenv("GG_CHILD_EXTRA_RETAIN"))
      gg_guard_on_teardown(guard, close_extra, NULL, "close-extra");
    if (!getenv("GG_CHILD_GPU_LEAK")) gg_guard_on_teardown(guard, unmap_chunk, NULL, "unmap");
  }
  ready();
  while (!go) sleep_ms(2);
  gg_guard_destroy(guard);
  note("gpu torn down");
  wait_for_signals();
}

/* Threads busy inside arena calls while a signal arrives. */
static void *arena_loop(void *arg) {
  gg_arena_t *a = arg;
  while (!atomic_load(&stop_threads)) {
    void *p;
    if (gg_alloc_ex(a, 8192, 0, "loop", &p) != 0) break; /* torn down */
    if (gg_free(a, p) != 0) break;
    atomic_fetch_add(&busy_iterations, 1);
  }
  return NULL;
}

/* A child process in the guard's set: a sleeper that only the guard's teardown (or crash path)
 * ends. */
static void spawn_sleeper(void) {
  const char *const argv[] = {"/bin/sleep", "300", NULL};
  pid_t pid = 0;
  int rc = gg_proc_spawn(guard, argv, NULL, &pid);
  char line[64], *p = line, *end = line + sizeof line - 1;
  p = gg__fmt_str(p, end, rc == 0 ? "sleeper " : "sleeper FAILED ");
  p = gg__fmt_u(p, end, rc == 0 ? (unsigned long long)pid : (unsigned long long)-rc);
  *p = '\0';
  note(line);
}

static int do_fork(void) {
  pid_t a = fork();
  if (a == 0) {
    int rc = guard ? gg_guard_on_teardown(guard, cleanup_note, "cleanup FORKED", "f") : GG_ESTATE;
    note(rc == GG_ESTATE ? "grandchild refused" : "grandchild NOT refused");
    struct sigaction cur;
    sigaction(SIGTERM, NULL, &cur);
    note(!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_DFL
             ? "grandchild SIGTERM default"
             : "grandchild SIGTERM NOT default");
    exit(0); /* must not run the parent's cleanups */
  }
  pid_t b = fork();
  if (b == 0) {
    raise(SIGTERM); /* must die at once, without any teardown */
    _exit(99);
  }
  int st_a = -1, st_b = -1;
  waitpid(a, &st_a, 0);
  waitpid(b, &st_b, 0);
  note(WIFEXITED(st_a) && WEXITSTATUS(st_a) == 0 ? "grandchild exit 0" : "grandchild exit BAD");
  note(WIFSIGNALED(st_b) && WTERMSIG(st_b) == SIGTERM ? "grandchild2 SIGTERM" : "grandchild2 BAD");
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: exit_child MODE\n");
    return 2;
  }
  const char *mode = argv[1];
  counter_path = getenv("GG_CHILD_COUNTER");
  bool guarded = !getenv("GG_CHILD_NO_GUARD");

  if (strcmp(mode, "handler") == 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = user_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
  }
  if (strcmp(mode, "ignore") == 0) signal(SIGHUP, SIG_IGN);

  if (guarded) {
    gg_guard_options_t o;
    gg_guard_options_init(&o);
    o.name = "child";
    o.reset_context = getenv("GG_CHILD_RESET") != NULL;
    const char *t = getenv("GG_CHILD_TIMEOUT_MS");
    if (t) o.teardown_timeout_ms = atoi(t);
    int rc = gg_guard_create(&guard, &o);
    if (rc != 0) {
      fprintf(stderr, "exit_child: gg_guard_create: %s: %s\n", gg_err_name(rc), gg_last_error());
      return 70;
    }
    int slot;
    gg__crash_hook_add(crash_hook, NULL, &slot);
    gg_guard_on_teardown(guard, cleanup_note, "cleanup A", "a");
    if (!strcmp(mode, "hang") || !strcmp(mode, "hang-exit"))
      gg_guard_on_teardown(guard, cleanup_hang, "cleanup B begin", "b");
    else if (!strcmp(mode, "sigint2"))
      gg_guard_on_teardown(guard, cleanup_hang, "cleanup B begin", "b");
    else
      gg_guard_on_teardown(guard, cleanup_note, "cleanup B", "b");
    if (!strcmp(mode, "leak")) {
      unsigned long long token;
      gg__guard_attach("host", 0, &fake_ops, NULL, &token);
      if (!token) note("attach FAILED");
    }
  }

  gg_arena_t *arena = NULL;
  if (guard && (!strcmp(mode, "arena-leak") || !strcmp(mode, "thread-arena"))) {
    gg_arena_options_t ao;
    gg_arena_options_init(&ao);
    ao.name = "child-arena", ao.capacity = 64u << 20;
    if (gg_arena_create(&arena, &ao) != 0) note("arena FAILED");
    void *p;
    if (!strcmp(mode, "arena-leak")) {
      gg_alloc_ex(arena, 4096, 0, "activations", &p);
      gg_alloc_ex(arena, 8192, 0, "activations", &p);
      gg_alloc_ex(arena, 1000, 0, "optimizer", &p);
    }
  }
  if (guard && (!strcmp(mode, "children") || !strcmp(mode, "children-segv"))) spawn_sleeper();
  if (!strcmp(mode, "thread-arena") && arena) {
    pthread_t t1, t2;
    pthread_create(&t1, NULL, arena_loop, arena);
    pthread_create(&t2, NULL, arena_loop, arena);
    while (atomic_load(&busy_iterations) < 2000) sleep_ms(1);
  }
  if (!strcmp(mode, "thread")) {
    pthread_t t1, t2;
    pthread_create(&t1, NULL, register_cancel_loop, NULL);
    pthread_create(&t2, NULL, create_destroy_loop, NULL);
    while (guard && atomic_load(&busy_iterations) < 2000) sleep_ms(1);
  }

  if (!strcmp(mode, "gpu-hold")) return gpu_hold(); /* says ready itself, once the memory is held */
  ready();
  if (!strcmp(mode, "return") || !strcmp(mode, "leak") || !strcmp(mode, "arena-leak")) return 0;
  if (!strcmp(mode, "exit3") || !strcmp(mode, "hang-exit")) exit(3);
  if (!strcmp(mode, "abort")) abort();
  if (!strcmp(mode, "segv") || !strcmp(mode, "children-segv")) null_write();
  if (!strcmp(mode, "fork")) return do_fork();
  if (!strcmp(mode, "handler")) {
    while (!user_handler_ran) sleep_ms(5);
    return 5;
  }
  if (!strcmp(mode, "wait") || !strcmp(mode, "ignore") || !strcmp(mode, "hang") ||
      !strcmp(mode, "sigint2") || !strcmp(mode, "thread") || !strcmp(mode, "thread-arena") ||
      !strcmp(mode, "children"))
    wait_for_signals();
  fprintf(stderr, "exit_child: unknown mode '%s'\n", mode);
  return 2;
}
