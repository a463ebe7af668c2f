/* cmd_watch.c — `gpuguard watch`: devices (memory, utilisation, temperature, power), the processes
 * holding them and the gpuguard sessions, redrawn in place on a terminal; or, with
 * --prom-file/--listen, the Prometheus exporter (exporter.c). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli_internal.h"

/* ---- the screen: a frame built in memory, cut to the width, written at once ------------------ */

typedef struct screen {
  char *buf;
  size_t len, cap;
  int cols, rows; /* 0: no limit (not a terminal, and no COLUMNS) */
  int col, row;
  bool tty, color;
} screen_t;

static void sc_raw(screen_t *s, const char *p, size_t n) {
  if (s->len + n + 1 > s->cap) {
    size_t c = s->cap ? s->cap : 8192;
    while (c < s->len + n + 1) c *= 2;
    char *grown = realloc(s->buf, c);
    if (!grown) return; /* the frame comes out shorter */
    s->buf = grown;
    s->cap = c;
  }
  memcpy(s->buf + s->len, p, n);
  s->len += n;
  s->buf[s->len] = '\0';
}

static bool sc_full(const screen_t *s) { return s->rows > 0 && s->row >= s->rows; }

/* Appends text that is safe already (cli_safe_text, or our own) in colour sgr ("" for none), cut at
 * the width so that nothing wraps. */
static void sc_put(screen_t *s, const char *sgr, const char *text) {
  if (sc_full(s)) return;
  int used;
  size_t n = cli_fit(text, s->cols ? s->cols - s->col : -1, &used);
  if (n == 0) return;
  s->col += used;
  bool colored = s->color && sgr && *sgr;
  if (colored) {
    sc_raw(s, "\033[", 2);
    sc_raw(s, sgr, strlen(sgr));
    sc_raw(s, "m", 1);
  }
  sc_raw(s, text, n);
  if (colored) sc_raw(s, "\033[0m", 4);
}

__attribute__((format(printf, 3, 4))) static void sc_printf(screen_t *s, const char *sgr,
                                                            const char *fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  sc_put(s, sgr, text);
}

/* Ends a line: the rest of the old line is cleared (no full-screen clear, so no flicker); the last
 * row of the terminal gets no newline, so the screen never scrolls. */
static void sc_endl(screen_t *s) {
  if (sc_full(s)) return;
  if (s->tty && (s->cols == 0 || s->col < s->cols)) sc_raw(s, "\033[K", 3);
  s->row++;
  s->col = 0;
  if (!s->tty || !sc_full(s)) sc_raw(s, "\n", 1);
}

/* ---- one frame ------------------------------------------------------------------------------- */

#define SGR_TITLE  "1"
#define SGR_HEAD   "1;7"
#define SGR_ORPHAN "1;31"
#define SGR_DIM    "2"

/* green, yellow, red by how close value is to its limit */
static const char *level(double v, double warn, double high) {
  return v < 0 ? "" : v >= high ? "31" : v >= warn ? "33" : "32";
}

/* " 87%", " 61C", or "   -" when the device does not say */
static void pct_cell(char *cell, size_t cap, int v, const char *unit) {
  if (v < 0)
    snprintf(cell, cap, " %4s", "-");
  else
    snprintf(cell, cap, " %3d%s", v, unit);
}

/* A header row's colour runs to the edge of the terminal. */
static void sc_fill(screen_t *s, const char *sgr) {
  if (!s->color || s->cols <= s->col) return;
  char pad[512];
  int n = s->cols - s->col < (int)sizeof pad - 1 ? s->cols - s->col : (int)sizeof pad - 1;
  memset(pad, ' ', (size_t)n);
  pad[n] = '\0';
  sc_put(s, sgr, pad);
}

