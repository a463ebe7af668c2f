/* gpuguard.c — the `gpuguard` command line: who holds GPU memory (ps), devices (info, watch), guarded
 * jobs (run) and their orphans (reap), built on the public API only. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>
#include <wctype.h>

#include "cli.h"

const command_t *current;

void usage(FILE *f, const command_t *c) {
  fprintf(f, "usage: gpuguard %s %s\n  %s\n%s", c->name, c->args, c->summary, c->help);
}

int bad_usage(const char *fmt, const char *what) {
  fprintf(stderr, "gpuguard %s: ", current->name);
  fprintf(stderr, fmt, what);
  fputc('\n', stderr);
  usage(stderr, current);
  return EXIT_USAGE;
}

const char *human(double bytes, char *buf, size_t cap) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, u++;
  snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

int next_opt(int argc, char **argv, const struct option *longs) {
  opterr = 0;
  /* Each command's short options beside -h (getopt's syntax); the long forms are in its table. */
  static const struct {
    const char *command, *shorts;
  } short_opts[] = {{"ps", "i:"}, {"info", "i:"}, {"watch", "i:"}, {"check", "i:"}, {"reap", "ny"}};
  const char *mine = "";
  for (size_t i = 0; current && i < sizeof short_opts / sizeof short_opts[0]; i++)
    if (strcmp(current->name, short_opts[i].command) == 0) mine = short_opts[i].shorts;
  char shorts[64];
  snprintf(shorts, sizeof shorts, "+:h%s", mine);
  int idx = -1, o = getopt_long(argc, argv, shorts, longs, &idx);
  /* `--grace -- CMD`: getopt takes "--" as the value; it is the separator, so the value is missing. */
  if (idx >= 0 && longs[idx].has_arg == required_argument && optarg && strcmp(optarg, "--") == 0) {
    optind--;
    return ':';
  }
  return o;
}

int cli_opt_error(int opt, char **argv) {
  if (opt == ':') return bad_usage("%s needs a value", argv[optind - 1]);
  return bad_usage("unknown option '%s'", argv[optind - 1]);
}

/* Text is decoded as UTF-8 whatever the user's locale says (command lines and NVML names are UTF-8 or
 * garbage); without the C.UTF-8 locale only printable ASCII counts as text. */
static locale_t utf8_locale(void) {
  static locale_t loc;
  static bool tried;
  if (!tried) tried = true, loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
  return loc;
}

/* The printable character at p: its length in bytes and its width in columns; 0 when it is not one. */
static size_t printable_at(const char *p, size_t avail, int *width) {
  unsigned char c = (unsigned char)*p;
  if (c >= 0x20 && c < 0x7f) return *width = 1, 1;
  locale_t loc = utf8_locale();
  if (c < 0x80 || !loc) return 0;
  locale_t old = uselocale(loc);
  mbstate_t st;
  memset(&st, 0, sizeof st);
  wchar_t wc;
  size_t n = mbrtowc(&wc, p, avail, &st);
  int w = n > 0 && n <= 4 && iswprint((wint_t)wc) ? wcwidth(wc) : -1; /* C1 controls (CSI) are not */
  uselocale(old);
  if (w < 0) return 0;
  return *width = w, n;
}

void cli_safe_text(const char *s, char *out, size_t cap) {
  size_t w = 0, left = strlen(s ? s : "");
  for (const char *p = s ? s : ""; *p;) {
    int width;
    size_t n = printable_at(p, left, &width), len = n ? n : 4;
    char esc[5];
    if (n == 0) snprintf(esc, sizeof esc, "\\x%02X", (unsigned char)*p);
    if (w + len >= cap) break;
    memcpy(out + w, n ? p : esc, len);
    w += len, p += n ? n : 1, left -= n ? n : 1;
  }
  if (cap) out[w] = '\0';
}

size_t cli_fit(const char *s, int cols, int *used) {
  size_t off = 0, left = strlen(s);
  *used = 0;
  while (s[off]) {
    int width;
    size_t n = printable_at(s + off, left - off, &width);
    if (n == 0) n = 1, width = 1;
    if (cols >= 0 && *used + width > cols) break;
    off += n, *used += width;
  }
  return off;
}

/* ---- option values every command reads the same way ------------------------------------------------ */

bool cli_duration(const char *opt, const char *text, double default_unit_ms, double min_ms, double max_ms,
                  double *out_ms) {
  static const struct {
    const char *suffix;
    double ms;
  } units[] = {{"ms", 1}, {"s", 1e3}, {"m", 60e3}, {"", 0}};
  char *end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  double unit = -1;
  for (size_t i = 0; end != text && i < sizeof units / sizeof units[0]; i++)
    if (strcmp(end, units[i].suffix) == 0) unit = units[i].ms ? units[i].ms : default_unit_ms;
  double ms = v * unit;
  /* hex, inf and nan are numbers to strtod, not durations */
  bool plain = strspn(text, "0123456789.") == (size_t)(end - text) && end != text;
  if (errno || unit < 0 || !plain || !isfinite(ms) || ms < min_ms || ms > max_ms) {
    char why[512];
    bool in_s = default_unit_ms != 1;
    snprintf(why, sizeof why,
             "%s '%s': a duration from %g to %g %s expected, with a unit (500ms, 2s, 1m) or a bare number "
             "in %s",
             opt, text, min_ms / default_unit_ms, max_ms / default_unit_ms, in_s ? "s" : "ms",
             in_s ? "seconds" : "milliseconds");
    bad_usage("%s", why);
    return false;
  }
  *out_ms = ms;
  return true;
}

int cli_color_mode(const char *text) {
  if (strcmp(text, "never") == 0) return 0;
  if (strcmp(text, "always") == 0) return 1;
  if (strcmp(text, "auto") == 0) return 2;
  bad_usage("--color '%s': auto, always or never expected", text);
  return -1;
}

bool cli_color_on(int mode, int fd) {
  if (mode != 2) return mode == 1;
  const char *nc = getenv("NO_COLOR"), *term = getenv("TERM");
  return isatty(fd) == 1 && !(nc && *nc) && !(term && strcmp(term, "dumb") == 0);
}

bool cli_device_arg(const char *text, int *device) {
  char *end = NULL;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || end == text || *end || v < 0 || v > 1023) {
    bad_usage("-i '%s': a device number (0, 1, ...) expected", text);
    return false;
  }
  *device = (int)v;
  return true;
}

bool cli_no_gpu(void) {
  gg_device_info_t d;
  gg_device_telemetry_t t;
  /* telemetry says GG_ENOTSUP exactly when NVML cannot be loaded */
  return gg_device_info(0, &d) == 0 && strcmp(d.backend, "host") == 0 &&
         gg_device_telemetry(0, &t) == GG_ENOTSUP;
}

/* ---- info --------------------------------------------------------------------------------------------- */

static int print_devices(FILE *f, int only) {
  int n = 0;
  if (gg_device_count(&n) < 0) {
    fprintf(stderr, "gpuguard: %s\n", gg_last_error());
    return 1;
  }
  if (only >= n) {
    fprintf(stderr, "gpuguard info: -i %d: no such device (there %s %d)\n", only, n == 1 ? "is" : "are", n);
    return 1;
  }
  char a[32], b[32], c[32];
  fprintf(f, "%-3s %-28s %-8s %12s %12s %12s  %s\n", "GPU", "NAME", "BACKEND", "TOTAL", "USED", "FREE",
          "UUID");
  for (int i = only >= 0 ? only : 0; i < (only >= 0 ? only + 1 : n); i++) {
    gg_device_info_t d;
    if (gg_device_info(i, &d) < 0) {
      fprintf(f, "%-3d (unreadable: %s)\n", i, gg_last_error());
      continue;
    }
    fprintf(f, "%-3d %-28.28s %-8s %12s %12s %12s  %s\n", i, d.name, d.backend,
            human((double)d.total_bytes, a, sizeof a), human((double)d.used_bytes, b, sizeof b),
            human((double)d.free_bytes, c, sizeof c), d.uuid);
    if (strcmp(d.backend, "host") == 0)
      fprintf(f, "    (no usable CUDA device: this is gpuguard's simulated host device)\n");
  }
  /* NVML without CUDA (a container given only the `utility` capability): the GPUs are there. Without
   * CUDA, telemetry names devices by NVML index, so it counts them. */
  gg_device_info_t d0;
  gg_device_telemetry_t t;
  int nvml = 0;
  if (gg_device_info(0, &d0) == 0 && strcmp(d0.backend, "host") == 0)
    while (nvml < 64 && gg_device_telemetry(nvml, &t) == 0) nvml++;
  if (nvml)
    fprintf(
        f,
        "NVML sees %d GPU%s that CUDA does not offer here: `gpuguard info --json` or `--prom` lists them\n",
        nvml, nvml == 1 ? "" : "s");
  return 0;
}

