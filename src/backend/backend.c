/* backend.c — the table of backends (one row each), choosing one (option, then GPUGUARD_BACKEND,
 * then auto) and opening devices. A new device family is one folder and one row here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/internal.h"

/* The rows, each defined in its backend's folder (cuda/cuda_driver.c, host/host.c). */
extern const gg__family_t gg__cuda_family;
extern const gg__family_t gg__host_family;

/* In the order `auto` prefers them; the simulated device last. */
static const gg__family_t *const gg__table[] = {&gg__cuda_family, &gg__host_family, NULL};
#define GG__NFAMILIES (sizeof gg__table / sizeof gg__table[0] - 1)

const gg__family_t *const *gg__families(void) { return gg__table; }

const gg__family_t *gg__family(const char *name) {
  for (size_t i = 0; name && i < GG__NFAMILIES; i++)
    if (strcmp(gg__table[i]->name, name) == 0) return gg__table[i];
  return NULL;
}

/* Whether family f's driver has device `device`; its reason, when it has not, is no error here. */
static bool gg__family_has(const gg__family_t *f, int device) {
  int n = 0;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  bool has = f->count(&n) == 0 && device >= 0 && device < n;
  gg__err_restore(&saved);
  return has;
}

const gg__family_t *gg__gpu_family(void) {
  const gg__family_t *first = NULL;
  size_t real = 0;
  for (size_t i = 0; i < GG__NFAMILIES; i++) {
    const gg__family_t *f = gg__table[i];
    if (f->simulated) continue;
    if (!first) first = f;
    real++;
    if (gg__family_has(f, 0)) return f;
  }
  /* No driver answers. With one real family its telemetry is asked anyway: no need to load it
   * twice. */
  for (size_t i = 0; real > 1 && i < GG__NFAMILIES; i++) {
    const gg__family_t *f = gg__table[i];
    if (f->simulated || !f->telemetry) continue;
    gg__mon_dev_t one;
    int n = 0;
    gg__err_saved_t saved;
    gg__err_save(&saved);
    bool loads = f->telemetry->device(-1, &one, &n) == 0; /* the count alone: no device is read */
    gg__err_restore(&saved);
    if (loads) return f;
  }
  return first;
}

/* "auto, cuda or host": the names a backend option may take. */
static void gg__names(char *buf, size_t n) {
  size_t at = (size_t)snprintf(buf, n, "auto");
  for (size_t i = 0; i < GG__NFAMILIES && at < n; i++)
    at += (size_t)snprintf(buf + at, n - at, "%s%s", i + 1 == GG__NFAMILIES ? " or " : ", ",
                           gg__table[i]->name);
}

int gg__backend_resolve(const char *requested, int device, const char **chosen) {
  const char *what = "options.backend", *v = requested;
  if (!v || !*v) {
    what = "GPUGUARD_BACKEND";
    v = gg__env("GPUGUARD_BACKEND");
  }
  if (!v) v = "auto";
  const gg__family_t *f = gg__family(v);
  if (f) {
    *chosen = f->name;
    return 0;
  }
  if (strcmp(v, "auto") != 0) {
    char names[128];
    gg__names(names, sizeof names);
    return gg__err(GG_EINVAL, "%s='%s': expected %s", what, v, names);
  }
  /* auto: the first real family whose driver loads and has this device; else the simulated one. */
  const gg__family_t *sim = NULL;
  for (size_t i = 0; i < GG__NFAMILIES; i++) {
    f = gg__table[i];
    if (f->simulated && !sim) sim = f;
    if (!f->simulated && gg__family_has(f, device)) {
      *chosen = f->name;
      return 0;
    }
  }
  *chosen = sim ? sim->name : gg__table[0]->name;
  return 0;
}

int gg__dev_open(const char *name, int index, gg__dev_t **dev) {
  const char *b;
  int rc = gg__backend_resolve(name, index, &b);
  if (rc < 0) return rc;
  return gg__family(b)->open(index, dev);
}

void gg__dev_close(gg__dev_t *dev) {
  if (dev) dev->ops->close(dev);
}

int gg__dev_count(const char *name, int *count) {
  const char *b;
  int rc = gg__backend_resolve(name, 0, &b);
  if (rc < 0) return rc;
  return gg__family(b)->count(count);
}
