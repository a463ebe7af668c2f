/* nvml.c — the CUDA family's telemetry: who holds a device, its memory and readings, from NVML
 * loaded at run time, with the process-info struct's size probed rather than assumed. No NVML
 * handle outlives a call. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "backend/cuda/nvml_internal.h"

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_INVALID_ARGUMENT = 2
};
#define GG__NVML_NOT_AVAILABLE (~0ull)
#define GG__NVML_MAX_STRIDE    32

typedef struct gg__nvml {
  void *lib;
  nvmlReturn_t (*init)(void);
  nvmlReturn_t (*shutdown)(void);
  const char *(*error_string)(nvmlReturn_t);
  nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t *);
  nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *);
  nvmlReturn_t (*minor)(nvmlDevice_t, unsigned *);
  nvmlReturn_t (*compute)(nvmlDevice_t, unsigned *, void *);
  nvmlReturn_t (*graphics)(nvmlDevice_t, unsigned *, void *);
  nvmlReturn_t (*memory)(nvmlDevice_t, void *);
  /* nvmlUtilization_t: {gpu, memory} percent */
  nvmlReturn_t (*utilization)(nvmlDevice_t, unsigned *);
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned *);
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned *);
  nvmlReturn_t (*power_limit)(nvmlDevice_t, unsigned *);
  nvmlReturn_t (*count)(unsigned *);
  nvmlReturn_t (*name)(nvmlDevice_t, char *, unsigned);
  nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned);
  nvmlReturn_t (*pci)(nvmlDevice_t, void *);
} gg__nvml_t;

/* dlsym gives an object pointer; memcpy is ISO C's way to turn it into a function pointer. */
static void gg__sym(void *lib, const char *name, void *fnp) {
  void *s = dlsym(lib, name);
  memcpy(fnp, &s, sizeof s);
}

/* Newest first: _v3, _v2, then the original, whichever this driver has. */
static void gg__sym_versioned(void *lib, const char *base, void *fnp) {
  static const char *const suffix[] = {"_v3", "_v2", ""};
  char name[96];
  for (size_t i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "%s%s", base, suffix[i]);
    gg__sym(lib, name, fnp);
    void *got;
    memcpy(&got, fnp, sizeof got);
    if (got) return;
  }
}

static int gg__nvml_open(gg__nvml_t *n) {
  memset(n, 0, sizeof *n);
  const char *path = gg__env("GPUGUARD_NVML_LIBRARY");
  n->lib = dlopen(path ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!n->lib) return gg__err(GG_ENOTSUP, "NVML could not be loaded: %s", dlerror());
  gg__sym(n->lib, "nvmlInit_v2", &n->init);
  gg__sym(n->lib, "nvmlShutdown", &n->shutdown);
  gg__sym(n->lib, "nvmlErrorString", &n->error_string);
  gg__sym(n->lib, "nvmlDeviceGetHandleByIndex_v2", &n->by_index);
  gg__sym(n->lib, "nvmlDeviceGetHandleByUUID", &n->by_uuid);
  gg__sym(n->lib, "nvmlDeviceGetMinorNumber", &n->minor);
  gg__sym(n->lib, "nvmlDeviceGetMemoryInfo", &n->memory); /* v1: {total, free, used}, 64-bit each */
  gg__sym(n->lib, "nvmlDeviceGetUtilizationRates", &n->utilization);
  gg__sym(n->lib, "nvmlDeviceGetTemperature", &n->temperature);
  gg__sym(n->lib, "nvmlDeviceGetPowerUsage", &n->power);
  gg__sym(n->lib, "nvmlDeviceGetEnforcedPowerLimit", &n->power_limit);
  gg__sym(n->lib, "nvmlDeviceGetCount_v2", &n->count);
  gg__sym(n->lib, "nvmlDeviceGetName", &n->name);
  gg__sym(n->lib, "nvmlDeviceGetUUID", &n->uuid);
  gg__sym_versioned(n->lib, "nvmlDeviceGetPciInfo", &n->pci);
  gg__sym_versioned(n->lib, "nvmlDeviceGetComputeRunningProcesses", &n->compute);
  gg__sym_versioned(n->lib, "nvmlDeviceGetGraphicsRunningProcesses", &n->graphics);
  if (!n->init || !n->shutdown || !n->by_index || !n->by_uuid || !n->compute) {
    dlclose(n->lib);
    return gg__err(GG_ENOTSUP, "NVML is too old: a needed function is missing");
  }
  nvmlReturn_t r = n->init();
  if (r != NVML_SUCCESS) {
    int rc = gg__err(GG_ENOTSUP, "nvmlInit failed: %s (%d)",
                     n->error_string ? n->error_string(r) : "?", r);
    dlclose(n->lib);
    return rc;
  }
  return 0;
}

