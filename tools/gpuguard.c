/* gpuguard.c — the `gpuguard` command line: who holds GPU memory (ps), devices (info, watch), built on
 * the public API only. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpuguard/gpuguard.h"

#define EXIT_USAGE 2

typedef struct command {
  const char *name, *args, *summary;
  int (*run)(int argc, char **argv);
  const char *help; /* options, one per line */
} command_t;

static const command_t *current;

static void usage(FILE *f, const command_t *c) {
  fprintf(f, "usage: gpuguard %s %s\n  %s\n%s", c->name, c->args, c->summary, c->help);
}

/* A bad flag: say what was wrong, print the usage to stderr, exit 2. */
static int bad_usage(const char *fmt, const char *what) {
  fprintf(stderr, "gpuguard %s: ", current->name);
  fprintf(stderr, fmt, what);
  fputc('\n', stderr);
  usage(stderr, current);
  return EXIT_USAGE;
}

static const char *human(double bytes, char *buf, size_t cap) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, u++;
  snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

/* Parses the common short options shared by every command; returns -1 when done, the option, or '?'. */
static int next_opt(int argc, char **argv, const struct option *longs) {
  opterr = 0;
  return getopt_long(argc, argv, "+h", longs, NULL);
}

/* ---- info -------------------------------------------------------------------------------------- */

static int print_devices(FILE *f) {
  int n = 0;
  if (gg_device_count(&n) < 0) {
    fprintf(stderr, "gpuguard: %s\n", gg_last_error());
    return 1;
  }
  char a[32], b[32], c[32];
  fprintf(f, "%-3s %-28s %-8s %12s %12s %12s  %s\n", "GPU", "NAME", "BACKEND", "TOTAL", "USED", "FREE", "UUID");
  for (int i = 0; i < n; i++) {
    gg_device_info_t d;
    if (gg_device_info(i, &d) < 0) {
      fprintf(f, "%-3d (unreadable: %s)\n", i, gg_last_error());
      continue;
    }
    fprintf(f, "%-3d %-28.28s %-8s %12s %12s %12s  %s\n", i, d.name, d.backend, human((double)d.total_bytes, a, sizeof a),
            human((double)d.used_bytes, b, sizeof b), human((double)d.free_bytes, c, sizeof c), d.uuid);
    if (strcmp(d.backend, "host") == 0)
      fprintf(f, "    (no usable CUDA device: this is gpuguard's simulated host device)\n");
  }
  return 0;
}

