/* main.c — uses the installed library: prints the version and the first device. */
#include <gpuguard/gpuguard.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  gg_device_info_t info;
  if (strcmp(gg_version(), GG_VERSION_STRING) != 0) return 2;
  if (gg_device_info(0, &info) != 0) return fprintf(stderr, "%s\n", gg_last_error()), 1;
  printf("consumer: gpuguard %s, device 0 is '%s' on %s\n", gg_version(), info.name, info.backend);
  return 0;
}