static void gg__nvml_close(gg__nvml_t *n) {
  n->shutdown();
  dlclose(n->lib);
}

size_t gg__nvml_stride(const unsigned char *buf, size_t bufsize, unsigned count) {
  if (count == 0) return 0;
  size_t last = bufsize;
  while (last > 0 && buf[last - 1] == GG__NVML_SENTINEL) last--;
  /* The driver writes count whole records: the last written byte ends record count-1. Each layout's
   * last field (computeInstanceId, or a memory size) is never all sentinel bytes in practice. */
  static const size_t strides[] = {32, 24, 16};
  for (size_t i = 0; i < 3; i++)
    if (last == strides[i] * count) return strides[i];
  /* Trailing bytes that happen to equal the sentinel: the smallest layout that covers what was
   * written. */
  for (size_t i = 3; i-- > 0;)
    if (last <= strides[i] * count && last + 8 > strides[i] * count) return strides[i];
  return 0;
}

void gg__nvml_decode(const unsigned char *buf, size_t stride, unsigned count, gg__gpu_proc_t *out) {
  for (unsigned i = 0; i < count; i++) {
    unsigned pid;
    unsigned long long mem;
    memcpy(&pid, buf + (size_t)i * stride, sizeof pid);
    memcpy(&mem, buf + (size_t)i * stride + 8, sizeof mem);
    out[i].pid = pid;
    out[i].used =
        mem == GG__NVML_NOT_AVAILABLE || mem > (unsigned long long)INT64_MAX ? -1 : (long long)mem;
  }
}

/* One of the running-process calls, sized by asking first and probed for its record size. */
static int gg__nvml_list(gg__nvml_t *n, nvmlReturn_t (*fn)(nvmlDevice_t, unsigned *, void *),
                         nvmlDevice_t dev, gg__gpu_proc_t **acc, size_t *nacc) {
  unsigned want = 0;
  nvmlReturn_t r = fn(dev, &want, NULL);
  /* none, or not for this device */
  if (r == NVML_SUCCESS || r == NVML_ERROR_NOT_SUPPORTED) return 0;
  for (int attempt = 0; attempt < 4 && r == NVML_ERROR_INSUFFICIENT_SIZE; attempt++) {
    unsigned cap = want + 8; /* room for processes that start meanwhile */
    size_t bytes = (size_t)cap * GG__NVML_MAX_STRIDE;
    unsigned char *buf = malloc(bytes);
    gg__gpu_proc_t *grown = realloc(*acc, (*nacc + cap) * sizeof **acc);
    if (!buf || !grown) {
      free(buf);
      if (grown) *acc = grown;
      return gg__err(GG_ENOMEM, "process list: out of host memory");
    }
    *acc = grown;
    memset(buf, GG__NVML_SENTINEL, bytes);
    unsigned got = cap;
    r = fn(dev, &got, buf);
    if (r == NVML_SUCCESS) {
      size_t stride = gg__nvml_stride(buf, bytes, got);
      if (got && !stride) {
        free(buf);
        return gg__err(GG_EDRIVER, "NVML returned %u process records of an unknown size", got);
      }
      gg__nvml_decode(buf, stride, got, *acc + *nacc);
      *nacc += got;
      free(buf);
      return 0;
    }
    want = got;
    free(buf);
  }
  return gg__err(GG_EDRIVER, "NVML running-process query failed: %s (%d)",
                 n->error_string ? n->error_string(r) : "?", r);
}

