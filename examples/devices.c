/* devices.c — lists the devices gpuguard sees and their memory, on whichever backend is selected. */
#include <stdio.h>

#include "gpuguard/gpuguard.h"

int main(void) {
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
