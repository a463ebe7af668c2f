/* cmd_reap.c — `gpuguard reap`: ends this user's stranded workers and the orphans of dead sessions,
 * or the processes named with --pid, each checked by its start time right before the first
 * signal. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_internal.h"

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
  if (!digits) {
    snprintf(why, cap, "--pid '%s': not a process id (a decimal number)", safe);
    return false;
  }
  errno = 0;
  long long v = strtoll(text, NULL, 10);
  if (neg || v < 0) {
    snprintf(why, cap, "--pid '%s': negative (a negative pid names a process group)", safe);
    return false;
  }
  if (v == 0) {
    snprintf(why, cap, "--pid 0: names the caller's process group, not a process");
    return false;
  }
  if (errno || v > max) {
    snprintf(why, cap, "--pid '%s': out of range (pids go up to %ld here)", safe, max);
    return false;
  }
  *out = (int)v;
  return true;
}

/* Why a named process is not ours to end, or NULL. */
static const char *refuse_named(const gg_process_t *row, bool all_users) {
  if (row->pid == 1) return "pid 1 (init) is never ended";
  if (row->pid == (int)getpid()) return "that is this gpuguard process";
  gg_process_t up;
  for (int p = (int)getppid(), depth = 0; p > 1 && depth < 128; depth++) {
    if (p == row->pid)
      return "an ancestor of this gpuguard process (ending it would end its own shell)";
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
  /* escape sequences in argv must not reach the terminal */
  cli_safe_text(p->user, user, sizeof user);
  cli_safe_text(p->command, cmd, sizeof cmd);
  cli_safe_text(p->why[0] ? p->why : "no evidence either way", why, sizeof why);
  printf("%s %d (user %s, GPU memory %s, start %llu): %s\n    why: %s\n",
         gg_process_class_name(p->cls), p->pid, user, mem, p->start_time, cmd, why);
}

typedef struct reap_opts {
  bool dry, yes, all;
  long grace;
  int device; /* -i: only what holds this GPU (nvidia-smi's number); -1 every one */
  int *pids;
  size_t npids;
} reap_opts_t;

/* reap's arguments, in any order; every value after --pid up to the next option is a pid. */
static int reap_parse(int argc, char **argv, reap_opts_t *o) {
  bool in_pids = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    char why[160];
    bool number =
        a[0] != '-' || (a[1] >= '0' && a[1] <= '9'); /* "-5" is a (bad) pid, not an option */
    if (in_pids && number) {
      int pid;
      if (!parse_pid(a, &pid, why, sizeof why)) return bad_usage("%s", why);
      o->pids[o->npids++] = pid;
      continue;
    }
    in_pids = false;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout, current);
      return 0;
    }
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
    } else if (!strcmp(a, "-i") || !strcmp(a, "--id") || !strncmp(a, "--id=", 5)) {
      const char *v = a[4] == '=' ? a + 5 : i + 1 < argc ? argv[++i] : NULL;
      if (!v) return bad_usage("%s", "-i needs a GPU number or UUID");
      if (!cli_device_arg(v, &o->device)) return EXIT_USAGE;
    } else if (!strcmp(a, "--grace") || !strncmp(a, "--grace=", 8)) {
      const char *v = a[7] == '=' ? a + 8 : i + 1 < argc ? argv[++i] : NULL;
      if (!v) return bad_usage("%s", "--grace needs a value");
      if (!cli_grace(v, &o->grace)) return EXIT_USAGE;
    } else if (a[0] == '-') {
      return bad_usage("unknown option '%s'", a);
    } else {
      return bad_usage("unexpected argument '%s' (pids go after --pid)", a);
    }
  }
  if (o->dry && o->yes) return bad_usage("%s", "--dry-run and --yes are exclusive");
  if (o->device >= 0 && o->npids)
    return bad_usage("%s", "-i selects what is listed; --pid names the processes instead");
  int missing = cli_gpu_exists("reap", o->device);
  if (missing) return missing;
  if (o->all && geteuid() != 0)
    return bad_usage("%s", "--all-users: only root may end other users' processes");
  return -1;
}

/* The processes --pid names, with the checks a listed one gets; the refused ones are said and left
 * out (*refused set). NULL without memory. */
static gg_process_t *reap_named(const reap_opts_t *o, size_t *n, bool *refused) {
  gg_process_t *rows = calloc(o->npids, sizeof *rows);
  for (size_t i = 0; rows && i < o->npids; i++) {
    gg_process_t row;
    const char *no = NULL;
    bool dup = false;
    for (size_t j = 0; j < *n; j++) dup = dup || rows[j].pid == o->pids[i];
    if (dup) continue;
    if (o->pids[i] == 1)
      no = "pid 1 (init) is never ended";
    else if (gg_process_describe(o->pids[i], &row) != 0)
      no = "no such process";
    else
      no = refuse_named(&row, o->all);
    if (no) {
      printf("refused %d: %s; nothing was sent to it\n", o->pids[i], no);
      *refused = true;
      continue;
    }
    rows[(*n)++] = row;
  }
  return rows;
}