static void draw_devices(screen_t *s, int only) {
  int n = 0;
  bool gpus = false;
  if (cli_devices(&gpus, &n) < 0) {
    sc_printf(s, SGR_ORPHAN, "devices: %s", gg_last_error());
    sc_endl(s);
    return;
  }
  sc_put(s, SGR_HEAD, "GPU NAME                  UTIL  MEM  TEMP     POWER  MEMORY");
  sc_fill(s, SGR_HEAD);
  sc_endl(s);
  if (only >= n) {
    sc_printf(s, SGR_ORPHAN, "(no device %d: there %s %d)", only, n == 1 ? "is" : "are", n);
    sc_endl(s);
    return;
  }
  for (int i = only >= 0 ? only : 0; i < (only >= 0 ? only + 1 : n); i++) {
    gg_device_info_t d;
    if (cli_device_info(gpus, i, &d) < 0) {
      char why[256];
      cli_safe_text(gg_last_error(), why, sizeof why);
      sc_printf(s, SGR_ORPHAN, "%-3d (unreadable: %s)", i, why);
      sc_endl(s);
      continue;
    }
    gg_device_telemetry_t t;
    cli_device_telemetry(gpus, i, &t); /* -1 readings without NVML */
    char name[64], cell[32];
    cli_safe_text(d.name, name, sizeof name);
    sc_printf(s, "", "%-3d %-20.20s ", i, name);
    pct_cell(cell, sizeof cell, t.utilization_gpu, "%");
    sc_put(s, "", cell);
    pct_cell(cell, sizeof cell, t.utilization_memory, "%");
    sc_put(s, "", cell);
    pct_cell(cell, sizeof cell, t.temperature_c, "C");
    sc_put(s, level(t.temperature_c, 75, 85), cell);
    if (t.power_watts < 0)
      snprintf(cell, sizeof cell, " %9s", "-");
    else if (t.power_limit_watts > 0)
      snprintf(cell, sizeof cell, " %4.0f/%3.0fW", t.power_watts, t.power_limit_watts);
    else
      snprintf(cell, sizeof cell, " %8.0fW", t.power_watts);
    sc_put(s, t.power_limit_watts > 0 ? level(t.power_watts / t.power_limit_watts, 0.8, 0.95) : "",
           cell);
    double used = d.total_bytes ? (double)d.used_bytes / (double)d.total_bytes : 0;
    char a[32], b[32];
    snprintf(cell, sizeof cell, "  %s / %s", human((double)d.used_bytes, a, sizeof a),
             human((double)d.total_bytes, b, sizeof b));
    sc_put(s, level(used, 0.75, 0.9), cell);
    int room = s->cols ? s->cols - s->col - 3 : 30;
    if (room >= 6) { /* a bar where there is room for one */
      if (room > 40) room = 40;
      char bar[48];
      int filled = (int)lround(used * room);
      for (int k = 0; k < room; k++) bar[k] = k < filled ? '|' : ' ';
      bar[room] = '\0';
      sc_put(s, "", " [");
      sc_put(s, level(used, 0.75, 0.9), bar);
      sc_put(s, "", "]");
    }
    sc_endl(s);
    if (d.simulated) {
      sc_put(s, SGR_DIM, "    (no usable CUDA device: gpuguard's simulated host device)");
      sc_endl(s);
    }
  }
}

static void draw_processes(screen_t *s, int only) {
  gg_process_t *rows = NULL;
  size_t n = 0;
  bool no_gpu = false;
  /* no stderr: it is this screen */
  if (cli_gather_processes(&rows, &n, &no_gpu, NULL, only) != 0) {
    sc_put(s, SGR_DIM,
           no_gpu ? "(no NVIDIA GPU here: nothing holds GPU memory)" : "(processes unreadable)");
    sc_endl(s);
    free(rows);
    return;
  }
  sc_put(s, SGR_HEAD, "GPU     PID    PPID USER         GPU-MEM CLASS      COMMAND");
  sc_fill(s, SGR_HEAD);
  sc_endl(s);
  unsigned orphans = 0;
  size_t shown = 0;
  for (size_t i = 0; i < n; i++) {
    const gg_process_t *p = &rows[i];
    if (only >= 0 && p->device != only) continue;
    shown++;
    char mem[32] = "?", user[64], cmd[1024];
    if (p->used_bytes >= 0) human((double)p->used_bytes, mem, sizeof mem);
    cli_safe_text(p->user, user, sizeof user);
    cli_safe_text(p->command, cmd, sizeof cmd);
    bool orphan = p->cls == GG_PROCESS_ORPHAN;
    orphans += orphan;
    sc_printf(s, orphan ? SGR_ORPHAN : "", "%-3d %7d %7d %-10.10s %9s %-10s %s", p->device, p->pid,
              p->ppid, user, mem, orphan ? "ORPHAN" : gg_process_class_name(p->cls), cmd);
    sc_endl(s);
  }
  sc_printf(s, orphans ? SGR_ORPHAN : SGR_DIM, "%zu process%s%s", shown, shown == 1 ? "" : "es",
            orphans ? " (orphans: end them with gpuguard reap)" : "");
  sc_endl(s);
  free(rows);
}