static int cmd_info(int argc, char **argv) {
  static const struct option longs[] = {{"json", no_argument, 0, 'j'},
                                        {"prom", no_argument, 0, 'p'},
                                        {"id", required_argument, 0, 'i'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  int format = -1, o, only = -1;
  while ((o = next_opt(argc, argv, longs)) != -1) {
    if (o == 'h') return usage(stdout, current), 0;
    if (o == 'i') {
      if (!cli_device_arg(optarg, &only)) return EXIT_USAGE;
      continue;
    }
    if (o == 'j' || o == 'p') {
      if (format != -1) return bad_usage("%s", "--json and --prom are exclusive");
      format = o == 'j' ? GG_FORMAT_JSON : GG_FORMAT_PROMETHEUS;
      continue;
    }
    return cli_opt_error(o, argv);
  }
  if (optind < argc) return bad_usage("unexpected argument '%s'", argv[optind]);
  if (only >= 0 && format >= 0)
    return bad_usage("%s", "-i selects a device of the table; --json/--prom cover every device");
  if (format == GG_FORMAT_PROMETHEUS && cli_no_gpu())
    fputs("gpuguard info: no NVIDIA GPU on this machine (neither CUDA nor NVML): no device series, never the "
          "simulated host device\n",
          stderr);
  if (format < 0) {
    if (print_devices(stdout, only)) return 1;
  } else if (gg_report(stdout, (gg_format_t)format, GG_REPORT_DEVICES) < 0) {
    fprintf(stderr, "gpuguard info: %s\n", gg_last_error());
    return 1;
  }
  /* A device the listing could not read (a bad GPUGUARD_HOST_* value, say) is a failure too. */
  int n = 0, bad = 0;
  gg_device_info_t d;
  for (int i = 0; gg_device_count(&n) == 0 && i < n; i++)
    bad += (only < 0 || i == only) && gg_device_info(i, &d) < 0;
  return bad ? 1 : 0;
}

/* ---- ps ----------------------------------------------------------------------------------------------- */

/* Gathered before printing so a failure prints no half table. */
int cli_gather_processes(gg_process_t **out, size_t *nout, bool *no_gpu, FILE *errs) {
  int n = 0;
  *out = NULL, *nout = 0, *no_gpu = false;
  if (gg_device_count(&n) < 0) {
    if (errs) fprintf(errs, "gpuguard: %s\n", gg_last_error());
    return 1;
  }
  for (int dev = 0; dev < n; dev++) {
    size_t count = 0, cap = 8;
    for (int attempt = 0; attempt < 4; attempt++) {
      gg_process_t *grown = realloc(*out, (*nout + cap) * sizeof **out);
      if (!grown) {
        if (errs) fprintf(errs, "gpuguard: out of memory\n");
        return 1;
      }
      *out = grown;
      int rc = gg_process_list(dev, *out + *nout, cap, &count);
      if (rc < 0) {
        if (rc == GG_ENODEV) return *no_gpu = true, 1; /* neither NVML nor the driver: no GPU here */
        if (errs) fprintf(errs, "gpuguard: device %d: %s\n", dev, gg_last_error());
        count = 0;
        break;
      }
      if (count <= cap) break;
      cap = count + 8; /* more appeared than there was room for: ask again */
    }
    size_t got = count < cap ? count : cap, kept = 0;
    for (size_t i = 0; i < got; i++) /* not this process: reading the devices opened their nodes */
      if ((*out)[*nout + i].pid != (int)getpid()) (*out)[*nout + kept++] = (*out)[*nout + i];
    *nout += kept;
  }
  return 0;
}

/* Whether `gpuguard reap` (as this user; with --all-users as root) ends what this row is. */
static bool reapable(const gg_process_t *p) {
  return p->cls == GG_PROCESS_STRANDED || p->cls == GG_PROCESS_ORPHAN;
}

static const char *class_label(const gg_process_t *p) {
  if (p->cls == GG_PROCESS_ORPHAN) return "ORPHAN";
  if (p->cls == GG_PROCESS_STRANDED) return "STRANDED";
  return gg_process_class_name(p->cls);
}

static int print_processes(FILE *f, bool all_users, bool why, bool *no_gpu, int only, int color) {
  gg_process_t *rows;
  size_t n;
  if (cli_gather_processes(&rows, &n, no_gpu, stderr) != 0) return free(rows), 1;
  bool tty = cli_color_on(color, fileno(f));
  unsigned me = (unsigned)getuid();
  fprintf(f, "%-3s %8s %8s %-10s %12s %-5s %-10s %s\n", "GPU", "PID", "PPID", "USER", "GPU-MEMORY", "STATE",
          "CLASS", "COMMAND");
  unsigned shown = 0, stranded = 0, orphans = 0, theirs = 0, detached = 0, hidden = 0;
  for (size_t i = 0; i < n; i++) {
    const gg_process_t *p = &rows[i];
    if (only >= 0 && p->device != only) continue;
    if (!all_users && p->uid != me && p->state != '?') {
      hidden++;
      continue;
    }
    char mem[32] = "?", user[sizeof p->user * 4], cmd[sizeof p->command * 4], text[sizeof p->why * 4];
    if (p->used_bytes >= 0) human((double)p->used_bytes, mem, sizeof mem);
    cli_safe_text(p->user, user, sizeof user); /* another user's command line is not ours to print raw */
    cli_safe_text(p->command, cmd, sizeof cmd);
    bool red = reapable(p);
    if (red && p->uid != me)
      theirs++;
    else if (red)
      stranded += p->cls == GG_PROCESS_STRANDED, orphans += p->cls == GG_PROCESS_ORPHAN;
    detached += p->cls == GG_PROCESS_DETACHED;
    fprintf(f, "%s%-3d %8d %8d %-10.10s %12s %-5c %-10s %s%s\n", red && tty ? "\033[1;31m" : "", p->device,
            p->pid, p->ppid, user, mem, p->state >= 0x21 && p->state < 0x7f ? p->state : '?', class_label(p),
            cmd, red && tty ? "\033[0m" : "");
    if (why) {
      cli_safe_text(p->why[0] ? p->why : "no evidence either way", text, sizeof text);
      fprintf(f, "    why: %s\n", text);
    }
    shown++;
  }
  free(rows);
  /* The footer names the command that ends what it counts, and counts only what that command ends. */
  fprintf(f, "%u process%s", shown, shown == 1 ? "" : "es");
  if (stranded || orphans) {
    fputs(", ", f);
    if (stranded) fprintf(f, "%u STRANDED%s", stranded, orphans ? ", " : "");
    if (orphans) fprintf(f, "%u ORPHAN%s", orphans, orphans == 1 ? "" : "S");
    fputs(" (end them with: gpuguard reap)", f);
  }
  if (theirs)
    fprintf(f, ", %u of other users stranded or orphaned (%s)", theirs,
            geteuid() == 0 ? "end them with: gpuguard reap --all-users" : "only root can end them");
  if (detached) fprintf(f, ", %u detached (left alone: end one with gpuguard reap --pid PID)", detached);
  if (hidden) fprintf(f, ", %u of other users hidden (--all-users shows them)", hidden);
  fputc('\n', f);
  return 0;
}

static const char no_gpu_text[] =
    "gpuguard ps: no NVIDIA GPU on this machine (neither NVML nor the CUDA driver "
    "loads); nothing holds GPU memory here\n";

static int cmd_ps(int argc, char **argv) {
  static const struct option longs[] = {
      {"json", no_argument, 0, 'j'},     {"all-users", no_argument, 0, 'a'},
      {"why", no_argument, 0, 'w'},      {"id", required_argument, 0, 'i'},
      {"color", required_argument, 0, 'C'}, {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  bool json = false, all = false, why = false;
  int o, only = -1, color = 2;
  while ((o = next_opt(argc, argv, longs)) != -1) {
    if (o == 'h') return usage(stdout, current), 0;
    if (o == 'i') {
      if (!cli_device_arg(optarg, &only)) return EXIT_USAGE;
    } else if (o == 'C') {
      if ((color = cli_color_mode(optarg)) < 0) return EXIT_USAGE;
    } else if (o == 'j')
      json = true;
    else if (o == 'a')
      all = true;
    else if (o == 'w')
      why = true;
    else
      return cli_opt_error(o, argv);
  }
  if (optind < argc) return bad_usage("unexpected argument '%s'", argv[optind]);
  if (json && only >= 0)
    return bad_usage("%s", "-i selects the device of the table; --json covers every device");
  bool no_gpu = false;
  int rc;
  if (json) {
    size_t count;
    int ndev = 0;
    no_gpu = gg_device_count(&ndev) == 0 && ndev > 0 && gg_process_list(0, NULL, 0, &count) == GG_ENODEV;
    /* No GPU: no devices and no processes, as the exit status says; never the simulated host device,
     * which no process can hold (the exporter leaves it out too). */
    if (no_gpu)
      rc = printf("{\"version\":\"%s\",\"devices\":[],\"processes\":[]}\n", gg_version()) < 0;
    else
      rc =
          gg_report(stdout, GG_FORMAT_JSON, GG_REPORT_DEVICES | GG_REPORT_PROCESSES | GG_REPORT_NOT_SELF) < 0;
    if (rc) fprintf(stderr, "gpuguard ps: %s\n", gg_last_error());
  } else {
    rc = print_processes(stdout, all, why, &no_gpu, only, color);
  }
  if (no_gpu) fputs(no_gpu_text, stderr);
  return no_gpu ? EXIT_NO_GPU : rc ? 1 : 0;
}

/* ---- run ---------------------------------------------------------------------------------------------- */

/* --grace for run and reap: the library's own limit, so what the CLI accepts the teardown accepts. */
static bool parse_grace(const char *text, long *out) {
  double ms;
  if (!cli_duration("--grace", text, 1, 0, GG_PROC_GRACE_MAX_MS, &ms)) return false;
  *out = lround(ms);
  return true;
}

/* Free memory of the device after the job: the driver frees a dead process's memory shortly after it
 * dies (~100 ms on an H200), so wait up to limit_ms for it to come back to `before`. */
static bool free_after(int device, size_t before, double limit_ms, size_t *after, double *waited_ms) {
  double t0 = gg__now_ms();
  gg_device_info_t d;
  for (;;) {
    if (gg_device_info(device, &d) != 0) return false;
    *after = d.free_bytes, *waited_ms = gg__now_ms() - t0;
    if (d.free_bytes >= before || *waited_ms >= limit_ms) return true;
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

typedef struct run_opts {
  long grace, device;
  int pid_ns; /* GG_SPAWN_PID_NS_*; AUTO asks gg_proc_pid_ns_probe() first and says once if refused */
  bool in_ns; /* the job did get its namespace (for the receipt) */
  const char *receipt_path;
  char **cmd;
} run_opts_t;

typedef struct job_result {
  pid_t pid;
  int status; /* wait status of CMD, valid when reaped */
  bool reaped;
  int runner_sig; /* the signal that ended the runner's wait, 0 if none */
  int exit_code;
} job_result_t;

/* What the runner saw of the device and the session, for the receipt. */
typedef struct run_env {
  char session[40];
  gg_device_info_t dev;
  bool have_dev;
  size_t free_after;
  double waited_ms;
} run_env_t;

/* path's directory and a temporary name beside it: "DIR/.BASE.XXXXXX", for mkostemp. */
static bool temp_beside(const char *path, char *out, size_t cap) {
  const char *slash = strrchr(path, '/');
  int dir = slash ? (int)(slash - path) + 1 : 0;
  int n = snprintf(out, cap, "%.*s.%s.XXXXXX", dir, path, slash ? slash + 1 : path);
  return n > 0 && (size_t)n < cap;
}

/* The receipt's path, checked before the job starts, so that a bad one is said at once: it is a
 * regular file or nothing (never followed: a symlink, a FIFO or a device there is refused, as is a
 * directory we cannot create a file in). An old receipt there is removed now: a runner that dies
 * before writing the new one (SIGKILL) leaves no receipt, never the previous run's. The receipt itself
 * is written at the end to a temporary file renamed over the path, so it is never seen half-written.
 * Returns -1 to go on, else the exit status. */
static int open_receipt(run_opts_t *o) {
  if (!o->receipt_path || strcmp(o->receipt_path, "-") == 0) return -1;
  const char *path = o->receipt_path;
  char why[4200], tmp[4200];
  struct stat st;
  bool exists = lstat(path, &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) {
    snprintf(why, sizeof why, "--receipt %s: not a regular file (%s); the job was not started", path,
             S_ISLNK(st.st_mode)    ? "a symbolic link"
             : S_ISFIFO(st.st_mode) ? "a FIFO"
             : S_ISDIR(st.st_mode)  ? "a directory"
                                    : "a device or socket");
    return bad_usage("%s", why);
  }
  int fd = temp_beside(path, tmp, sizeof tmp) ? mkostemp(tmp, O_CLOEXEC) : (errno = ENAMETOOLONG, -1);
  if (fd >= 0) close(fd), unlink(tmp);
  if (fd < 0 || (exists && unlink(path) != 0 && errno != ENOENT)) {
    snprintf(why, sizeof why, "--receipt %s: cannot be written (%s); the job was not started", path,
             strerror(errno));
    return bad_usage("%s", why);
  }
  return -1;
}

static bool write_all(int fd, const char *buf, size_t len) {
  for (size_t off = 0; off < len;) {
    ssize_t w = write(fd, buf + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    off += (size_t)w;
  }
  return true;
}

/* The receipt's text goes to a new file beside the path, then replaces it in one rename. */
static int put_receipt(const char *path, const char *text, size_t len) {
  char tmp[4200];
  int fd = temp_beside(path, tmp, sizeof tmp) ? mkostemp(tmp, O_CLOEXEC) : (errno = ENAMETOOLONG, -1);
  if (fd < 0) return -1;
  mode_t mask = umask(0);
  umask(mask);
  bool ok = fchmod(fd, 0644 & ~mask) == 0 && write_all(fd, text, len) && fsync(fd) == 0;
  int e = errno;
  ok = close(fd) == 0 && ok;
  if (ok && rename(tmp, path) == 0) return 0;
  e = ok ? errno : e;
  unlink(tmp);
  errno = e;
  return -1;
}

/* The receipt's entry for CMD itself: the runner reaped CMD, so the teardown found it gone and knew
 * neither its command, its parent nor its status. What the runner knows is the truth. */
static void fix_job_entry(gg_proc_receipt_t *receipt, const run_opts_t *o, const job_result_t *r) {
  for (size_t i = 0; receipt && i < receipt->count; i++) {
    gg_proc_outcome_t *p = &receipt->procs[i];
    if (p->pid != r->pid) continue;
    if (!p->command[0]) {
      size_t w = 0;
      for (int k = 0; o->cmd[k] && w + 1 < sizeof p->command; k++)
        w += (size_t)snprintf(p->command + w, sizeof p->command - w, "%s%s", k ? " " : "", o->cmd[k]);
    }
    if (!p->ppid) p->ppid = getpid();
    if (r->reaped && p->end != GG_PROC_ALIVE) {
      p->end = WIFEXITED(r->status) ? GG_PROC_EXITED : GG_PROC_SIGNALED;
      p->code = WIFEXITED(r->status) ? WEXITSTATUS(r->status) : WTERMSIG(r->status);
    }
  }
}

/* Returns 0, or -1 having said why on stderr (the exit status stays CMD's: a receipt that could not be
 * written, on a full filesystem say, is no reason to hide how the job ended). */
static int write_receipt(run_opts_t *o, const job_result_t *r, const gg_proc_receipt_t *rc,
                         const run_env_t *env) {
  const char *path = o->receipt_path;
  char **cmd = o->cmd;
  bool to_file = strcmp(path, "-") != 0;
  char *text = NULL;
  size_t len = 0;
  FILE *f = to_file ? open_memstream(&text, &len) : stdout;
  if (!f) return fprintf(stderr, "gpuguard run: the receipt %s: out of memory\n", path), -1;
  fputs("{\"command\":[", f);
  for (int i = 0; cmd[i]; i++) fputs(i ? "," : "", f), gg_json_write_string(f, cmd[i]);
  fprintf(f, "],\"pid\":%d,\"session\":", (int)r->pid);
  gg_json_write_string(f, env->session);
  if (r->reaped && WIFEXITED(r->status))
    fprintf(f, ",\"exit\":{\"status\":%d,\"signal\":null}", WEXITSTATUS(r->status));
  else if (r->reaped)
    fprintf(f, ",\"exit\":{\"status\":null,\"signal\":%d}", WTERMSIG(r->status));
  else
    fputs(",\"exit\":null", f);
  if (r->runner_sig)
    fprintf(f, ",\"runner_signal\":%d", r->runner_sig);
  else
    fputs(",\"runner_signal\":null", f);
  fprintf(f, ",\"exit_code\":%d,\"pid_ns\":%s,\"device\":", r->exit_code, o->in_ns ? "true" : "false");
  if (env->have_dev) {
    fprintf(f, "{\"index\":%d,\"backend\":", env->dev.index);
    gg_json_write_string(f, env->dev.backend);
    fprintf(f, ",\"free_bytes_before\":%zu,\"free_bytes_after\":%zu,\"free_after_wait_ms\":%.0f}",
            env->dev.free_bytes, env->free_after, env->waited_ms);
  } else {
    fputs("null", f);
  }
  fputs(",\"teardown\":", f);
  if (rc)
    gg_proc_receipt_write(rc, f); /* ends with a newline */
  else
    fputs("null\n", f);
  fputs("}\n", f);
  bool ok = false;
  if (!to_file) {
    ok = fflush(f) == 0 && !ferror(f);
  } else {
    ok = fclose(f) == 0; /* the memory stream: its text is complete once closed */
  }
  if (ok && to_file && put_receipt(path, text, len) != 0) ok = false;
  int e = errno;
  free(text);
  if (ok) return 0;
  fprintf(stderr,
          "gpuguard run: the receipt %s could not be written: %s (the exit status is still the job's)\n",
          to_file ? path : "(stdout)", strerror(e));
  return -1;
}

/* --pid-ns's value, and GPUGUARD_PID_NS's: a GG_SPAWN_PID_NS_* mode, -1 when it is none. */
static int parse_pid_ns(const char *v) {
  static const struct {
    const char *name;
    int mode;
  } names[] = {{"auto", GG_SPAWN_PID_NS_AUTO}, {"on", GG_SPAWN_PID_NS_ON},  {"off", GG_SPAWN_PID_NS_OFF},
               {"1", GG_SPAWN_PID_NS_ON},      {"yes", GG_SPAWN_PID_NS_ON}, {"0", GG_SPAWN_PID_NS_OFF},
               {"no", GG_SPAWN_PID_NS_OFF}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(v, names[i].name)) return names[i].mode;
  return -1;
}

/* Phase 1: the options. Returns -1 to go on, else the exit status. */
static int run_parse(int argc, char **argv, run_opts_t *o) {
  static const struct option longs[] = {{"grace", required_argument, 0, 'g'},
                                        {"receipt", required_argument, 0, 'r'},
                                        {"device", required_argument, 0, 'd'},
                                        {"pid-ns", optional_argument, 0, 'p'},
                                        {"torch", no_argument, 0, 't'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  *o = (run_opts_t){.grace = 2000, .pid_ns = GG_SPAWN_PID_NS_AUTO};
  /* auto by default: a SIGKILLed runner then takes its whole job with it (docs/cli.md says what was
   * measured before choosing it). The default comes from GPUGUARD_PID_NS when it is set (empty counts as
   * unset); --pid-ns beats it. A bad value is refused even then: a typo in a site-wide setting should not go
   * unnoticed. */
  const char *env_ns = getenv("GPUGUARD_PID_NS");
  if (env_ns && *env_ns && (o->pid_ns = parse_pid_ns(env_ns)) < 0) {
    char why[160];
    snprintf(why, sizeof why, "GPUGUARD_PID_NS='%.80s': auto, on or off expected", env_ns);
    return bad_usage("%s", why);
  }
  int opt;
  while ((opt = next_opt(argc, argv, longs)) != -1) {
    if (opt == 'h') return usage(stdout, current), 0;
    if (opt == 'g') {
      if (!parse_grace(optarg, &o->grace)) return EXIT_USAGE;
    } else if (opt == 'd') {
      char *end;
      errno = 0;
      o->device = strtol(optarg, &end, 10);
      if (errno || end == optarg || *end || o->device < 0 || o->device > 1024)
        return bad_usage("--device '%s': a device ordinal expected", optarg);
    } else if (opt == 'p') {
      if ((o->pid_ns = parse_pid_ns(optarg ? optarg : "auto")) < 0)
        return bad_usage("--pid-ns=%s: auto, on or off expected", optarg);
    } else if (opt == 't') {
      /* The job's Python processes make gpuguard PyTorch's allocator (the wheel's startup hook). */
      setenv("GPUGUARD_TORCH", "1", 1);
    } else if (opt == 'r') {
      if (!*optarg) return bad_usage("%s", "--receipt needs a path (or - for stdout)");
      o->receipt_path = optarg;
    } else {
      return cli_opt_error(opt, argv);
    }
  }
  if (optind >= argc) return bad_usage("%s", "no command given (gpuguard run [OPTIONS] -- CMD ARGS...)");
  o->cmd = argv + optind;
  int ndev = 0;
  if (gg_device_count(&ndev) == 0 && o->device >= ndev) {
    char why[160];
    snprintf(why, sizeof why, "--device %ld: no such device (this machine has %d, numbered from 0)",
             o->device, ndev);
    return bad_usage("%s", why);
  }
  return open_receipt(o);
}

/* Phase 2: every signal whose default action would end the runner (and leave the job running) is
 * blocked and read with sigwaitinfo, so nothing runs in a signal handler and each such signal ends in
 * the job's teardown. The list is the library's (gg_proc_job_signals), the one a namespace's keeper
 * passes on too; SIGCHLD says CMD is done. As tini does, the runner starts from known dispositions
 * whatever its launcher left: SIGCHLD back to the default (ignored, the kernel reaps CMD itself and
 * the runner never sees it end). A signal ignored at start (nohup) stays ignored, is not taken, and
 * CMD inherits it ignored, as exec would have it. */
static void run_take_signals(sigset_t *set) {
  signal(SIGCHLD, SIG_DFL);
  int sigs[128];
  size_t n = gg_proc_job_signals(sigs, sizeof sigs / sizeof sigs[0]);
  sigemptyset(set);
  for (size_t i = 0; i < n && i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction cur;
    if (sigaction(sigs[i], NULL, &cur) == 0 && cur.sa_handler == SIG_IGN) continue;
    sigaddset(set, sigs[i]);
  }
  sigaddset(set, SIGCHLD);
  sigprocmask(SIG_BLOCK, set, NULL);
}

/* The canary: a child of the runner, in the job's process group and control group, that takes the
 * runner's signals and reports each (signal, code, sender) on a pipe. A signal sent to the whole group
 * (kill -- -PGID, a shell's SIGHUP to its jobs) or to every process of the control group (systemd's
 * stop, Slurm's) reaches it too, and the job with it; one sent to the runner alone does not. That is
 * how the runner tells whether CMD has a signal from its sender already (passed on, CMD would get it
 * twice). It dies with the runner. */
typedef struct canary_note {
  int sig, code, pid;
} canary_note_t;

typedef struct canary {
  pid_t pid; /* -1: none (fork refused): every signal is taken as sent to the runner alone */
  int fd;    /* the notes, read end, non-blocking */
  canary_note_t seen[32];
  double at[32];
  int n;
} canary_t;

static void canary_start(canary_t *c, const sigset_t *set) {
  int p[2];
  c->pid = -1, c->fd = -1, c->n = 0;
  if (pipe2(p, O_CLOEXEC) != 0) return;
  pid_t parent = getpid();
  pid_t kid = fork();
  if (kid == 0) { /* only async-signal-safe calls: the runner may have threads (a driver's) */
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL); /* what it does not take stays pending, harmless */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    close(p[0]);
    fcntl(p[1], F_SETFL, O_NONBLOCK); /* a note the runner has no room for is dropped, never waited on */
    sigset_t take = *set;
    sigdelset(&take, SIGCHLD);
    for (;;) {
      siginfo_t si;
      int sig = sigwaitinfo(&take, &si);
      if (sig < 0) continue;
      canary_note_t note = {sig, si.si_code, (int)si.si_pid};
      if (write(p[1], &note, sizeof note) < 0 && errno == EPIPE) _exit(0);
    }
  }
  close(p[1]);
  if (kid < 0) {
    close(p[0]);
    return;
  }
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  c->pid = kid, c->fd = p[0];
}

/* Reads the notes that came, forgetting those older than two seconds. */
static void canary_pump(canary_t *c) {
  double now = gg__now_ms();
  int k = 0;
  for (int i = 0; i < c->n; i++)
    if (now - c->at[i] < 2000) c->seen[k] = c->seen[i], c->at[k++] = c->at[i];
  c->n = k;
  canary_note_t note;
  while (c->fd >= 0 && read(c->fd, &note, sizeof note) == (ssize_t)sizeof note) {
    if (c->n == (int)(sizeof c->seen / sizeof c->seen[0])) {
      memmove(c->seen, c->seen + 1, sizeof c->seen - sizeof c->seen[0]);
      memmove(c->at, c->at + 1, sizeof c->at - sizeof c->at[0]);
      c->n--;
    }
    c->seen[c->n] = note, c->at[c->n++] = now;
  }
}

/* Whether the canary got the same signal from the same sender: then it was sent to the group (or the
 * control group), CMD has it already. A control group's processes are signalled one after another, so
 * the canary's may come a little after ours: up to 50 ms (what passing a signal on may be delayed). */
static bool canary_saw(canary_t *c, const siginfo_t *si) {
  if (c->pid < 0) return false;
  double until = gg__now_ms() + 50;
  for (;;) {
    canary_pump(c);
    for (int i = 0; i < c->n; i++)
      if (c->seen[i].sig == si->si_signo && c->seen[i].code == si->si_code &&
          c->seen[i].pid == (int)si->si_pid) {
        c->seen[i] = c->seen[--c->n], c->at[i] = c->at[c->n];
        return true;
      }
    double left = until - gg__now_ms();
    if (left <= 0) return false;
    struct pollfd pf = {.fd = c->fd, .events = POLLIN};
    poll(&pf, 1, (int)left + 1);
  }
}

static void canary_stop(canary_t *c) {
  if (c->pid < 0) return;
  kill(c->pid, SIGKILL);
  while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR) {
  }
  close(c->fd);
  c->pid = -1, c->fd = -1;
}

/* Phase 3: subreaper, session record, device figures, then CMD. Returns -1 on success, else the exit
 * status (127: CMD not found, 126: found but not runnable). */
static int run_start(run_opts_t *o, run_env_t *env, job_result_t *r) {
  if (gg_proc_set_subreaper(1) != 0)
    fprintf(stderr, "gpuguard run: warning: %s (double-forked descendants may escape)\n", gg_last_error());
  char devs[16];
  snprintf(devs, sizeof devs, "%ld", o->device);
  if (gg_registry_register(devs) != 0)
    fprintf(stderr, "gpuguard run: warning: no session record: %s\n", gg_last_error());
  gg_registry_session(env->session, sizeof env->session);
  env->have_dev = gg_device_info((int)o->device, &env->dev) == 0;
  gg_spawn_options_t so;
  gg_spawn_options_init(&so);
  so.pid_ns_grace_ms = (int)o->grace; /* the rest of the namespace gets --grace too */
  so.keep_ignored = 1;                /* nohup's SIGHUP (and any signal ignored at start) stays so */
  o->in_ns = o->pid_ns != GG_SPAWN_PID_NS_OFF;
  bool fallback = o->pid_ns == GG_SPAWN_PID_NS_AUTO; /* one line when refused, then the design without */
  char why[512] = "";
  if (fallback && gg_proc_pid_ns_probe() <= 0)
    o->in_ns = false, snprintf(why, sizeof why, "%s", gg_last_error());
  /* After a good probe the spawn asks for ON, not AUTO: a refusal between the two (a sysctl changed)
   * then falls back below, saying so, instead of a job that runs without one while the receipt says it
   * has one. */
  so.pid_ns = o->in_ns ? GG_SPAWN_PID_NS_ON : GG_SPAWN_PID_NS_OFF;
  int rc = gg_proc_spawn(NULL, (const char *const *)o->cmd, &so, &r->pid);
  if (rc != 0 && o->in_ns && fallback && strstr(gg_last_error(), "PID namespace"))
    o->in_ns = false, snprintf(why, sizeof why, "%s", gg_last_error());
  if (fallback && !o->in_ns) {
    fprintf(stderr,
            "gpuguard run: the job runs without a PID namespace, so if this runner is SIGKILLed what is "
            "left of it waits for `gpuguard reap` (--pid-ns=off or GPUGUARD_PID_NS=off: no check, no "
            "line). Why: %s\n",
            why);
    if (rc != 0) {
      so.pid_ns = GG_SPAWN_PID_NS_OFF;
      rc = gg_proc_spawn(NULL, (const char *const *)o->cmd, &so, &r->pid);
    }
  }
  if (rc == 0) return -1;
  fprintf(stderr, "gpuguard run: %s\n", gg_last_error());
  gg_registry_unregister();
  return rc == GG_ENOTFOUND ? 127 : 126;
}

/* The signals that ask the runner itself to end, on which the job gets its grace period and then the
 * teardown. Any other (SIGUSR1, SIGALRM, a real-time signal, ...) is a message for the job: passed on,
 * and if the job lives on, so does the runner. */
static bool asks_to_end(int sig) {
  return sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT;
}

/* Phase 4: wait for CMD. Where a signal came from decides what the runner does with it:
 *  - from the terminal (the kernel sent it to the foreground group: Ctrl-C, Ctrl-\, a hangup) with CMD
 *    in our group: CMD has it already; it is the job's business alone: not passed on, no deadline (an
 *    interactive program that survives Ctrl-C goes on). As session leader a hangup is ours alone.
 *  - sent to the whole group or control group (the canary got it too): CMD has it already, not passed on;
 *  - sent to the runner alone: passed on to CMD.
 * Only a signal that asks the runner to end (asks_to_end) starts the grace deadline, after which
 * what is left gets SIGKILL; a second such signal ends the wait at once. Returns the deadline, or -1. */
static double run_wait(const sigset_t *set, long grace, job_result_t *r, canary_t *canary) {
  double deadline = -1;
  while (!r->reaped) {
    siginfo_t si;
    /* At most 100 ms per wait: a thread that had SIGCHLD unblocked before phase 2 (one the CUDA driver
     * started while the device figures were read) takes the signal and drops it, and a CMD whose end
     * went unnoticed left the runner waiting forever (seen on an H200 host). A timed-out wait looks. */
    double left = deadline < 0 ? 100 : deadline - gg__now_ms();
    if (left <= 0) break;
    if (left > 100) left = 100;
    struct timespec ts = {(time_t)(left / 1e3), (long)(fmod(left, 1e3) * 1e6)};
    int sig = sigtimedwait(set, &si, &ts);
    canary_pump(canary);
    if (sig < 0 && errno == EAGAIN) sig = SIGCHLD; /* look anyway */
    if (sig < 0) continue;                         /* EINTR */
    if (sig == SIGCHLD) {
      int st;
      pid_t p;
      while ((p = waitpid(-1, &st, WNOHANG)) > 0) /* as subreaper, orphaned descendants come here too */
        if (p == r->pid) r->status = st, r->reaped = true;
      continue;
    }
    bool in_group = getpgid(r->pid) == getpgrp();
    bool leader_hup = sig == SIGHUP && getsid(0) == getpid();
    if (si.si_code == SI_KERNEL && in_group && !leader_hup) continue; /* the terminal's, CMD has it */
    bool has_it = si.si_code != SI_KERNEL && in_group && canary_saw(canary, &si);
    if (!has_it) kill(r->pid, sig);
    if (!r->runner_sig) r->runner_sig = sig;
    if (!asks_to_end(sig)) continue;
    if (deadline >= 0) { /* a second one: tear down now */
      fprintf(stderr, "gpuguard run: %s again: ending the job now\n", strsignal(sig));
      return deadline;
    }
    r->runner_sig = sig;
    deadline = gg__now_ms() + (double)grace;
    fprintf(stderr, "gpuguard run: got %s%s; the job has %ld ms to end (grace period)\n", strsignal(sig),
            has_it ? " (the job got it too)" : "", grace);
  }
  if (!r->reaped && deadline >= 0)
    fprintf(stderr, "gpuguard run: grace period over; what is left of the job gets SIGKILL\n");
  return deadline;
}

/* Phase 5: end what is left of the job. After a signal the job has had its grace period already: the
 * rest get what is left of it. A descendant forked by a dying process after the teardown's last look is
 * reparented to us (the subreaper): look again until nothing is left, a few times at most. */
static int run_teardown(long grace, double deadline, gg_proc_receipt_t **receipt) {
  long left = grace;
  if (deadline >= 0)
    left = (long)(deadline - gg__now_ms()), left = left < 100 ? 100 : left > grace ? grace : left;
  int trc = gg_proc_teardown_ex(NULL, (int)left, receipt);
  size_t termed = 0, killed = 0;
  for (size_t i = 0; *receipt && i < (*receipt)->count; i++) {
    termed += ((*receipt)->procs[i].sent & GG_PROC_SENT_TERM) != 0;
    killed += ((*receipt)->procs[i].sent & GG_PROC_SENT_KILL) != 0;
  }
  if (termed && deadline < 0) /* after a signal, the grace period was announced already */
    fprintf(stderr,
            "gpuguard run: %zu process%s of the job left running got SIGTERM and a grace period of %ld ms\n",
            termed, termed == 1 ? "" : "es", left);
  if (killed)
    fprintf(stderr, "gpuguard run: SIGKILL sent to %zu process%s still running after the grace period\n",
            killed, killed == 1 ? "" : "es");
  for (int round = 0; round < 3; round++) {
    gg_proc_receipt_t *more = NULL;
    gg_proc_teardown_ex(NULL, 0, &more);
    size_t found = more ? more->count : 0;
    if (found) fprintf(stderr, "gpuguard run: %zu late descendant%s ended\n", found, found == 1 ? "" : "s");
    gg_proc_receipt_free(more);
    if (!found) break;
  }
  return trc;
}

/* Phase 6: CMD's own status whenever it is known, even after a forwarded signal (a job that catches
 * SIGTERM and exits 0 exits 0); else how the teardown ended it, as the receipt says. */
static void run_conclude(job_result_t *r, const gg_proc_receipt_t *receipt) {
  if (!r->reaped && waitpid(r->pid, &r->status, WNOHANG) == r->pid) r->reaped = true;
  const gg_proc_outcome_t *mine = NULL;
  for (size_t i = 0; receipt && !r->reaped && i < receipt->count; i++)
    if (receipt->procs[i].pid == r->pid) mine = &receipt->procs[i];
  if (r->reaped)
    r->exit_code = WIFEXITED(r->status) ? WEXITSTATUS(r->status) : 128 + WTERMSIG(r->status);
  else if (mine && mine->end == GG_PROC_EXITED)
    r->exit_code = mine->code, r->status = mine->code << 8, r->reaped = true;
  else if (mine && mine->end == GG_PROC_SIGNALED)
    r->exit_code = 128 + mine->code, r->status = mine->code, r->reaped = true;
  else
    r->exit_code = 128 + (r->runner_sig ? r->runner_sig : SIGKILL);
}

/* Phase 7: one summary line on stderr. */
static void run_summary(const run_opts_t *o, const job_result_t *r, const gg_proc_receipt_t *receipt,
                        const run_env_t *env) {
  char a[32], b[32];
  size_t ended = receipt ? receipt->count - receipt->n_alive : 0;
  fprintf(stderr, "gpuguard run: %s %s %d%s; teardown: %zu process%s ended, %zu left", o->cmd[0],
          WIFEXITED(r->status) ? "exited" : "ended by signal",
          WIFEXITED(r->status) ? WEXITSTATUS(r->status) : WTERMSIG(r->status),
          r->runner_sig ? " (after the runner got a signal)" : "", ended, ended == 1 ? "" : "es",
          receipt ? receipt->n_alive : 0);
  if (env->have_dev)
    fprintf(stderr, "; device %ld free %s -> %s", o->device, human((double)env->dev.free_bytes, a, sizeof a),
            human((double)env->free_after, b, sizeof b));
  fputc('\n', stderr);
}

static int cmd_run(int argc, char **argv) {
  run_opts_t o;
  int rc = run_parse(argc, argv, &o);
  if (rc >= 0) return rc;
  sigset_t set;
  run_take_signals(&set);
  canary_t canary;
  canary_start(&canary, &set);
  run_env_t env = {0};
  job_result_t r = {0};
  if ((rc = run_start(&o, &env, &r)) >= 0) return canary_stop(&canary), rc;
  double deadline = run_wait(&set, o.grace, &r, &canary);
  canary_stop(&canary); /* before the teardown, which would count it as the job's */
  gg_proc_receipt_t *receipt = NULL;
  int trc = run_teardown(o.grace, deadline, &receipt);
  run_conclude(&r, receipt);
  fix_job_entry(receipt, &o, &r);
  if (env.have_dev && !free_after((int)o.device, env.dev.free_bytes, 3000, &env.free_after, &env.waited_ms))
    env.have_dev = false;
  /* Before our own record goes: it names the job's PID namespace, which proves that namespace's
   * records stale now that the job is over (and those of runners SIGKILLed go too). */
  gg_registry_prune(NULL);
  gg_registry_unregister();
  run_summary(&o, &r, receipt, &env);
  if (trc != 0) fprintf(stderr, "gpuguard run: teardown: %s\n", gg_last_error());
  if (o.receipt_path) write_receipt(&o, &r, receipt, &env);
  gg_proc_receipt_free(receipt);
  return r.exit_code;
}

/* ---- reap --------------------------------------------------------------------------------------------- */

/* A --pid value: decimal, 2 .. the kernel's pid_max. Anything else is a usage error naming it. */
static bool parse_pid(const char *text, int *out, char *why, size_t cap) {
  long max = 4194304; /* PID_MAX_LIMIT, when pid_max cannot be read */
  FILE *f = fopen("/proc/sys/kernel/pid_max", "r");
  if (f) {
    if (fscanf(f, "%ld", &max) != 1) max = 4194304;
    fclose(f);
  }
  char safe[64];
  cli_safe_text(text, safe, sizeof safe);
  const char *p = text;
  bool neg = *p == '-';
  p += neg;
  bool digits = *p != '\0';
  for (const char *q = p; *q; q++) digits = digits && *q >= '0' && *q <= '9';
  if (!digits) return snprintf(why, cap, "--pid '%s': not a process id (a decimal number)", safe), false;
  errno = 0;
  long long v = strtoll(text, NULL, 10);
  if (neg || v < 0)
    return snprintf(why, cap, "--pid '%s': negative (a negative pid names a process group)", safe), false;
  if (v == 0) return snprintf(why, cap, "--pid 0: names the caller's process group, not a process"), false;
  if (errno || v > max)
    return snprintf(why, cap, "--pid '%s': out of range (pids go up to %ld here)", safe, max), false;
  *out = (int)v;
  return true;
}

/* Why a named process is not ours to end, or NULL. */
static const char *refuse_named(const gg_process_t *row, bool all_users) {
  if (row->pid == 1) return "pid 1 (init) is never ended";
  if (row->pid == (int)getpid()) return "that is this gpuguard process";
  gg_process_t up;
  for (int p = (int)getppid(), depth = 0; p > 1 && depth < 128; depth++) {
    if (p == row->pid) return "an ancestor of this gpuguard process (ending it would end its own shell)";
    if (gg_process_describe(p, &up) != 0) break;
    p = up.ppid;
  }
  if (row->command[0] == '[' && (row->ppid == 2 || row->pid == 2)) return "a kernel thread";
  if (row->uid != (unsigned)getuid() && !(all_users && geteuid() == 0))
    return geteuid() == 0 ? "another user's process (add --all-users to end it)"
                          : "another user's process (only root may end it, with --all-users)";
  return NULL;
}

static void print_candidate(const gg_process_t *p) {
  char mem[32] = "-", user[sizeof p->user * 4], cmd[sizeof p->command * 4], why[sizeof p->why * 4];
  if (p->used_bytes >= 0) human((double)p->used_bytes, mem, sizeof mem);
  cli_safe_text(p->user, user, sizeof user); /* escape sequences in argv must not reach the terminal */
  cli_safe_text(p->command, cmd, sizeof cmd);
  cli_safe_text(p->why[0] ? p->why : "no evidence either way", why, sizeof why);
  printf("%s %d (user %s, GPU memory %s, start %llu): %s\n    why: %s\n", gg_process_class_name(p->cls),
         p->pid, user, mem, p->start_time, cmd, why);
}

typedef struct reap_opts {
  bool dry, yes, all;
  long grace;
  int *pids;
  size_t npids;
} reap_opts_t;

/* reap's arguments, in any order; every value after --pid up to the next option is a pid. */
static int reap_parse(int argc, char **argv, reap_opts_t *o) {
  bool in_pids = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    char why[160];
    bool number = a[0] != '-' || (a[1] >= '0' && a[1] <= '9'); /* "-5" is a (bad) pid, not an option */
    if (in_pids && number) {
      int pid;
      if (!parse_pid(a, &pid, why, sizeof why)) return bad_usage("%s", why);
      o->pids[o->npids++] = pid;
      continue;
    }
    in_pids = false;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout, current), 0;
    if (!strcmp(a, "-n") || !strcmp(a, "--dry-run")) {
      o->dry = true;
    } else if (!strcmp(a, "-y") || !strcmp(a, "--yes")) {
      o->yes = true;
    } else if (!strcmp(a, "--all-users")) {
      o->all = true;
    } else if (!strcmp(a, "--pid") || !strncmp(a, "--pid=", 6)) {
      const char *v = a[5] == '=' ? a + 6 : i + 1 < argc ? argv[++i] : NULL;
      if (!v) return bad_usage("%s", "--pid needs a value");
      int pid;
      if (!parse_pid(v, &pid, why, sizeof why)) return bad_usage("%s", why);
      o->pids[o->npids++] = pid;
      in_pids = true;
    } else if (!strcmp(a, "--grace") || !strncmp(a, "--grace=", 8)) {
      const char *v = a[7] == '=' ? a + 8 : i + 1 < argc ? argv[++i] : NULL;
      if (!v) return bad_usage("%s", "--grace needs a value");
      if (!parse_grace(v, &o->grace)) return EXIT_USAGE;
    } else if (a[0] == '-') {
      return bad_usage("unknown option '%s'", a);
    } else {
      return bad_usage("unexpected argument '%s' (pids go after --pid)", a);
    }
  }
  if (o->dry && o->yes) return bad_usage("%s", "--dry-run and --yes are exclusive");
  if (o->all && geteuid() != 0)
    return bad_usage("%s", "--all-users: only root may end other users' processes");
  return -1;
}

static int cmd_reap(int argc, char **argv) {
  reap_opts_t o = {.grace = 2000};
  o.pids = calloc((size_t)argc, sizeof *o.pids);
  if (!o.pids) return fprintf(stderr, "gpuguard reap: out of memory\n"), 1;
  int rc = reap_parse(argc, argv, &o);
  if (rc >= 0) return free(o.pids), rc;

  gg_process_t *rows = NULL;
  size_t n = 0;
  bool refused = false;
  if (o.npids) { /* named: any class, with the same checks */
    rows = calloc(o.npids, sizeof *rows);
    for (size_t i = 0; rows && i < o.npids; i++) {
      gg_process_t row;
      const char *no = NULL;
      bool dup = false;
      for (size_t j = 0; j < n; j++) dup = dup || rows[j].pid == o.pids[i];
      if (dup) continue;
      if (o.pids[i] == 1)
        no = "pid 1 (init) is never ended";
      else if (gg_process_describe(o.pids[i], &row) != 0)
        no = "no such process";
      else
        no = refuse_named(&row, o.all);
      if (no) {
        printf("refused %d: %s; nothing was sent to it\n", o.pids[i], no);
        refused = true;
        continue;
      }
      rows[n++] = row;
    }
  } else {
    size_t count = 0, cap = 64;
    for (int attempt = 0; attempt < 4; attempt++) {
      gg_process_t *grown = realloc(rows, cap * sizeof *rows);
      if (!grown) break;
      rows = grown;
      if (gg_reap_list(o.all ? GG_REAP_ALL_USERS : 0, rows, cap, &count) != 0) {
        fprintf(stderr, "gpuguard reap: %s\n", gg_last_error());
        return free(rows), free(o.pids), 1;
      }
      if (count <= cap) break;
      cap = count + 16;
    }
    n = count < cap ? count : cap;
  }
  free(o.pids);
  if (!rows) return fprintf(stderr, "gpuguard reap: out of memory\n"), 1;
  if (n == 0) {
    free(rows);
    if (refused) return 1;
    gg_registry_prune(NULL); /* records of dead sessions with nothing left are not sessions any more */
    return puts("gpuguard reap: no stranded workers and no orphans of dead sessions"), 0;
  }
  for (size_t i = 0; i < n; i++) print_candidate(&rows[i]);
  const char *what = n == 1 ? "process" : "processes";
  if (o.dry) return printf("%zu %s; --dry-run: nothing was done\n", n, what), free(rows), refused;
  if (!o.yes) {
    if (!isatty(STDIN_FILENO))
      return printf("%zu %s; run with --yes to end them\n", n, what), free(rows), refused;
    printf("end %s? [y/N] ", n == 1 ? "it" : "them");
    fflush(stdout);
    int c = getchar();
    if (c != 'y' && c != 'Y') return puts("nothing was done"), free(rows), refused;
  }
  int *pids = calloc(n, sizeof *pids);
  unsigned long long *starts = calloc(n, sizeof *starts);
  gg_proc_outcome_t *out = calloc(n, sizeof *out);
  if (!pids || !starts || !out) return fprintf(stderr, "gpuguard reap: out of memory\n"), 1;
  for (size_t i = 0; i < n; i++) pids[i] = rows[i].pid, starts[i] = rows[i].start_time;
  rc = gg_reap(pids, starts, n, (int)o.grace, o.all ? GG_REAP_ALL_USERS : 0, out);
  size_t ended = 0, skipped = 0, alive = 0;
  for (size_t i = 0; i < n; i++) {
    const gg_proc_outcome_t *p = &out[i];
    if (p->end == GG_PROC_SKIPPED || (p->end == GG_PROC_ENDED && !p->sent)) {
      printf("skipped %d: %s; nothing was sent to it\n", (int)p->pid, p->found);
      skipped++;
      continue;
    }
    bool up = p->end == GG_PROC_ALIVE;
    alive += up, ended += !up;
    printf("%d: sent%s%s%s -> %s", (int)p->pid, p->sent & GG_PROC_SENT_TERM ? " TERM" : "",
           p->sent & GG_PROC_SENT_CONT ? " CONT" : "", p->sent & GG_PROC_SENT_KILL ? " KILL" : "",
           up ? "STILL ALIVE" : "ended");
    if (up) printf(" (state %c)", p->state >= 0x21 && p->state < 0x7f ? p->state : '?');
    putchar('\n');
  }
  size_t pruned = 0;
  gg_registry_prune(&pruned); /* a dead leader's record goes once nothing of its session is left */
  printf("%zu ended, %zu skipped, %zu could not be ended", ended, skipped, alive);
  if (pruned) printf("; %zu stale registry record%s removed", pruned, pruned == 1 ? "" : "s");
  putchar('\n');
  free(pids), free(starts), free(out), free(rows);
  return rc == 0 && !refused ? 0 : 1;
}

/* ---- check -------------------------------------------------------------------------------------------- */

/* BYTES with an optional K/M/G/T suffix (powers of 1024). */
static bool parse_bytes(const char *text, long long *out) {
  char *end = NULL;
  errno = 0;
  if (!(*text >= '0' && *text <= '9')) return false;
  unsigned long long v = strtoull(text, &end, 10);
  int shift = 0;
  const char *units = "KMGT", *u = *end ? strchr(units, *end & ~0x20) : NULL;
  if (u && end[1] == '\0') shift = 10 * (int)(u - units + 1), end++;
  if (errno || *end || v > (unsigned long long)INT64_MAX >> shift) return false;
  *out = (long long)(v << shift);
  return true;
}

static int cmd_check(int argc, char **argv) {
  static const struct option longs[] = {{"json", no_argument, 0, 'j'},
                                        {"allow", required_argument, 0, 'a'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  bool json = false;
  long long allow = 1LL << 30;
  int o;
  while ((o = next_opt(argc, argv, longs)) != -1) {
    if (o == 'h') return usage(stdout, current), 0;
    if (o == 'j')
      json = true;
    else if (o == 'a') {
      if (!parse_bytes(optarg, &allow))
        return bad_usage("--allow '%s': bytes expected (e.g. 0, 512M, 2G)", optarg);
    } else
      return cli_opt_error(o, argv);
  }
  if (optind < argc) return bad_usage("unexpected argument '%s'", argv[optind]);
  gg_process_t *rows;
  size_t n;
  bool no_gpu = false;
  if (cli_gather_processes(&rows, &n, &no_gpu, stderr) != 0) {
    free(rows);
    if (!no_gpu) return 1;
    fprintf(stderr,
            "gpuguard check: no NVIDIA GPU on this machine (neither NVML nor the CUDA driver loads)\n");
    if (json) puts("{\"ok\":false,\"no_gpu\":true,\"problems\":[]}");
    return EXIT_NO_GPU;
  }
  int ndev = 0;
  if (gg_device_count(&ndev) != 0) ndev = 0;
  FILE *f = stdout;
  unsigned problems = 0;
  if (json) fprintf(f, "{\"allow_bytes\":%lld,\"problems\":[", allow);
  for (size_t i = 0; i < n; i++) {
    const gg_process_t *p = &rows[i];
    if (!reapable(p)) continue;
    char mem[32] = "? bytes", cmd[sizeof p->command * 4], why[sizeof p->why * 4], user[sizeof p->user * 4];
    if (json) {
      fprintf(f, "%s{\"kind\":\"%s\",\"device\":%d,\"pid\":%d,\"uid\":%u,\"start_time\":%llu,\"used_bytes\":",
              problems ? "," : "", gg_process_class_name(p->cls), p->device, p->pid, p->uid, p->start_time);
      if (p->used_bytes < 0)
        fputs("null", f);
      else
        fprintf(f, "%lld", p->used_bytes);
      fputs(",\"command\":", f), gg_json_write_string(f, p->command);
      fputs(",\"why\":", f), gg_json_write_string(f, p->why);
      fputc('}', f);
    } else {
      if (p->used_bytes >= 0) human((double)p->used_bytes, mem, sizeof mem);
      cli_safe_text(p->command, cmd, sizeof cmd);
      cli_safe_text(p->why, why, sizeof why);
      cli_safe_text(p->user, user, sizeof user);
      fprintf(f, "GPU %d: %s process %d (user %s) holds %s: %s (%s)\n", p->device,
              gg_process_class_name(p->cls), p->pid, user, mem, cmd, why);
    }
    problems++;
  }
  /* Memory the driver counts as used that no listed process holds: a dead process the driver has not
   * cleaned up, another container's, or the driver's own reserve (which --allow is for). */
  for (int d = 0; d < ndev; d++) {
    gg_device_info_t info;
    if (gg_device_info(d, &info) != 0) continue;
    long long listed = 0;
    for (size_t i = 0; i < n; i++)
      if (rows[i].device == d && rows[i].used_bytes > 0) listed += rows[i].used_bytes;
    long long loose = (long long)info.used_bytes - listed;
    if (loose <= allow) continue;
    char a[32], b[32];
    if (json)
      fprintf(f, "%s{\"kind\":\"unaccounted\",\"device\":%d,\"used_bytes\":%lld,\"listed_bytes\":%lld}",
              problems ? "," : "", d, (long long)info.used_bytes, listed);
    else
      fprintf(f, "GPU %d: %s in use that no listed process holds (allowed: %s)\n", d,
              human((double)loose, a, sizeof a), human((double)allow, b, sizeof b));
    problems++;
  }
  free(rows);
  if (json)
    fprintf(f, "],\"ok\":%s}\n", problems ? "false" : "true");
  else if (!problems)
    fputs("ok: no stranded or orphaned processes, nothing held beyond the allowance\n", f);
  return problems ? 1 : 0;
}

/* ---- plot -------------------------------------------------------------------------------------------- */

/* The chart is drawn by the Python package (gpuguard.diagnostics.plot): one renderer for timelines
 * recorded by gpuguard.record() and by `watch --record`. Says clearly what is missing when Python or the
 * package is. */
static int cmd_plot(int argc, char **argv) {
  if (argc < 2) return bad_usage("%s", "no timeline given (gpuguard plot FILE -o memory.html)");
  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(stdout, current), 0;
  /* The package loads the C library: the one this command runs on, unless the caller chose another. */
  Dl_info info;
  const char *(*fn)(void) = gg_version;
  void *addr;
  memcpy(&addr, &fn, sizeof addr); /* ISO C's way from a function pointer to an address */
  if (!getenv("GPUGUARD_LIBRARY") && dladdr(addr, &info) && info.dli_fname)
    setenv("GPUGUARD_LIBRARY", info.dli_fname, 1);
  static const char boot[] =
      "import sys\n"
      "try:\n"
      "    from gpuguard.diagnostics.plot import main\n"
      "except ImportError as e:\n"
      "    sys.stderr.write('gpuguard plot: the Python package gpuguard draws the chart and cannot be '\n"
      "                     'imported (%s); install it (pip install ./bindings/python) or set PYTHONPATH\\n' "
      "% e)\n"
      "    sys.exit(1)\n"
      "sys.exit(main(sys.argv[1:]))\n";
  char **args = calloc((size_t)argc + 3, sizeof *args);
  if (!args) return fprintf(stderr, "gpuguard plot: out of memory\n"), 1;
  /* The interpreter the package was installed into (the wheel's `gpuguard` sets GPUGUARD_PYTHON), else
   * python3 from PATH. */
  const char *py = getenv("GPUGUARD_PYTHON");
  if (!py || !*py) py = "python3";
  args[0] = (char *)py, args[1] = "-c", args[2] = (char *)boot;
  for (int i = 1; i < argc; i++) args[i + 2] = argv[i];
  fflush(NULL);
  execvp(py, args);
  int err = errno;
  free(args);
  fprintf(stderr, "gpuguard plot: cannot run %s (%s): the chart is drawn by the Python package gpuguard\n",
          py, strerror(err));
  return err == ENOENT ? 127 : 126;
}

/* ---- dispatch ----------------------------------------------------------------------------------------- */

static const command_t commands[] = {
    {"ps", "[--json] [--all-users] [--why] [-i N] [--color=WHEN]",
     "Lists the processes holding GPU memory; stranded ones stand out.", cmd_ps,
     "  --json        devices and processes as JSON (each with its class and \"why\")\n"
     "  --all-users   include processes of other users (hidden by default)\n"
     "  --why         the evidence for each class, on a line under its row\n"
     "  -i, --id N    only device N\n"
     "  --color=WHEN  auto (on a terminal, unless NO_COLOR is set), always or never\n"
     "  -h, --help    this help\n"
     "Classes: guarded (in a live gpuguard session), orphan (its session's leader died), stranded (a\n"
     "worker no session knows whose parent is gone: multiprocessing, DataLoader, torch.distributed,\n"
     "joblib, Ray), detached (a program left running on purpose: nohup, setsid, tmux, a service, a\n"
     "container's init; never reaped unless named), fd-holder (holds /dev/nvidia* but no context),\n"
     "foreign (another user), unknown. gpuguard itself is never listed. Control characters in commands\n"
     "are shown as \\xHH. The last line names the command that ends what it counts.\n"
     "Exit status (the same with --json): 0 listed (also when nothing holds a GPU), 1 the list could not\n"
     "be read, 2 usage error, 3 no NVIDIA GPU on this machine (neither NVML nor the CUDA driver loads).\n"},
    {"run", "[--grace MS] [--receipt PATH] [--device N] [--pid-ns[=auto|on|off]] [--torch] -- CMD ARGS...",
     "Runs CMD as a guarded job; when it ends or the runner is signalled, nothing of it is left.", cmd_run,
     "  --grace TIME    how long the job has to end after SIGTERM before SIGKILL: 500ms, 2s (a bare\n"
     "                  number is milliseconds; default 2s, at most 600s)\n"
     "  --receipt PATH  write a JSON receipt: what was sent to whom, how each ended, device free memory\n"
     "                  before and after ('-' for stdout)\n"
     "  --device N      the device whose free memory the receipt records (default 0)\n"
     "  --pid-ns[=MODE] CMD in its own PID namespace, so that if the runner is SIGKILLed the kernel\n"
     "                  ends every process of the job at once. auto (MODE when left out): where the\n"
     "                  system allows one (root, or an unprivileged user namespace), otherwise\n"
     "                  without, saying so on one line (the default); on: or fail (exit 126); off.\n"
     "                  GPUGUARD_PID_NS=auto|on|off sets the default (a bad value is a usage error)\n"
     "  --torch         GPUGUARD_TORCH=1 for the job: its Python processes take gpuguard as PyTorch's\n"
     "                  CUDA allocator (the Python package's startup hook)\n"
     "  -h, --help      this help\n"
     "The runner is a child subreaper, records a session leader in the registry (children inherit\n"
     "GPUGUARD_SESSION), takes every signal that would otherwise end the runner (SIGINT, SIGTERM,\n"
     "SIGHUP, SIGQUIT, SIGUSR1/2, SIGALRM, SIGPIPE, SIGXCPU, ...) and sees that CMD gets it once: the\n"
     "terminal's and those sent to the whole group reach CMD directly, those sent to the runner alone are\n"
     "passed on. Only SIGTERM, SIGINT, SIGHUP or SIGQUIT not from the terminal start the grace period.\n"
     "Signals ignored at start (nohup) stay ignored, in CMD too. Exits with CMD's status (128+N when CMD\n"
     "was ended by signal N), also when the receipt cannot be written; the runner's signal is in the\n"
     "receipt, which replaces PATH in one rename.\n"},
    {"reap", "[-n|--dry-run] [-y|--yes] [--grace TIME] [--all-users] [--pid PID...]",
     "Ends your stranded workers and the orphans of dead gpuguard sessions.", cmd_reap,
     "  -n, --dry-run  list them, do nothing\n"
     "  -y, --yes      end them without asking (otherwise asks on a terminal, lists elsewhere)\n"
     "  --grace TIME   time between SIGTERM and SIGKILL: 500ms, 2s (a bare number is milliseconds;\n"
     "                 default 2s, at most 600s)\n"
     "  --all-users    as root: other users' stranded workers too\n"
     "  --pid PID...   end these processes instead, whatever their class (the only way to end a\n"
     "                 detached one); pid 1, this process and its ancestors, kernel threads and other\n"
     "                 users' processes (without --all-users as root) are refused\n"
     "  -h, --help     this help\n"
     "Each process is checked by its start time and held by pidfd right before the first signal, so a\n"
     "pid reused since the listing is never signalled; one line per process says what was sent.\n"
     "Stale registry records with nothing of their session left are removed. Exit status: 0 done (or\n"
     "nothing to do), 1 something was refused or survived SIGKILL, 2 usage error.\n"},
    {"check", "[--json] [--allow BYTES]",
     "Exits 0 when the GPUs hold nothing beyond the allowance, 1 when something is held.", cmd_check,
     "  --json         the problems as JSON\n"
     "  --allow BYTES  memory no listed process holds that is tolerated per GPU (K/M/G suffixes;\n"
     "                 default 1G: NVML counts the driver's reserve as used)\n"
     "  -h, --help     this help\n"
     "One line per problem on stdout: a stranded or orphaned process and the memory it holds, memory\n"
     "no listed process holds. Exit status: 0 ok, 1 something is held, 2 usage error, 3 no NVIDIA GPU.\n"
     "For Slurm prologs and epilogs, Kubernetes probes and CI steps (docs/deploy.md).\n"},
    {"info", "[--json|--prom] [-i N]", "Shows the devices and their memory.", cmd_info,
     "  --json        as JSON\n"
     "  --prom        as Prometheus text exposition (format 0.0.4): the GPUs NVML sees, labelled as\n"
     "                DCGM's exporter labels them; none (and a line on stderr) without a GPU\n"
     "  -i, --id N    only device N (the table)\n"
     "  -h, --help    this help\n"},
    {"plot", "FILE [-o OUT.html] [--x time|step] [--title TEXT]",
     "Draws a memory timeline (watch --record, gpuguard.record()) as one self-contained HTML file.", cmd_plot,
     "  -o, --output OUT  the HTML file to write (default memory.html)\n"
     "  --x time|step     horizontal axis (default time)\n"
     "  --title TEXT      the page's title\n"
     "  -h, --help        this help\n"
     "Runs gpuguard.diagnostics.plot with GPUGUARD_PYTHON (set by the wheel's gpuguard command to its\n"
     "own interpreter), else python3 (the Python package must be importable;\n"
     "GPUGUARD_LIBRARY is set to this command's library unless it is set already).\n"},
    {"watch",
     "[--interval TIME] [--count N] [-i N] [--color=WHEN] [--record FILE] | [--prom-file PATH] "
     "[--listen [ADDR][:PORT]] [--all-users]",
     "A live view of devices, processes and gpuguard sessions; or a Prometheus exporter.", cmd_watch,
     "  --interval TIME     time between refreshes: 500ms, 10s, 1m (a bare number is seconds; default 2s)\n"
     "  --count N           stop after N refreshes (with --listen alone: after N scrapes)\n"
     "  -i, --id N          the view shows device N only\n"
     "  --color=WHEN        auto (on a terminal, unless NO_COLOR is set), always or never\n"
     "  --no-color          the same as --color=never\n"
     "  --record FILE       append a sample of each device's used memory to FILE every interval, as\n"
     "                      JSON lines that `gpuguard plot FILE` draws\n"
     "  --prom-file PATH    write Prometheus text to PATH every interval, atomically (node_exporter's\n"
     "                      textfile collector)\n"
     "  --listen ADDR:PORT  serve Prometheus text at http://ADDR:PORT/metrics (and a page at / linking it)\n"
     "                      to many scrapers at once. Without an address, loopback only (127.0.0.1):\n"
     "                      9402, :9402 and 127.0.0.1 are the same; 0.0.0.0:9402 or [::]:9402 for every\n"
     "                      interface (a warning says so). The default port is 9402 (DCGM's exporter\n"
     "                      has 9400); port 0 picks a free one, printed on stderr\n"
     "  --all-users         include other users' command lines in gpuguard_process_info (left out by\n"
     "                      default, as ps hides them)\n"
     "  -h, --help          this help\n"
     "On a terminal the view fits the width and redraws in place: q quits, any other key refreshes.\n"
     "Per GPU: utilisation, memory utilisation, temperature and power (from NVML), memory used/total.\n"
     "Series cover the GPUs NVML sees, labelled gpu (NVML's index), UUID, pci_bus_id, device, modelName\n"
     "and Hostname as NVIDIA's DCGM exporter labels them; without a GPU, none (a line on stderr says so).\n"
     "A failed --prom-file write is said and tried again next interval (the status is 1 if the last\n"
     "failed). SIGTERM/SIGINT end it (status 0).\n"},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void main_usage(FILE *f) {
  fprintf(f, "usage: gpuguard COMMAND [OPTIONS]   (gpuguard %s; -V, --version)\n\ncommands:\n", gg_version());
  for (size_t i = 0; i < NCOMMANDS; i++) fprintf(f, "  %-6s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\n'gpuguard COMMAND --help' describes each command.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) return main_usage(stderr), EXIT_USAGE;
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help"))
    return main_usage(stdout), 0;
  if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V"))
    return printf("gpuguard %s\n", gg_version()), 0;
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (!strcmp(argv[1], commands[i].name)) {
      current = &commands[i];
      return commands[i].run(argc - 1, argv + 1);
    }
  fprintf(stderr, "gpuguard: unknown command '%s'\n", argv[1]);
  main_usage(stderr);
  return EXIT_USAGE;
}
