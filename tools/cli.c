/* cli.c — what every `gpuguard` command shares: usage and its errors, option parsing, option values
 * read the same way everywhere, text made safe for a terminal, and the process table's rows. */
#include <errno.h>
#include <getopt.h>
#include <locale.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <wchar.h>
#include <wctype.h>

#include "cli_internal.h"

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
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    u++;
  }
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
  /* `--grace -- CMD`: getopt takes "--" as the value; it is the separator, so the value is
   * missing. */
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

/* Text is decoded as UTF-8 whatever the user's locale says (command lines and NVML names are UTF-8
 * or garbage); without the C.UTF-8 locale only printable ASCII counts as text. */
static locale_t utf8_locale(void) {
  static locale_t loc;
  static bool tried;
  if (!tried) {
    tried = true;
    loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
  }
  return loc;
}

/* The printable character at p: its length in bytes and its width in columns; 0 when it is not
 * one. */
static size_t printable_at(const char *p, size_t avail, int *width) {
  unsigned char c = (unsigned char)*p;
  if (c >= 0x20 && c < 0x7f) {
    *width = 1;
    return 1;
  }
  locale_t loc = utf8_locale();
  if (c < 0x80 || !loc) return 0;
  locale_t old = uselocale(loc);
  mbstate_t st;
  memset(&st, 0, sizeof st);
  wchar_t wc;
  size_t n = mbrtowc(&wc, p, avail, &st);
  /* C1 controls (CSI) are not */
  int w = n > 0 && n <= 4 && iswprint((wint_t)wc) ? wcwidth(wc) : -1;
  uselocale(old);
  if (w < 0) return 0;
  *width = w;
  return n;
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
    w += len;
    p += n ? n : 1;
    left -= n ? n : 1;
  }
  if (cap) out[w] = '\0';
}

size_t cli_fit(const char *s, int cols, int *used) {
  size_t off = 0, left = strlen(s);
  *used = 0;
  while (s[off]) {
    int width;
    size_t n = printable_at(s + off, left - off, &width);
    if (n == 0) {
      n = 1;
      width = 1;
    }
    if (cols >= 0 && *used + width > cols) break;
    off += n;
    *used += width;
  }
  return off;
}

/* ---- option values every command reads the same way ------------------------------------------ */

bool cli_duration(const char *opt, const char *text, double default_unit_ms, double min_ms,
                  double max_ms, double *out_ms) {
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
             "%s '%s': a duration from %g to %g %s expected, with a unit (500ms, 2s, 1m) or a bare "
             "number "
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
  if (!errno && end != text && !*end && v >= 0 && v <= 1023) {
    *device = (int)v;
    return true;
  }
  /* A UUID, as nvidia-smi -i takes it: the GPU must exist now. */
  if (strncasecmp(text, "GPU-", 4) == 0 || strncasecmp(text, "MIG-", 4) == 0) {
    if (gg_gpu_find(text, device) == 0) return true;
    bad_usage("-i '%s': no GPU of this machine has this UUID", text);
    return false;
  }
  bad_usage("-i '%s': a device number (0, 1, ...) expected", text);
  return false;
}

int cli_gpu_exists(const char *cmd, int gpu) {
  int n = 0;
  bool gpus = false;
  if (gpu < 0) return 0;
  if (cli_devices(&gpus, &n) < 0) {
    fprintf(stderr, "gpuguard %s: %s\n", cmd, gg_last_error());
    return 1;
  }
  if (gpu < n) return 0;
  fprintf(stderr, "gpuguard %s: -i %d: no such GPU (this machine has %d)\n", cmd, gpu, n);
  return EXIT_USAGE;
}

/* --grace for run and reap: seconds when bare, as timeout(1), docker stop -t and Slurm's KillWait
 * count; at most the library's own limit, so what the CLI accepts the teardown accepts. A bare
 * number above that limit is most likely an old script's milliseconds (the unit once was ms):
 * refused with the spelling that keeps its meaning, rather than waited for (5000 would be 83
 * minutes). */