/* The gpuguard processes of this user, as the session registry records them. */
static void draw_sessions(screen_t *s) {
  gg_session_record_t recs[64];
  size_t n = 0;
  if (gg_registry_list(recs, 64, &n) != 0 || n == 0) return;
  if (n > 64) n = 64;
  sc_endl(s);
  sc_put(s, SGR_HEAD, "SESSION  ROLE        PID DEVICES  COMMAND");
  sc_fill(s, SGR_HEAD);
  sc_endl(s);
  for (size_t i = 0; i < n; i++) {
    char cmd[512], devs[80];
    cli_safe_text(recs[i].command, cmd, sizeof cmd);
    cli_safe_text(recs[i].devices[0] ? recs[i].devices : "-", devs, sizeof devs);
    sc_printf(s, recs[i].stale ? SGR_ORPHAN : "", "%-8.8s %-7s %7d %-8.8s %s%s", recs[i].session,
              recs[i].stale ? "DEAD" : recs[i].role, recs[i].pid, devs,
              recs[i].stale ? "(gone) " : "", cmd);
    sc_endl(s);
  }
}

static void draw(screen_t *s, double interval, int only) {
  time_t now = time(NULL);
  char stamp[32];
  strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", localtime(&now));
  sc_put(s, SGR_TITLE, "gpuguard watch");
  sc_printf(s, "", "  %s  every %.3g s%s", stamp, interval, s->tty ? "  (q quits)" : "");
  sc_endl(s);
  draw_devices(s, only);
  sc_endl(s);
  draw_processes(s, only);
  draw_sessions(s);
}

/* ---- the terminal: alternate screen, keys without Enter, restored on every way out ----------- */

static int wake_pipe[2] = {-1, -1};

/* Only wakes the loop (libuv's pattern): the loop restores the terminal, never the handler. */
static void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  ssize_t w = write(wake_pipe[1], &b, 1);
  (void)w;
  errno = saved;
}

static const int taken[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH, SIGTSTP};
#define NTAKEN (sizeof taken / sizeof taken[0])

typedef struct term {
  bool out_tty, in_tty, entered;
  /* the alternate screen: a view that runs until q; --count leaves its last frame visible */
  bool alt;
  struct termios saved;
  struct sigaction old[NTAKEN];
} term_t;

static void write_all(const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(STDOUT_FILENO, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= (size_t)w;
  }
}

static void term_enter(term_t *t) {
  if (t->in_tty && tcgetattr(STDIN_FILENO, &t->saved) == 0) {
    struct termios raw = t->saved;
    /* keys without Enter, not echoed; ^C still signals */
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    t->entered = true;
  }
  static const char enter[] = "\033[?1049h\033[?25l\033[H\033[2J"; /* alternate screen, no cursor */
  if (t->out_tty)
    write_all(t->alt ? enter : enter + 8, t->alt ? sizeof enter - 1 : sizeof enter - 9);
}

static void term_leave(term_t *t) {
  static const char leave[] = "\033[?25h\033[?1049l";
  if (t->out_tty) write_all(t->alt ? leave : "\033[?25h\n", t->alt ? sizeof leave - 1 : 7);
  if (t->entered) {
    tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
    t->entered = false;
  }
}

static void take_signals(term_t *t) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal; /* no SA_RESTART: poll returns at once */
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < NTAKEN; i++) sigaction(taken[i], &sa, &t->old[i]);
}

static void give_back_signals(term_t *t) {
  for (size_t i = 0; i < NTAKEN; i++) sigaction(taken[i], &t->old[i], NULL);
}

/* Terminal size: the terminal's own, else COLUMNS/LINES, else 80x24; not a terminal: COLUMNS or no
 * limit. */
static void screen_size(screen_t *s) {
  struct winsize ws;
  const char *c = getenv("COLUMNS"), *l = getenv("LINES");
  s->cols = c ? atoi(c) : 0;
  s->rows = 0;
  if (!s->tty) return;
  s->rows = l ? atoi(l) : 0;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    s->cols = ws.ws_col;
    s->rows = ws.ws_row;
  }
  if (s->cols <= 0) s->cols = 80;
  if (s->rows <= 0) s->rows = 24;
}

/* ---- --record: samples as JSON lines, the timeline format gpuguard.diagnostics.plot draws ---- */

typedef struct recorder {
  FILE *f;
  double start; /* unix time of the timeline's meta record: t counts from there */
  long step;
} recorder_t;

