/* cmd_check.c — `gpuguard check`: exits 0 when the GPUs hold nothing beyond the allowance, 1 when a
 * stranded or orphaned process or memory no listed process holds is found (prologs, probes, CI). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_internal.h"

/* BYTES with an optional K/M/G/T suffix (powers of 1024). */
static bool parse_bytes(const char *text, long long *out) {
  char *end = NULL;
  errno = 0;
  if (!(*text >= '0' && *text <= '9')) return false;
  unsigned long long v = strtoull(text, &end, 10);
  int shift = 0;
  const char *units = "KMGT", *u = *end ? strchr(units, *end & ~0x20) : NULL;
  if (u && end[1] == '\0') {
    shift = 10 * (int)(u - units + 1);
    end++;
  }
  if (errno || *end || v > (unsigned long long)INT64_MAX >> shift) return false;
  *out = (long long)(v << shift);
  return true;
}

/* A whole number from 1 to max written as digits only (no sign, space or unit); false otherwise. */
static bool parse_positive(const char *text, long max, long *out) {
  if (!*text || strspn(text, "0123456789") != strlen(text)) return false;
  errno = 0;
  long v = strtol(text, NULL, 10);
  if (errno || v < 1 || v > max) return false;
  *out = v;
  return true;
}

typedef struct check_opts {
  bool json;
  long long allow;    /* bytes no listed process holds that are tolerated per GPU */
  int device;         /* -i: only this GPU; -1: every one */
  double interval_ms; /* --interval: between checks; 0: one check */
  long count;         /* --count: checks at most (with --interval); 0: until something is found */
} check_opts_t;

