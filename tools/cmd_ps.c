/* cmd_ps.c — `gpuguard ps`: who holds GPU memory, each process with its class; stranded ones stand
 * out. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli_internal.h"

static const char *class_label(const gg_process_t *p) {
  if (p->cls == GG_PROCESS_ORPHAN) return "ORPHAN";
  if (p->cls == GG_PROCESS_STRANDED) return "STRANDED";
  return gg_process_class_name(p->cls);
}

static int print_processes(FILE *f, bool all_users, bool why, bool *no_gpu, int only, int color) {
  gg_process_t *rows;
  size_t n;
  if (cli_gather_processes(&rows, &n, no_gpu, stderr, only) != 0) {
    free(rows);
    return 1;
  }
  bool tty = cli_color_on(color, fileno(f));
  unsigned me = (unsigned)getuid();
  fprintf(f, "%-3s %8s %8s %-10s %12s %-5s %-10s %s\n", "GPU", "PID", "PPID", "USER", "GPU-MEMORY",
          "STATE", "CLASS", "COMMAND");
  unsigned shown = 0, stranded = 0, orphans = 0, theirs = 0, detached = 0, hidden = 0;
  for (size_t i = 0; i < n; i++) {
    const gg_process_t *p = &rows[i];
    if (only >= 0 && p->device != only) continue;
    if (!all_users && p->uid != me && p->state != '?') {
      hidden++;
      continue;
    }
    char mem[32] = "?", user[sizeof p->user * 4], cmd[sizeof p->command * 4],
         text[sizeof p->why * 4];
    if (p->used_bytes >= 0) human((double)p->used_bytes, mem, sizeof mem);
    /* another user's command line is not ours to print raw */
    cli_safe_text(p->user, user, sizeof user);
    cli_safe_text(p->command, cmd, sizeof cmd);
    bool red = cli_reapable(p);
    if (red && p->uid != me)
      theirs++;
    else if (red) {
      stranded += p->cls == GG_PROCESS_STRANDED;
      orphans += p->cls == GG_PROCESS_ORPHAN;
    }
    detached += p->cls == GG_PROCESS_DETACHED;
    fprintf(f, "%s%-3d %8d %8d %-10.10s %12s %-5c %-10s %s%s\n", red && tty ? "\033[1;31m" : "",
            p->device, p->pid, p->ppid, user, mem,
            p->state >= 0x21 && p->state < 0x7f ? p->state : '?', class_label(p), cmd,
            red && tty ? "\033[0m" : "");
    if (why) {
      cli_safe_text(p->why[0] ? p->why : "no evidence either way", text, sizeof text);
      fprintf(f, "    why: %s\n", text);
    }
    shown++;
  }
  free(rows);
  /* The footer names the command that ends what it counts, and counts only what that command
   * ends. */
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
  if (detached)
    fprintf(f, ", %u detached (left alone: end one with gpuguard reap --pid PID)", detached);
  if (hidden) fprintf(f, ", %u of other users hidden (--all-users shows them)", hidden);
  fputc('\n', f);
  return 0;
}

static const char no_gpu_text[] =
    "gpuguard ps: no NVIDIA GPU on this machine (neither NVML nor the CUDA driver "
    "loads); nothing holds GPU memory here\n";

int cmd_ps(int argc, char **argv) {
  static const struct option longs[] = {{"json", no_argument, 0, 'j'},
                                        {"all-users", no_argument, 0, 'a'},
                                        {"why", no_argument, 0, 'w'},
                                        {"id", required_argument, 0, 'i'},
                                        {"color", required_argument, 0, 'C'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  bool json = false, all = false, why = false;
  int o, only = -1, color = 2;
  while ((o = next_opt(argc, argv, longs)) != -1) {
    if (o == 'h') {
      usage(stdout, current);
      return 0;
    }
    if (o == 'i') {
      if (!cli_device_arg(optarg, &only)) return EXIT_USAGE;
    } else if (o == 'C') {
      color = cli_color_mode(optarg);
      if (color < 0) return EXIT_USAGE;
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
  int bad = cli_gpu_exists("ps", only);
  if (bad) return bad;
  bool no_gpu = false;
  int rc;
  if (json) {
    gg_process_t *rows = NULL;
    size_t n = 0;
    /* Fail closed as the table does: a GPU whose processes cannot be read is not listed as free. */
    bool unreadable = cli_gather_processes(&rows, &n, &no_gpu, stderr, only) != 0 && !no_gpu;
    free(rows);
    if (unreadable) return 1;
    /* No GPU: no devices and no processes, as the exit status says; never the simulated host
     * device, which no process can hold (the exporter leaves it out too). */
    if (no_gpu)
      rc = printf("{\"version\":\"%s\",\"devices\":[],\"processes\":[]}\n", gg_version()) < 0;
    else
      rc = gg_report_ex(stdout, GG_FORMAT_JSON,
                        GG_REPORT_DEVICES | GG_REPORT_PROCESSES | GG_REPORT_NOT_SELF |
                            (all ? GG_REPORT_ALL_COMMANDS : 0),
                        only, GG_REPORT_TOP_DEFAULT) < 0;
    if (rc) fprintf(stderr, "gpuguard ps: %s\n", gg_last_error());
  } else {
    rc = print_processes(stdout, all, why, &no_gpu, only, color);
  }
  if (no_gpu) fputs(no_gpu_text, stderr);
  return no_gpu ? EXIT_NO_GPU : rc ? 1 : 0;
}
