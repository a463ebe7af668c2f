/* devices.c — lists the devices gpuguard sees and their memory, on whichever backend is selected. */
#include <stdio.h>
#include <string.h>

#include "gpuguard/gpuguard.h"

int main(int argc, char **argv) {
  if (argc > 1) { /* no options: --help says so, anything else is refused */
    int help = strcmp(argv[1], "--help") == 0;
    fprintf(help ? stdout : stderr, "%susage: devices   (no arguments; GPUGUARD_BACKEND picks the backend)\n",
            help ? "" : "devices: unknown argument\n");
    return help ? 0 : 2;
  }
  int n = 0;
  if (gg_device_count(&n) < 0) {
    fprintf(stderr, "devices: %s\n", gg_last_error());
    return 1;
  }
  printf("gpuguard %s: %d device%s\n", gg_version(), n, n == 1 ? "" : "s");
  for (int i = 0; i < n; i++) {
    gg_device_info_t d;
    if (gg_device_info(i, &d) < 0) {
      fprintf(stderr, "devices: device %d: %s\n", i, gg_last_error());
      return 1;
    }
    printf("  [%d] %s (%s backend) %s\n      memory: %.1f GiB total, %.1f GiB free; compute %d.%d; "
           "driver %d; virtual memory management: %s\n",
           d.index, d.name, d.backend, d.uuid, d.total_bytes / 1073741824.0, d.free_bytes / 1073741824.0,
           d.cc_major, d.cc_minor, d.driver_version, d.vmm_supported ? "yes" : "no");
  }
  return 0;
}