/* The options. Returns -1 to go on, else the exit status. */
static int check_parse(int argc, char **argv, check_opts_t *c) {
  static const struct option longs[] = {{"json", no_argument, 0, 'j'},
                                        {"allow", required_argument, 0, 'a'},
                                        {"id", required_argument, 0, 'i'},
                                        {"interval", required_argument, 0, 'I'},
                                        {"count", required_argument, 0, 'c'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  *c = (check_opts_t){.allow = 1LL << 30, .device = -1};
  int o;
  while ((o = next_opt(argc, argv, longs)) != -1) {
    if (o == 'h') {
      usage(stdout, current);
      return 0;
    }
    if (o == 'j') {
      c->json = true;
    } else if (o == 'a') {
      if (!parse_bytes(optarg, &c->allow))
        return bad_usage("--allow '%s': bytes expected (e.g. 0, 512M, 2G)", optarg);
    } else if (o == 'i') {
      if (!cli_device_arg(optarg, &c->device)) return EXIT_USAGE;
    } else if (o == 'I') {
      /* As watch's: 500ms, 10s, 1m, or a bare number of seconds; at most a day. */
      if (!cli_duration("--interval", optarg, 1000, 50, 86400e3, &c->interval_ms))
        return EXIT_USAGE;
    } else if (o == 'c') {
      if (!parse_positive(optarg, LONG_MAX, &c->count))
        return bad_usage("--count '%s': a positive whole number expected", optarg);
    } else {
      return cli_opt_error(o, argv);
    }
  }
  if (optind < argc) return bad_usage("unexpected argument '%s'", argv[optind]);
  if (c->count && !c->interval_ms)
    return bad_usage("%s", "--count goes with --interval (without it, one check is made)");
  return -1;
}

/* One stranded or orphaned process: a line, or a JSON object after `problems` others. */
static void check_process(FILE *f, const gg_process_t *p, bool json, unsigned problems) {
  char mem[32] = "? bytes", cmd[sizeof p->command * 4], why[sizeof p->why * 4],
       user[sizeof p->user * 4];
  if (json) {
    fprintf(f,
            "%s{\"kind\":\"%s\",\"device\":%d,\"pid\":%d,\"uid\":%u,\"start_time\":%llu,\"used_"
            "bytes\":",
            problems ? "," : "", gg_process_class_name(p->cls), p->device, p->pid, p->uid,
            p->start_time);
    if (p->used_bytes < 0)
      fputs("null", f);
    else
      fprintf(f, "%lld", p->used_bytes);
    fputs(",\"command\":", f);
    gg_json_write_string(f, p->command);
    fputs(",\"why\":", f);
    gg_json_write_string(f, p->why);
    fputc('}', f);
  } else {
    if (p->used_bytes >= 0) human((double)p->used_bytes, mem, sizeof mem);
    cli_safe_text(p->command, cmd, sizeof cmd);
    cli_safe_text(p->why, why, sizeof why);
    cli_safe_text(p->user, user, sizeof user);
    fprintf(f, "GPU %d: %s process %d (user %s) holds %s: %s (%s)\n", p->device,
            gg_process_class_name(p->cls), p->pid, user, mem, cmd, why);
  }
}

/* Memory the driver counts as used that no listed process holds: a dead process the driver has not
 * cleaned up, another container's, or the driver's own reserve (which --allow is for). Returns the
 * number of devices with more of it than allowed, each said after `problems` others. */
static unsigned check_unaccounted(FILE *f, const check_opts_t *c, const gg_process_t *rows,
                                  size_t n, unsigned problems) {
  int ndev = 0; /* every GPU NVML reports; its own used memory */
  if (gg_gpu_count(&ndev) != 0) ndev = 0;
  unsigned found = 0;
  for (int d = 0; d < ndev; d++) {
    if (c->device >= 0 && d != c->device) continue;
    gg_device_info_t info;
    if (gg_gpu_info(d, &info) != 0) continue;
    long long listed = 0;
    for (size_t i = 0; i < n; i++)
      if (rows[i].device == d && rows[i].used_bytes > 0) listed += rows[i].used_bytes;
    long long loose = (long long)info.used_bytes - listed;
    if (loose <= c->allow) continue;
    char a[32], b[32];
    if (c->json)
      fprintf(
          f, "%s{\"kind\":\"unaccounted\",\"device\":%d,\"used_bytes\":%lld,\"listed_bytes\":%lld}",
          problems + found ? "," : "", d, (long long)info.used_bytes, listed);
    else
      fprintf(f, "GPU %d: %s in use that no listed process holds (allowed: %s)\n", d,
              human((double)loose, a, sizeof a), human((double)c->allow, b, sizeof b));
    found++;
  }
  return found;
}

/* One check: its lines (or JSON object) on stdout. Returns 0 ok, 1 something is held (or the
 * processes could not be read), EXIT_NO_GPU without a GPU. */
static int check_once(const check_opts_t *c) {
  gg_process_t *rows;
  size_t n;
  bool no_gpu = false;
  int bad = cli_gpu_exists("check", c->device);
  if (bad) return bad;
  if (cli_gather_processes(&rows, &n, &no_gpu, stderr, -1) != 0) {
    free(rows);
    if (!no_gpu) { /* fail closed: what cannot be read is not "ok" */
      fputs("gpuguard check: the GPUs' processes could not be read: not ok\n", stderr);
      if (c->json) puts("{\"ok\":false,\"unreadable\":true,\"problems\":[]}");
      return 1;
    }
    fprintf(
        stderr,
        "gpuguard check: no NVIDIA GPU on this machine (neither NVML nor the CUDA driver loads)\n");
    if (c->json) puts("{\"ok\":false,\"no_gpu\":true,\"problems\":[]}");
    return EXIT_NO_GPU;
  }
  if (!cli_registry_usable("check")) {
    free(rows);
    if (c->json) puts("{\"ok\":false,\"registry\":false,\"problems\":[]}");
    return 1;
  }
  FILE *f = stdout;
  unsigned problems = 0;
  if (c->json) fprintf(f, "{\"allow_bytes\":%lld,\"problems\":[", c->allow);
  for (size_t i = 0; i < n; i++) {
    if (!cli_reapable(&rows[i])) continue;
    if (c->device >= 0 && rows[i].device != c->device) continue;
    check_process(f, &rows[i], c->json, problems);
    problems++;
  }
  problems += check_unaccounted(f, c, rows, n, problems);
  free(rows);
  if (c->json)
    fprintf(f, "],\"ok\":%s}\n", problems ? "false" : "true");
  else if (!problems)
    fputs("ok: no stranded or orphaned processes, nothing held beyond the allowance\n", f);
  return problems ? 1 : 0;
}

/* Waits until until_ms (gg__now_ms()) for one of the signals in set: the signal, or 0 when the time
 * is up. */
static int check_wait(const sigset_t *set, double until_ms) {
  for (;;) {
    double left = until_ms - gg__now_ms();
    if (left <= 0) return 0;
    struct timespec ts = {(time_t)(left / 1e3), (long)(fmod(left, 1e3) * 1e6)};
    int sig = sigtimedwait(set, NULL, &ts);
    if (sig > 0) return sig;
    if (errno != EINTR) return 0; /* EAGAIN: the time is up */
  }
}

/* --interval: a check every interval, each round's lines flushed as it ends (a pipe reader sees
 * them at once). The first round that finds something ends it with its status; otherwise --count
 * rounds, or SIGINT/SIGTERM, end it with the last round's status. The two signals are blocked
 * before the first round (the threads a backend starts inherit that) and taken only between rounds,
 * so a round is never cut short: one that comes during a round ends the run after it. */
static int check_repeat(const check_opts_t *c) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigprocmask(SIG_BLOCK, &set, NULL);
  double next = gg__now_ms();
  int rc = 0;
  for (long round = 1;; round++) {
    rc = check_once(c);
    fflush(stdout);
    if (rc != 0 || (c->count && round >= c->count)) break;
    /* Every interval from the first round's start; a round longer than the interval starts the
     * next at once, without catching up on the ones missed. */
    next += c->interval_ms;
    if (next < gg__now_ms()) next = gg__now_ms();
    if (check_wait(&set, next) != 0) break;
  }
  return rc;
}

int cmd_check(int argc, char **argv) {
  check_opts_t c;
  int rc = check_parse(argc, argv, &c);
  if (rc >= 0) return rc;
  return c.interval_ms > 0 ? check_repeat(&c) : check_once(&c);
}
