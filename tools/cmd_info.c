/* cmd_info.c — `gpuguard info`: the devices and their memory, as a table, JSON or Prometheus
 * text. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli_internal.h"

static int print_devices(FILE *f, int only) {
  int n = 0;
  bool gpus = false;
  if (cli_devices(&gpus, &n) < 0) {
    fprintf(stderr, "gpuguard: %s\n", gg_last_error());
    return 1;
  }
  if (only >= n) {
    fprintf(stderr, "gpuguard info: -i %d: no such device (there %s %d)\n", only,
            n == 1 ? "is" : "are", n);
    return EXIT_USAGE;
  }
  char a[32], b[32], c[32];
  fprintf(f, "%-3s %-28s %-8s %12s %12s %12s  %s\n", "GPU", "NAME", "BACKEND", "TOTAL", "USED",
          "FREE", "UUID");
  for (int i = only >= 0 ? only : 0; i < (only >= 0 ? only + 1 : n); i++) {
    gg_device_info_t d;
    if (cli_device_info(gpus, i, &d) < 0) {
      fprintf(f, "%-3d (unreadable: %s)\n", i, gg_last_error());
      continue;
    }
    fprintf(f, "%-3d %-28.28s %-8s %12s %12s %12s  %s\n", i, d.name, d.backend,
            human((double)d.total_bytes, a, sizeof a), human((double)d.used_bytes, b, sizeof b),
            human((double)d.free_bytes, c, sizeof c), d.uuid);
    if (d.simulated)
      fprintf(f, "    (no usable CUDA device: this is gpuguard's simulated host device)\n");
  }
  return 0;
}

int cmd_info(int argc, char **argv) {
  static const struct option longs[] = {{"json", no_argument, 0, 'j'},
                                        {"prom", no_argument, 0, 'p'},
                                        {"id", required_argument, 0, 'i'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  int format = -1, o, only = -1;
  while ((o = next_opt(argc, argv, longs)) != -1) {
    if (o == 'h') {
      usage(stdout, current);
      return 0;
    }
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
  int missing = format >= 0 ? cli_gpu_exists("info", only) : 0;
  if (missing) return missing;
  if (format == GG_FORMAT_PROMETHEUS && cli_no_gpu())
    fputs("gpuguard info: no NVIDIA GPU on this machine (neither CUDA nor NVML): no device series, "
          "never the "
          "simulated host device\n",
          stderr);
  if (format < 0) {
    int rc = print_devices(stdout, only);
    if (rc) return rc;
  } else if (gg_report_ex(stdout, (gg_format_t)format, GG_REPORT_DEVICES, only,
                          GG_REPORT_TOP_DEFAULT) < 0) {
    fprintf(stderr, "gpuguard info: %s\n", gg_last_error());
    return 1;
  }
  /* A device the listing could not read (a bad GPUGUARD_HOST_* value, say) is a failure too. */
  int n = 0, bad = 0;
  gg_device_info_t d;
  bool gpus = false;
  if (cli_devices(&gpus, &n) != 0) n = 0; /* counted once, not once per device */
  for (int i = only >= 0 ? only : 0; i < n && (only < 0 || i == only); i++)
    bad += cli_device_info(gpus, i, &d) < 0;
  return bad ? 1 : 0;
}