static int cmd_info(int argc, char **argv) {
  static const struct option longs[] = {{"json", no_argument, 0, 'j'}, {"prom", no_argument, 0, 'p'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  int format = -1, o;
  while ((o = next_opt(argc, argv, longs)) != -1) {
    if (o == 'h') return usage(stdout, current), 0;
    if (o == 'j' || o == 'p') {
      if (format != -1) return bad_usage("%s", "--json and --prom are exclusive");
      format = o == 'j' ? GG_FORMAT_JSON : GG_FORMAT_PROMETHEUS;
      continue;
    }
    return bad_usage("unknown option '%s'", argv[optind - 1]);
  }
  if (optind < argc) return bad_usage("unexpected argument '%s'", argv[optind]);
  if (format < 0) return print_devices(stdout);
  if (gg_report(stdout, (gg_format_t)format, GG_REPORT_DEVICES) < 0) {
    fprintf(stderr, "gpuguard info: %s\n", gg_last_error());
    return 1;
  }
  return 0;
}

/* ---- ps ---------------------------------------------------------------------------------------- */

/* Every process holding any device, gathered before printing so a failure prints no half table. */
static int gather_processes(gg_process_t **out, size_t *nout, bool *no_gpu) {
  int n = 0;
  *out = NULL, *nout = 0, *no_gpu = false;
  if (gg_device_count(&n) < 0) return fprintf(stderr, "gpuguard: %s\n", gg_last_error()), 1;
  for (int dev = 0; dev < n; dev++) {
    size_t count = 0, cap = 8;
    for (int attempt = 0; attempt < 4; attempt++) {
      gg_process_t *grown = realloc(*out, (*nout + cap) * sizeof **out);
      if (!grown) return fprintf(stderr, "gpuguard: out of memory\n"), 1;
      *out = grown;
      if (gg_process_list(dev, *out + *nout, cap, &count) < 0) {
        if (strstr(gg_last_error(), "no NVIDIA GPU")) return *no_gpu = true, 1;
        fprintf(stderr, "gpuguard: device %d: %s\n", dev, gg_last_error());
        count = 0;
        break;
      }
      if (count <= cap) break;
      cap = count + 8; /* more appeared than there was room for: ask again */
    }
    *nout += count < cap ? count : cap;
  }
  return 0;
}

static int print_processes(FILE *f, bool all_users, bool *no_gpu) {
  gg_process_t *rows;
  size_t n;
  if (gather_processes(&rows, &n, no_gpu) != 0) return free(rows), 1;
  bool tty = isatty(fileno(f));
  fprintf(f, "%-3s %8s %8s %-10s %12s %-5s %-10s %s\n", "GPU", "PID", "PPID", "USER", "GPU-MEMORY", "STATE",
          "CLASS", "COMMAND");
  unsigned shown = 0, orphans = 0, hidden = 0;
  for (size_t i = 0; i < n; i++) {
    const gg_process_t *p = &rows[i];
    if (!all_users && p->cls == GG_PROCESS_FOREIGN) {
      hidden++;
      continue;
    }
    char mem[32] = "?";
    if (p->used_bytes >= 0) human((double)p->used_bytes, mem, sizeof mem);
    bool orphan = p->cls == GG_PROCESS_ORPHAN;
    orphans += orphan;
    fprintf(f, "%s%-3d %8d %8d %-10.10s %12s %-5c %-10s %s%s\n", orphan && tty ? "\033[1;31m" : "", p->device, p->pid,
            p->ppid, p->user, mem, p->state, orphan ? "ORPHAN" : gg_process_class_name(p->cls), p->command,
            orphan && tty ? "\033[0m" : "");
    shown++;
  }
  free(rows);
  fprintf(f, "%u process%s", shown, shown == 1 ? "" : "es");
  if (orphans) fprintf(f, ", %u ORPHAN%s (end them with: gpuguard reap)", orphans, orphans == 1 ? "" : "S");
  if (hidden) fprintf(f, ", %u of other users hidden (--all-users shows them)", hidden);
  fputc('\n', f);
  return 0;
}

static int cmd_ps(int argc, char **argv) {
  static const struct option longs[] = {{"json", no_argument, 0, 'j'}, {"all-users", no_argument, 0, 'a'},
                                        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  bool json = false, all = false;
  int o;
  while ((o = next_opt(argc, argv, longs)) != -1) {
    if (o == 'h') return usage(stdout, current), 0;
    if (o == 'j') json = true;
    else if (o == 'a') all = true;
    else return bad_usage("unknown option '%s'", argv[optind - 1]);
  }
  if (optind < argc) return bad_usage("unexpected argument '%s'", argv[optind]);
  if (json) {
    if (gg_report(stdout, GG_FORMAT_JSON, GG_REPORT_DEVICES | GG_REPORT_PROCESSES) < 0)
      return fprintf(stderr, "gpuguard ps: %s\n", gg_last_error()), 1;
    return 0;
  }
  bool no_gpu = false;
  int rc = print_processes(stdout, all, &no_gpu);
  if (no_gpu)
    fprintf(stderr, "gpuguard ps: no NVIDIA GPU on this machine (neither NVML nor the CUDA driver loads); "
                    "nothing holds GPU memory here\n");
  return rc;
}

/* ---- watch ------------------------------------------------------------------------------------- */

/* Writes the Prometheus report next to path and renames it over path, so a textfile collector never
 * reads half a file. */
static int write_prom_file(const char *path) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
    return fprintf(stderr, "gpuguard watch: --prom-file path too long\n"), 1;
  FILE *f = fopen(tmp, "w");
  if (!f) return fprintf(stderr, "gpuguard watch: cannot write %s: %s\n", tmp, strerror(errno)), 1;
  int rc = gg_report(f, GG_FORMAT_PROMETHEUS, GG_REPORT_ALL);
  if (fclose(f) != 0 && rc == 0) rc = -1;
  if (rc < 0 || rename(tmp, path) != 0) {
    fprintf(stderr, "gpuguard watch: writing %s failed: %s\n", path, rc < 0 ? gg_last_error() : strerror(errno));
    unlink(tmp);
    return 1;
  }
  return 0;
}

static int cmd_watch(int argc, char **argv) {
  static const struct option longs[] = {{"interval", required_argument, 0, 'i'},
                                        {"prom-file", required_argument, 0, 'p'},
                                        {"count", required_argument, 0, 'c'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  double interval = 2.0;
  long count = -1;
  const char *prom = NULL;
  int o;
  while ((o = next_opt(argc, argv, longs)) != -1) {
    char *end = NULL;
    if (o == 'h') return usage(stdout, current), 0;
    if (o == 'i') {
      errno = 0;
      interval = strtod(optarg, &end);
      if (errno || end == optarg || *end || !(interval >= 0.05 && interval <= 86400) || !isfinite(interval))
        return bad_usage("--interval '%s': seconds between 0.05 and 86400 expected", optarg);
    } else if (o == 'c') {
      errno = 0;
      count = strtol(optarg, &end, 10);
      if (errno || end == optarg || *end || count < 1) return bad_usage("--count '%s': a positive integer expected", optarg);
    } else if (o == 'p') {
      if (!*optarg) return bad_usage("%s", "--prom-file needs a path");
      prom = optarg;
    } else {
      return bad_usage("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) return bad_usage("unexpected argument '%s'", argv[optind]);
  bool tty = isatty(STDOUT_FILENO) && !prom;
  for (long i = 0; count < 0 || i < count; i++) {
    if (i) {
      struct timespec ts = {(time_t)interval, (long)((interval - (double)(time_t)interval) * 1e9)};
      while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    }
    if (prom) {
      if (write_prom_file(prom) != 0) return 1;
      continue;
    }
    if (tty) fputs("\033[H\033[2J", stdout); /* refresh in place */
    time_t now = time(NULL);
    char stamp[64];
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", localtime(&now));
    printf("gpuguard watch — %s (every %.2g s)\n", stamp, interval);
    if (print_devices(stdout) != 0) return 1;
    bool no_gpu;
    print_processes(stdout, false, &no_gpu);
    if (no_gpu) puts("(no NVIDIA GPU: no processes to show)");
    fflush(stdout);
  }
  return 0;
}

/* ---- dispatch ---------------------------------------------------------------------------------- */

static const command_t commands[] = {
    {"ps", "[--json] [--all-users]", "Lists the processes holding GPU memory; orphans stand out.", cmd_ps,
     "  --json        devices and processes as JSON\n"
     "  --all-users   include processes of other users (hidden by default)\n"
     "  -h, --help    this help\n"
     "Classes: guarded (in a live gpuguard session), orphan (its session leader or parent is gone),\n"
     "fd-holder (holds /dev/nvidia* but no context), foreign (another user), unknown.\n"},
    {"info", "[--json|--prom]", "Shows the devices and their memory.", cmd_info,
     "  --json        as JSON\n"
     "  --prom        as Prometheus text exposition (format 0.0.4)\n"
     "  -h, --help    this help\n"},
    {"watch", "[--interval S] [--prom-file PATH] [--count N]",
     "Refreshes devices and processes in place; or writes Prometheus text for node_exporter.", cmd_watch,
     "  --interval S      seconds between refreshes (default 2)\n"
     "  --prom-file PATH  write Prometheus text to PATH atomically (node_exporter textfile collector)\n"
     "  --count N         stop after N refreshes\n"
     "  -h, --help        this help\n"},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void main_usage(FILE *f) {
  fprintf(f, "usage: gpuguard COMMAND [OPTIONS]   (gpuguard %s)\n\ncommands:\n", gg_version());
  for (size_t i = 0; i < NCOMMANDS; i++) fprintf(f, "  %-6s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\n'gpuguard COMMAND --help' describes each command.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) return main_usage(stderr), EXIT_USAGE;
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) return main_usage(stdout), 0;
  if (!strcmp(argv[1], "--version")) return printf("gpuguard %s\n", gg_version()), 0;
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (!strcmp(argv[1], commands[i].name)) {
      current = &commands[i];
      return commands[i].run(argc - 1, argv + 1);
    }
  fprintf(stderr, "gpuguard: unknown command '%s'\n", argv[1]);
  main_usage(stderr);
  return EXIT_USAGE;
}
