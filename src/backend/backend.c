/* backend.c — choosing a backend (option, then GPUGUARD_BACKEND, then auto) and opening devices. */
#include <string.h>

#include "backend/backend.h"
#include "core/internal.h"

int gg__backend_resolve(const char *requested, int device, const char **chosen) {
  const char *what = "options.backend", *v = requested;
  if (!v || !*v) {
    what = "GPUGUARD_BACKEND";
    v = gg__env("GPUGUARD_BACKEND");
  }
  if (!v) v = "auto";
  if (strcmp(v, "cuda") == 0 || strcmp(v, "host") == 0) {
    *chosen = v[0] == 'c' ? "cuda" : "host";
    return 0;
  }
  if (strcmp(v, "auto") != 0)
    return gg__err(GG_EINVAL, "%s='%s': expected auto, cuda or host", what, v);
  /* auto: cuda when the driver loads and has this device; the probe's message is not an error here.
   * */
  int n = 0;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  bool cuda = gg__cuda_count(&n) == 0 && device >= 0 && device < n;
  gg__err_restore(&saved);
  *chosen = cuda ? "cuda" : "host";
  return 0;
}

int gg__dev_open(const char *name, int index, gg__dev_t **dev) {
  const char *b;
  int rc = gg__backend_resolve(name, index, &b);
  if (rc < 0) return rc;
  return b[0] == 'c' ? gg__cuda_open(index, dev) : gg__host_open(index, dev);
}

void gg__dev_close(gg__dev_t *dev) {
  if (dev) dev->ops->close(dev);
}

int gg__dev_count(const char *name, int *count) {
  const char *b;
  int rc = gg__backend_resolve(name, 0, &b);
  if (rc < 0) return rc;
  if (b[0] == 'h') {
    *count = 1;
    return 0;
  }
  return gg__cuda_count(count);
}