static int gg__nvml_processes(const char *uuid, int index, gg__gpu_proc_t *out, size_t cap,
                              size_t *count, int *minor) {
  gg__nvml_t n;
  int rc = gg__nvml_open(&n);
  if (rc < 0) return rc;
  nvmlDevice_t dev = NULL;
  nvmlReturn_t r = uuid ? n.by_uuid(uuid, &dev) : n.by_index((unsigned)index, &dev);
  gg__gpu_proc_t *acc = NULL;
  size_t nacc = 0;
  if (r != NVML_SUCCESS) {
    rc = gg__err(r == NVML_ERROR_NOT_FOUND || r == NVML_ERROR_INVALID_ARGUMENT ? GG_ENODEV
                                                                               : GG_EDRIVER,
                 "NVML has no device %s%s (%s)", uuid ? uuid : "", uuid ? "" : "at that index",
                 n.error_string ? n.error_string(r) : "?");
  } else {
    unsigned m = 0;
    *minor = (n.minor && n.minor(dev, &m) == NVML_SUCCESS) ? (int)m : -1;
    rc = gg__nvml_list(&n, n.compute, dev, &acc, &nacc);
    if (rc == 0 && n.graphics) rc = gg__nvml_list(&n, n.graphics, dev, &acc, &nacc);
  }
  gg__nvml_close(&n);
  /* A process using both compute and graphics appears twice: keep its first row. */
  size_t w = 0;
  for (size_t i = 0; rc == 0 && i < nacc; i++) {
    bool dup = false;
    for (size_t j = 0; j < i && !dup; j++) dup = acc[j].pid == acc[i].pid;
    if (dup) continue;
    if (w < cap) out[w] = acc[i];
    w++;
  }
  free(acc);
  *count = w;
  return rc;
}

static int gg__nvml_memory(const char *uuid, int index, size_t *total, size_t *free_b) {
  gg__nvml_t n;
  int rc = gg__nvml_open(&n);
  if (rc < 0) return rc;
  nvmlDevice_t dev = NULL;
  unsigned long long m[3] = {0, 0, 0};
  nvmlReturn_t r = uuid ? n.by_uuid(uuid, &dev) : n.by_index((unsigned)index, &dev);
  if (r == NVML_SUCCESS && n.memory) r = n.memory(dev, m);
  if (r != NVML_SUCCESS || !n.memory)
    rc = gg__err(GG_ENOTSUP, "NVML memory query failed: %s",
                 n.error_string ? n.error_string(r) : "?");
  else {
    *total = (size_t)m[0];
    *free_b = (size_t)m[1];
  }
  gg__nvml_close(&n);
  return rc;
}

/* Each reading on its own: a device may support some and not others (NOT_SUPPORTED stays -1). */
static void gg__nvml_read_telemetry(gg__nvml_t *n, nvmlDevice_t dev, gg__readings_t *t) {
  t->util_gpu = t->util_memory = t->temperature_c = -1;
  t->power_mw = t->power_limit_mw = -1;
  unsigned u[2], v;
  if (n->utilization && n->utilization(dev, u) == NVML_SUCCESS) {
    t->util_gpu = (int)u[0];
    t->util_memory = (int)u[1];
  }
  if (n->temperature && n->temperature(dev, 0 /* NVML_TEMPERATURE_GPU */, &v) == NVML_SUCCESS)
    t->temperature_c = (int)v;
  if (n->power && n->power(dev, &v) == NVML_SUCCESS) t->power_mw = (long long)v;
  if (n->power_limit && n->power_limit(dev, &v) == NVML_SUCCESS) t->power_limit_mw = (long long)v;
}

static int gg__nvml_readings(const char *uuid, int index, gg__readings_t *t) {
  t->util_gpu = t->util_memory = t->temperature_c = -1;
  t->power_mw = t->power_limit_mw = -1;
  gg__nvml_t n;
  int rc = gg__nvml_open(&n);
  if (rc < 0) return rc;
  nvmlDevice_t dev = NULL;
  nvmlReturn_t r = uuid ? n.by_uuid(uuid, &dev) : n.by_index((unsigned)index, &dev);
  if (r != NVML_SUCCESS)
    rc = gg__err(GG_ENODEV, "NVML has no such device (%s)",
                 n.error_string ? n.error_string(r) : "?");
  else
    gg__nvml_read_telemetry(&n, dev, t);
  gg__nvml_close(&n);
  return rc;
}

/* nvmlPciInfo_t (v2 and v3 agree on the start): busIdLegacy[16], five unsigned ints, busId[32]. */
#define GG__NVML_PCI_BUSID_OFF 36