/* Opens path for appending; a new (or empty) file gets the meta record first, an existing timeline
 * is continued (its start and step count kept), so several runs of watch make one timeline. */
/* A timeline is a regular file: a symbolic link there is not followed (root would append to
 * whatever it names) and a FIFO or device is refused at once instead of blocking before the first
 * sample. */
static FILE *record_fopen(const char *path, int flags, const char *mode) {
  int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0644);
  if (fd < 0) {
    if (errno == ELOOP) errno = EINVAL;
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || fcntl(fd, F_SETFL, flags & O_APPEND) != 0) {
    close(fd);
    errno = EINVAL;
    return NULL;
  }
  FILE *f = fdopen(fd, mode);
  if (!f) close(fd);
  return f;
}

static int record_open(recorder_t *r, const char *path) {
  *r = (recorder_t){0};
  FILE *old = record_fopen(path, O_RDONLY, "r");
  if (!old && errno == EINVAL) {
    fprintf(stderr,
            "gpuguard watch: --record %s: not a regular file (a symbolic link, FIFO or device)\n",
            path);
    return 1;
  }
  char line[4096];
  if (old) {
    bool first = true;
    while (fgets(line, sizeof line, old)) {
      const char *st = strstr(line, "\"start\":");
      if (first && strstr(line, "\"type\":\"meta\"") && st) r->start = strtod(st + 8, NULL);
      if (strstr(line, "\"type\":\"sample\"")) r->step++;
      first = false;
    }
    fclose(old);
  }
  r->f = record_fopen(path, O_WRONLY | O_APPEND | O_CREAT, "a");
  if (!r->f) {
    fprintf(stderr, "gpuguard watch: --record %s: %s\n", path,
            errno == EINVAL ? "not a regular file (a symbolic link, FIFO or device)"
                            : strerror(errno));
    return 1;
  }
  if (r->start <= 0) {
    r->start = gg__clock_ms(CLOCK_REALTIME) / 1e3;
    int n = 0;
    gg_device_count(&n);
    fprintf(r->f,
            "{\"type\":\"meta\",\"version\":1,\"start\":%.3f,\"device\":0,\"source\":\"gpuguard "
            "watch\",\"series\":[",
            r->start);
    for (int i = 0; i < n; i++) fprintf(r->f, i ? ",\"driver_used_gpu%d\"" : "\"driver_used\"", i);
    fputs("]}\n", r->f);
  }
  if (fflush(r->f) == 0) return 0;
  fprintf(stderr, "gpuguard watch: --record %s: %s\n", path, strerror(errno));
  fclose(r->f);
  r->f = NULL;
  return 1;
}

/* One sample: each device's used memory as the driver reports it (device 0 as "driver_used", the
 * name gpuguard.record() gives it; the others as "driver_used_gpuN"). */
static void record_sample(recorder_t *r) {
  if (!r->f) return;
  int n = 0;
  gg_device_count(&n);
  double t = gg__clock_ms(CLOCK_REALTIME) / 1e3 - r->start;
  fprintf(r->f, "{\"type\":\"sample\",\"t\":%.3f,\"step\":%ld", t, r->step++);
  for (int i = 0; i < n; i++) {
    gg_device_info_t d;
    if (i)
      fprintf(r->f, ",\"driver_used_gpu%d\":", i);
    else
      fputs(",\"driver_used\":", r->f);
    if (gg_device_info(i, &d) == 0)
      fprintf(r->f, "%zu", d.used_bytes);
    else
      fputs("null", r->f);
  }
  fputs("}\n", r->f);
  fflush(r->f);
}

/* ---- the command ----------------------------------------------------------------------------- */

typedef struct watch_opts {
  double interval; /* seconds */
  long count;
  const char *prom, *listen, *record;
  int color;  /* cli_color_mode: 0 never, 1 always, 2 auto */
  int device; /* -i N: the view shows that device only; -1 all */
  bool all_users;
  bool commands; /* --command-labels: this user's command lines as labels */
  long top;      /* --top K: per-process series per GPU besides stranded/orphaned ones */
} watch_opts_t;