bool cli_grace(const char *text, long *out) {
  const double max_s = GG_PROC_GRACE_MAX_MS / 1e3;
  bool bare = *text && strspn(text, "0123456789.") == strlen(text);
  if (bare && strtod(text, NULL) > max_s) {
    char why[256];
    snprintf(why, sizeof why,
             "--grace '%s': a bare number is seconds, at most %g; did you mean %sms?", text, max_s,
             text);
    bad_usage("%s", why);
    return false;
  }
  double ms;
  if (!cli_duration("--grace", text, 1000, 0, GG_PROC_GRACE_MAX_MS, &ms)) return false;
  *out = lround(ms);
  return true;
}

bool cli_no_gpu(void) {
  gg_device_info_t d;
  gg_device_telemetry_t t;
  /* telemetry says GG_ENOTSUP exactly when NVML cannot be loaded */
  return gg_device_info(0, &d) == 0 && d.simulated && gg_device_telemetry(0, &t) == GG_ENOTSUP;
}

/* ---- the process table ----------------------------------------------------------------------- */

int cli_devices(bool *gpus, int *n) {
  *gpus = gg_gpu_count(n) == 0;
  return *gpus ? 0 : gg_device_count(n);
}

int cli_device_info(bool gpus, int i, gg_device_info_t *d) {
  return gpus ? gg_gpu_info(i, d) : gg_device_info(i, d);
}

int cli_device_telemetry(bool gpus, int i, gg_device_telemetry_t *t) {
  return gpus ? gg_gpu_telemetry(i, t) : gg_device_telemetry(i, t);
}

/* Gathered before printing so a failure prints no half table. */
int cli_gather_processes(gg_process_t **out, size_t *nout, bool *no_gpu, FILE *errs, int only) {
  int n = 0;
  *out = NULL;
  *nout = 0;
  *no_gpu = false;
  int rc = gg_gpu_count(&n); /* every GPU NVML reports, whether CUDA here sees it or not */
  if (rc == GG_ENODEV) {
    *no_gpu = true; /* neither NVML nor the driver: no GPU here */
    return 1;
  }
  if (rc < 0) {
    if (errs) fprintf(errs, "gpuguard: %s\n", gg_last_error());
    return 1;
  }
  int lo = 0, hi = n;
  if (only >= 0) { /* -i: the GPU asked for is the only one read */
    lo = only;
    hi = only < n ? only + 1 : only;
  }
  for (int dev = lo; dev < hi; dev++) {
    size_t count = 0, cap = 8;
    for (int attempt = 0; attempt < 4; attempt++) {
      gg_process_t *grown = realloc(*out, (*nout + cap) * sizeof **out);
      if (!grown) {
        if (errs) fprintf(errs, "gpuguard: out of memory\n");
        return 1;
      }
      *out = grown;
      rc = gg_gpu_processes(dev, *out + *nout, cap, &count);
      if (rc < 0) { /* fail closed: an unreadable GPU is no GPU without processes */
        if (errs) fprintf(errs, "gpuguard: GPU %d: %s\n", dev, gg_last_error());
        return 1;
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
bool cli_reapable(const gg_process_t *p) {
  return p->cls == GG_PROCESS_STRANDED || p->cls == GG_PROCESS_ORPHAN;
}

/* reap and check judge orphans by the session registry: without it a dead session's orphans look
 * like nothing at all, and "no orphans" would be a lie. Says so on stderr; false when unusable. */
bool cli_registry_usable(const char *cmd) {
  char dir[4096];
  if (gg_registry_dir(dir, sizeof dir) == 0) return true;
  fprintf(stderr,
          "gpuguard %s: the session registry cannot be used, so orphans of dead sessions cannot be "
          "told: %s\n",
          cmd, gg_last_error());
  return false;
}