/* Device i of an open NVML into *e: its identity, memory and readings, or rc < 0 with the error. */
static void gg__nvml_read_dev(gg__nvml_t *n, unsigned i, gg__mon_dev_t *e) {
  nvmlDevice_t dev = NULL;
  e->index = (int)i;
  e->minor = -1;
  e->have_memory = false;
  e->tel.util_gpu = e->tel.util_memory = e->tel.temperature_c = -1;
  e->tel.power_mw = e->tel.power_limit_mw = -1;
  nvmlReturn_t r = n->by_index(i, &dev);
  if (r != NVML_SUCCESS) {
    e->rc = gg__err(GG_EDRIVER, "NVML device %u: %s (%d)", i,
                    n->error_string ? n->error_string(r) : "?", r);
    gg__strlcpy(e->error, gg_last_error(), sizeof e->error);
    return;
  }
  if (n->name && n->name(dev, e->name, sizeof e->name) != NVML_SUCCESS) e->name[0] = '\0';
  if (n->uuid && n->uuid(dev, e->uuid, sizeof e->uuid) != NVML_SUCCESS) e->uuid[0] = '\0';
  e->name[sizeof e->name - 1] = e->uuid[sizeof e->uuid - 1] = '\0';
  unsigned m = 0;
  if (n->minor && n->minor(dev, &m) == NVML_SUCCESS) e->minor = (int)m;
  unsigned char pci[256];
  memset(pci, 0, sizeof pci);
  if (n->pci && n->pci(dev, pci) == NVML_SUCCESS) {
    memcpy(e->pci_bus_id, pci + GG__NVML_PCI_BUSID_OFF, sizeof e->pci_bus_id - 1);
    e->pci_bus_id[sizeof e->pci_bus_id - 1] = '\0';
  }
  unsigned long long mem[3] = {0, 0, 0};
  if (n->memory && n->memory(dev, mem) == NVML_SUCCESS && mem[1] <= mem[0]) {
    e->have_memory = true;
    e->total = (size_t)mem[0];
    e->free_b = (size_t)mem[1];
  }
  gg__nvml_read_telemetry(n, dev, &e->tel);
}

/* The device count of an open NVML; on failure NVML is closed and the error returned. */
static int gg__nvml_count(gg__nvml_t *n, unsigned *c) {
  *c = 0;
  nvmlReturn_t r = NVML_SUCCESS;
  if (n->count) {
    r = n->count(c);
  } else { /* an NVML without the count call: probe the indices */
    nvmlDevice_t probe;
    while (*c < 64 && n->by_index(*c, &probe) == NVML_SUCCESS) (*c)++;
  }
  if (r == NVML_SUCCESS) return 0;
  int rc = gg__err(GG_EDRIVER, "nvmlDeviceGetCount failed: %s (%d)",
                   n->error_string ? n->error_string(r) : "?", r);
  gg__nvml_close(n);
  return rc;
}

static int gg__nvml_devices(gg__mon_dev_t **out, int *count) {
  *out = NULL;
  *count = 0;
  gg__nvml_t n;
  int rc = gg__nvml_open(&n);
  if (rc < 0) return rc;
  unsigned c = 0;
  rc = gg__nvml_count(&n, &c);
  if (rc < 0) return rc;
  gg__mon_dev_t *d = calloc(c ? c : 1, sizeof *d);
  if (!d) {
    gg__nvml_close(&n);
    return gg__err(GG_ENOMEM, "NVML device list: out of host memory");
  }
  for (unsigned i = 0; i < c; i++) gg__nvml_read_dev(&n, i, &d[i]);
  gg__nvml_close(&n);
  *out = d;
  *count = (int)c;
  return 0;
}

static int gg__nvml_device(int index, gg__mon_dev_t *out, int *count) {
  *count = 0;
  gg__nvml_t n;
  int rc = gg__nvml_open(&n);
  if (rc < 0) return rc;
  unsigned c = 0;
  rc = gg__nvml_count(&n, &c);
  if (rc < 0) return rc;
  if (index >= 0 && (unsigned)index < c) {
    memset(out, 0, sizeof *out);
    gg__nvml_read_dev(&n, (unsigned)index, out);
  }
  gg__nvml_close(&n);
  *count = (int)c;
  return 0;
}

const gg__telemetry_t gg__nvml_telemetry = {
    .name = "nvml",
    .processes = gg__nvml_processes,
    .memory = gg__nvml_memory,
    .readings = gg__nvml_readings,
    .devices = gg__nvml_devices,
    .device = gg__nvml_device,
};
