/* proc_test_util.h — what test_proc.c and test_proc_teardown.c share: deadlines, waits for a
 * process to be gone or in a state, pid pipes, a quiet guard, spawning that must succeed, receipt
 * lookups. */
#ifndef GG_PROC_TEST_UTIL_H
#define GG_PROC_TEST_UTIL_H

#define PROC_CHILD GG_TEST_BINARY_DIR "/proc_child"

static inline double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline void nap_ms(int ms) {
  struct timespec ts = {0, ms * 1000000L};
  nanosleep(&ts, NULL);
}

/* Gone: no such process, or a zombie (it holds nothing any more). */
static inline bool gone(pid_t pid) {
  gg__pinfo_t info;
  return gg__proc_read_stat(pid, &info) != 0 || info.state == 'Z' || info.state == 'X';
}

/* Polls until every pid is gone; returns the ms it took, or -1 at the deadline. */
static inline double wait_all_gone(const pid_t *pids, size_t n, int deadline_ms) {
  double t0 = now_ms();
  for (;;) {
    size_t left = 0;
    for (size_t i = 0; i < n; i++) left += !gone(pids[i]);
    if (!left) return now_ms() - t0;
    if (now_ms() - t0 > deadline_ms) return -1;
    nap_ms(2);
  }
}

static inline bool wait_state(pid_t pid, char state, int deadline_ms) {
  double t0 = now_ms();
  gg__pinfo_t info;
  while (now_ms() - t0 < deadline_ms) {
    if (gg__proc_read_stat(pid, &info) == 0 && info.state == state) return true;
    nap_ms(2);
  }
  return false;
}

/* Reads one newline-terminated line from fd within the deadline. */
static inline bool read_line(int fd, char *buf, size_t cap, int deadline_ms) {
  double t0 = now_ms();
  size_t len = 0;
  while (len + 1 < cap) {
    int left = deadline_ms - (int)(now_ms() - t0);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (left <= 0 || poll(&p, 1, left) <= 0) break;
    if (read(fd, buf + len, 1) != 1) break;
    if (buf[len] == '\n') {
      buf[len] = '\0';
      return true;
    }
    len++;
  }
  buf[len] = '\0';
  return false;
}

static inline pid_t read_pid(int fd) {
  char line[32];
  assert_true(read_line(fd, line, sizeof line, 10000));
  return (pid_t)atoi(line);
}

static inline void write_pid(int fd, pid_t pid) { dprintf(fd, "%d\n", (int)pid); }

/* Reaps whatever children of ours have ended (the test process is a subreaper in some tests). */
static inline void reap_all(void) {
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

/* A real guard that takes no signals and no exit() teardown: only its child set matters here. */
static inline gg_guard_t *quiet_guard(void) {
  gg_guard_options_t o;
  gg_guard_options_init(&o);
  o.backend = "host", o.signals = 0, o.run_at_exit = false;
  gg_guard_t *g = NULL;
  gg_assert_ok(gg_guard_create(&g, &o));
  return g;
}

static inline pid_t spawn_ok(gg_guard_t *g, const char *const argv[], const gg_spawn_options_t *o) {
  pid_t pid = -1;
  gg_assert_ok(gg_proc_spawn(g, argv, o, &pid));
  assert_true(pid > 1);
  return pid;
}

static inline const gg_proc_outcome_t *outcome(const gg_proc_receipt_t *r, pid_t pid) {
  for (size_t i = 0; i < r->count; i++)
    if (r->procs[i].pid == pid) return &r->procs[i];
  fail_msg("pid %d is not in the receipt", (int)pid);
  return NULL;
}

static inline size_t children_of(pid_t parent, pid_t *out, size_t cap) {
  size_t n = 0;
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (d && (e = readdir(d))) {
    gg__pinfo_t info;
    pid_t pid = (pid_t)atoi(e->d_name);
    if (pid > 0 && gg__proc_read_stat(pid, &info) == 0 && info.ppid == parent &&
        info.state != 'Z' && n < cap)
      out[n++] = pid;
  }
  if (d) closedir(d);
  return n;
}

/* A pid no process has now (for errors about processes that do not exist). */
static inline pid_t unused_pid(void) {
  for (pid_t pid = 4194000; pid > 300; pid--)
    if (kill(pid, 0) != 0 && errno == ESRCH) return pid;
  return -1;
}

#endif