/* This user's stranded workers and orphans (every user's with --all-users) into *rows, grown to
 * fit. 0 (*rows NULL without memory), or 1 after a message. */
static int reap_listed(const reap_opts_t *o, gg_process_t **rows, size_t *n) {
  size_t count = 0, cap = 64;
  if (!cli_registry_usable("reap")) return 1;
  for (int attempt = 0; attempt < 4; attempt++) {
    gg_process_t *grown = realloc(*rows, cap * sizeof **rows);
    if (!grown) break;
    *rows = grown;
    if (gg_reap_list(o->all ? GG_REAP_ALL_USERS : 0, *rows, cap, &count) != 0) {
      fprintf(stderr, "gpuguard reap: %s\n", gg_last_error());
      return 1;
    }
    if (count <= cap) break;
    cap = count + 16;
  }
  *n = count < cap ? count : cap;
  size_t kept = 0; /* -i: what holds that GPU (an orphan holding none is no GPU's) */
  for (size_t i = 0; *rows && i < *n; i++)
    if (o->device < 0 || (*rows)[i].device == o->device) (*rows)[kept++] = (*rows)[i];
  *n = kept;
  return 0;
}

/* Lists the candidates, then asks (on a terminal, without --yes). Returns -1 to end them, else the
 * exit status: --dry-run, no terminal to ask on, or the answer was not yes. */
static int reap_confirm(const reap_opts_t *o, const gg_process_t *rows, size_t n, bool refused) {
  for (size_t i = 0; i < n; i++) print_candidate(&rows[i]);
  const char *what = n == 1 ? "process" : "processes";
  if (o->dry) {
    printf("%zu %s; --dry-run: nothing was done\n", n, what);
    return refused;
  }
  if (o->yes) return -1;
  if (!isatty(STDIN_FILENO)) {
    printf("%zu %s; run with --yes to end them\n", n, what);
    return refused;
  }
  printf("end %s? [y/N] ", n == 1 ? "it" : "them");
  fflush(stdout);
  int c = getchar();
  if (c != 'y' && c != 'Y') {
    puts("nothing was done");
    return refused;
  }
  return -1;
}

/* Ends the candidates (each checked by its start time first) and says what was sent to each and how
 * it ended. Returns the exit status. */
static int reap_end(const reap_opts_t *o, const gg_process_t *rows, size_t n, bool refused) {
  int *pids = calloc(n, sizeof *pids);
  unsigned long long *starts = calloc(n, sizeof *starts);
  gg_proc_outcome_t *out = calloc(n, sizeof *out);
  if (!pids || !starts || !out) {
    fprintf(stderr, "gpuguard reap: out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    pids[i] = rows[i].pid;
    starts[i] = rows[i].start_time;
  }
  int rc = gg_reap(pids, starts, n, (int)o->grace, o->all ? GG_REAP_ALL_USERS : 0, out);
  size_t ended = 0, skipped = 0, alive = 0;
  for (size_t i = 0; i < n; i++) {
    const gg_proc_outcome_t *p = &out[i];
    if (p->end == GG_PROC_SKIPPED || (p->end == GG_PROC_ENDED && !p->sent)) {
      printf("skipped %d: %s; nothing was sent to it\n", (int)p->pid, p->found);
      skipped++;
      continue;
    }
    bool up = p->end == GG_PROC_ALIVE;
    alive += up;
    ended += !up;
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
  free(pids);
  free(starts);
  free(out);
  return rc == 0 && !refused ? 0 : 1;
}

int cmd_reap(int argc, char **argv) {
  reap_opts_t o = {.grace = 2000, .device = -1};
  o.pids = calloc((size_t)argc, sizeof *o.pids);
  if (!o.pids) {
    fprintf(stderr, "gpuguard reap: out of memory\n");
    return 1;
  }
  int rc = reap_parse(argc, argv, &o);
  if (rc >= 0) {
    free(o.pids);
    return rc;
  }

  gg_process_t *rows = NULL;
  size_t n = 0;
  bool refused = false;
  if (o.npids) { /* named: any class, with the same checks */
    rows = reap_named(&o, &n, &refused);
  } else if (reap_listed(&o, &rows, &n) != 0) {
    free(rows);
    free(o.pids);
    return 1;
  }
  free(o.pids);
  if (!rows) {
    fprintf(stderr, "gpuguard reap: out of memory\n");
    return 1;
  }
  if (n == 0) {
    free(rows);
    if (refused) return 1;
    /* records of dead sessions with nothing left are not sessions any more */
    gg_registry_prune(NULL);
    puts("gpuguard reap: no stranded workers and no orphans of dead sessions");
    return 0;
  }
  rc = reap_confirm(&o, rows, n, refused);
  if (rc < 0) rc = reap_end(&o, rows, n, refused);
  free(rows);
  return rc;
}