static int parse(int argc, char **argv, watch_opts_t *w) {
  static const struct option longs[] = {{"interval", required_argument, 0, 'I'},
                                        {"prom-file", required_argument, 0, 'p'},
                                        {"listen", required_argument, 0, 'l'},
                                        {"count", required_argument, 0, 'c'},
                                        {"no-color", no_argument, 0, 'n'},
                                        {"color", required_argument, 0, 'C'},
                                        {"record", required_argument, 0, 'r'},
                                        {"id", required_argument, 0, 'i'},
                                        {"all-users", no_argument, 0, 'a'},
                                        {"command-labels", no_argument, 0, 'L'},
                                        {"top", required_argument, 0, 'T'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  *w = (watch_opts_t){
      .interval = 2.0, .count = -1, .color = 2, .device = -1, .top = GG_REPORT_TOP_DEFAULT};
  int o;
  while ((o = next_opt(argc, argv, longs)) != -1) {
    char *end = NULL;
    if (o == 'h') {
      usage(stdout, current);
      return 0;
    }
    if (o == 'I') {
      double ms;
      if (!cli_duration("--interval", optarg, 1000, 50, 86400e3, &ms)) return EXIT_USAGE;
      w->interval = ms / 1e3;
    } else if (o == 'c') {
      errno = 0;
      w->count = strtol(optarg, &end, 10);
      if (errno || end == optarg || *end || w->count < 1)
        return bad_usage("--count '%s': a positive integer expected", optarg);
    } else if (o == 'p') {
      if (!*optarg) return bad_usage("%s", "--prom-file needs a path");
      w->prom = optarg;
    } else if (o == 'l') {
      char host[256];
      unsigned port;
      if (!*optarg) return bad_usage("%s", "--listen needs [ADDR][:PORT]");
      if (exporter_parse_listen(optarg, host, sizeof host, &port) != 0) return EXIT_USAGE;
      w->listen = optarg;
    } else if (o == 'n') {
      w->color = 0;
    } else if (o == 'C') {
      w->color = cli_color_mode(optarg);
      if (w->color < 0) return EXIT_USAGE;
    } else if (o == 'i') {
      if (!cli_device_arg(optarg, &w->device)) return EXIT_USAGE;
    } else if (o == 'a') {
      w->all_users = true;
    } else if (o == 'L') {
      w->commands = true;
    } else if (o == 'T') {
      errno = 0;
      w->top = strtol(optarg, &end, 10);
      if (errno || end == optarg || *end || w->top < 0 || w->top > 100000)
        return bad_usage("--top '%s': a number of processes from 0 to 100000 expected", optarg);
    } else if (o == 'r') {
      if (!*optarg) return bad_usage("%s", "--record needs a path");
      w->record = optarg;
    } else {
      return cli_opt_error(o, argv);
    }
  }
  if (optind < argc) return bad_usage("unexpected argument '%s'", argv[optind]);
  int bad = cli_gpu_exists("watch", w->device);
  return bad ? bad : -1;
}

/* Waits until deadline (gg__now_ms() / 1e3: seconds), a key, a signal or a client. Returns the
 * signal number, 'q' for q, 'k' for another key, 'c' for a client waiting on listen_fd, 0 when the
 * time is up. */
static int wait_event(double deadline, bool keys, int listen_fd) {
  struct pollfd p[3] = {{.fd = wake_pipe[0], .events = POLLIN},
                        {.fd = keys ? STDIN_FILENO : -1, .events = POLLIN},
                        {.fd = listen_fd, .events = POLLIN}};
  for (;;) {
    double left = deadline - gg__now_ms() / 1e3;
    if (left <= 0) return 0;
    int n = poll(p, 3, (int)(left * 1e3) + 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 0;
    if (p[0].revents & POLLIN) {
      unsigned char b;
      if (read(wake_pipe[0], &b, 1) == 1) return b;
    }
    if (p[1].revents & POLLIN) {
      char keybuf[64];
      ssize_t r = read(STDIN_FILENO, keybuf, sizeof keybuf);
      if (r <= 0) {
        keys = false;
        p[1].fd = -1;
      } /* stdin closed: no more keys */
      for (ssize_t i = 0; i < r; i++)
        if (keybuf[i] == 'q' || keybuf[i] == 'Q') return 'q';
      if (r > 0) return 'k';
    }
    if (p[2].revents & POLLIN) return 'c';
  }
}

/* The exporter: the textfile (and the --record sample) every interval, and/or /metrics answered as
 * scrapes come. A failed textfile write is said and tried again next interval (a moment of ENOSPC
 * must not end /metrics); the status is 1 when the last write failed. --count counts intervals, or
 * answered scrapes when nothing is written per interval. SIGTERM/SIGINT end it with 0. */
static int run_exporter(const watch_opts_t *w, recorder_t *rec) {
  unsigned what = GG_REPORT_ALL | GG_REPORT_NOT_SELF | (w->all_users ? GG_REPORT_ALL_COMMANDS : 0) |
                  (w->commands ? GG_REPORT_COMMANDS : 0);
  if (cli_no_gpu())
    fputs("gpuguard watch: no NVIDIA GPU on this machine (neither CUDA nor NVML): exporting no "
          "device "
          "series (gpuguard_devices{source=\"none\"} 0), never the simulated host device\n",
          stderr);
  exporter_t *ex = w->listen ? exporter_open(w->listen, what, (unsigned)w->top, w->device) : NULL;
  if (w->listen && !ex) return 1;
  bool ticking = w->prom || w->record, failing = false;
  prom_file_t prom = {.path = w->prom};
  long done = 0;
  double next = (gg__now_ms() / 1e3);
  for (;;) {
    if (ticking && (gg__now_ms() / 1e3) >= next) {
      if (w->prom) {
        bool failed = exporter_write_file(&prom, what, (unsigned)w->top, w->device) != 0;
        if (failed && !failing)
          fprintf(stderr, "gpuguard watch: --prom-file %s: trying again every %.3g s\n", w->prom,
                  w->interval);
        if (!failed && failing)
          fprintf(stderr, "gpuguard watch: --prom-file %s: written again\n", w->prom);
        failing = failed;
      }
      record_sample(rec);
      next += w->interval;
      if (w->count > 0 && ++done >= w->count) break;
    }
    double until = ticking ? next : (gg__now_ms() / 1e3) + 3600;
    int ev = ex ? exporter_serve(ex, until * 1e3, wake_pipe[0]) : wait_event(until, false, -1);
    if (ev == 'c') {
      if (!ticking && w->count > 0 && ++done >= w->count) break;
    } else if (ev == SIGINT || ev == SIGTERM || ev == SIGHUP || ev == SIGQUIT) {
      break;
    }
  }
  exporter_close(ex);
  return failing ? 1 : 0;
}

static int run_view(const watch_opts_t *w, term_t *t, recorder_t *rec) {
  bool color = cli_color_on(w->color, STDOUT_FILENO);
  term_enter(t);
  for (long i = 0; w->count < 0 || i < w->count; i++) {
    screen_t s = {.tty = t->out_tty, .color = color};
    screen_size(&s);
    if (s.tty) sc_raw(&s, "\033[H", 3); /* home, then overwrite: no clear, no flicker */
    draw(&s, w->interval, w->device);
    if (s.tty) sc_raw(&s, "\033[J", 3); /* whatever the last frame had below this one */
    if (s.buf) write_all(s.buf, s.len);
    free(s.buf);
    record_sample(rec);
    if (w->count > 0 && i + 1 >= w->count) break;
    double deadline = gg__now_ms() / 1e3 + w->interval;
    int ev = wait_event(deadline, t->in_tty, -1);
    if (ev == SIGTSTP) { /* ^Z: hand the terminal back, stop; redraw when continued */
      struct sigaction dfl, mine;
      memset(&dfl, 0, sizeof dfl);
      dfl.sa_handler = SIG_DFL;
      term_leave(t);
      sigaction(SIGTSTP, &dfl, &mine);
      raise(SIGTSTP);
      sigaction(SIGTSTP, &mine, NULL);
      term_enter(t);
      continue;
    }
    if (ev == 'q' || ev == SIGINT || ev == SIGTERM || ev == SIGHUP || ev == SIGQUIT) break;
  }
  term_leave(t);
  return 0;
}

int cmd_watch(int argc, char **argv) {
  watch_opts_t w;
  int rc = parse(argc, argv, &w);
  if (rc >= 0) return rc;
  recorder_t rec = {0};
  if (w.record && record_open(&rec, w.record) != 0) return 1;
  if (pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    fprintf(stderr, "gpuguard watch: pipe: %s\n", strerror(errno));
    if (rec.f) fclose(rec.f);
    return 1;
  }
  term_t t = {.out_tty = isatty(STDOUT_FILENO) == 1,
              .in_tty = isatty(STDIN_FILENO) == 1,
              .alt = w.count < 0};
  take_signals(&t);
  if (w.prom || w.listen)
    rc = run_exporter(&w, &rec);
  else
    rc = run_view(&w, &t, &rec);
  give_back_signals(&t);
  if (rec.f) fclose(rec.f);
  close(wake_pipe[0]);
  close(wake_pipe[1]);
  return rc;
}
