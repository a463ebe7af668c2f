/* fake_nvml.c — a stand-in libnvidia-ml for tests on machines without a GPU: reports the processes
 * named in FAKE_NVML_PROCS ("pid:bytes,pid:na,...") with the record size in FAKE_NVML_STRIDE (16,
 * 24 or 32, the three layouts drivers have used), utilisation, temperature and power from
 * FAKE_NVML_TELEMETRY
 * ("gpu%,mem%,celsius,milliwatts,limit-milliwatts"; absent: not supported), and logs init/shutdown
 * to FAKE_NVML_LOG. FAKE_NVML_COUNT devices (default 1), each named "NVIDIA Fake GPU" with the UUID
 * GPU-fa4e0000-0000-4000-8000-00000000000N and PCI bus id 00000000:0N:00.0 (N = NVML index);
 * FAKE_NVML_MEMORY "total,used" bytes (default 80 GiB, 1 GiB); device N > 0 lists
 * FAKE_NVML_PROCS_N; FAKE_NVML_FAIL_PROCS set makes every process query fail. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static void fake_log(const char *what) {
  const char *path = getenv("FAKE_NVML_LOG");
  FILE *f = path ? fopen(path, "a") : NULL;
  if (f) fprintf(f, "%s\n", what), fclose(f);
}

EXPORT int nvmlInit_v2(void);
EXPORT int nvmlShutdown(void);
EXPORT const char *nvmlErrorString(int r);
EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **dev);
EXPORT int nvmlDeviceGetHandleByUUID(const char *uuid, void **dev);
EXPORT int nvmlDeviceGetMinorNumber(void *dev, unsigned *minor);
EXPORT int nvmlDeviceGetUtilizationRates(void *dev, unsigned *util);
EXPORT int nvmlDeviceGetTemperature(void *dev, int sensor, unsigned *temp);
EXPORT int nvmlDeviceGetPowerUsage(void *dev, unsigned *mw);
EXPORT int nvmlDeviceGetEnforcedPowerLimit(void *dev, unsigned *mw);
EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned *count, void *infos);
EXPORT int nvmlDeviceGetGraphicsRunningProcesses_v3(void *dev, unsigned *count, void *infos);
EXPORT int nvmlDeviceGetCount_v2(unsigned *count);
EXPORT int nvmlDeviceGetName(void *dev, char *name, unsigned len);
EXPORT int nvmlDeviceGetUUID(void *dev, char *uuid, unsigned len);
EXPORT int nvmlDeviceGetMemoryInfo(void *dev, unsigned long long *mem);
EXPORT int nvmlDeviceGetPciInfo_v3(void *dev, unsigned char *pci);

static unsigned fake_count(void) {
  const char *c = getenv("FAKE_NVML_COUNT");
  return c ? (unsigned)atoi(c) : 1;
}
/* Handles are index + 1. */
static unsigned fake_index(const void *dev) {
  return (unsigned)((const char *)dev - (const char *)0) - 1;
}

int nvmlInit_v2(void) {
  if (getenv("FAKE_NVML_FAIL_INIT")) return 9; /* NVML_ERROR_DRIVER_NOT_LOADED */
  fake_log("init");
  return 0;
}
int nvmlShutdown(void) {
  fake_log("shutdown");
  return 0;
}
const char *nvmlErrorString(int r) { return r == 9 ? "Driver Not Loaded" : "fake error"; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **dev) {
  if (i >= fake_count()) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *dev = (char *)0 + i + 1;
  return 0;
}
int nvmlDeviceGetHandleByUUID(const char *uuid, void **dev) {
  unsigned i = 0; /* another UUID (the host backend's) is taken as device 0, as before */
  const char *prefix = "GPU-fa4e0000-0000-4000-8000-";
  if (strncmp(uuid, prefix, strlen(prefix)) == 0)
    i = (unsigned)strtoul(uuid + strlen(prefix), NULL, 16);
  if (i >= fake_count()) return 6; /* NVML_ERROR_NOT_FOUND */
  *dev = (char *)0 + i + 1;
  return 0;
}
int nvmlDeviceGetMinorNumber(void *dev, unsigned *minor) {
  const char *m = getenv("FAKE_NVML_MINOR"); /* a node number no real device of the machine has */
  *minor = (m ? (unsigned)atoi(m) : 0) + fake_index(dev);
  return 0;
}
int nvmlDeviceGetCount_v2(unsigned *count) {
  *count = fake_count();
  return 0;
}
int nvmlDeviceGetName(void *dev, char *name, unsigned len) {
  (void)dev;
  snprintf(name, len, "NVIDIA Fake GPU");
  return 0;
}
int nvmlDeviceGetUUID(void *dev, char *uuid, unsigned len) {
  snprintf(uuid, len, "GPU-fa4e0000-0000-4000-8000-%012x", fake_index(dev));
  return 0;
}
int nvmlDeviceGetMemoryInfo(void *dev, unsigned long long *mem) {
  (void)dev;
  const char *m = getenv("FAKE_NVML_MEMORY");
  unsigned long long total = 80ull << 30, used = 1ull << 30;
  if (m)
    total = strtoull(m, NULL, 10),
    used = strchr(m, ',') ? strtoull(strchr(m, ',') + 1, NULL, 10) : 0;
  mem[0] = total, mem[1] = total - used, mem[2] = used;
  return 0;
}
int nvmlDeviceGetPciInfo_v3(void *dev, unsigned char *pci) {
  memset(pci, 0, 68);
  snprintf((char *)pci + 36, 32, "00000000:%02X:00.0", fake_index(dev) + 1);
  return 0;
}

/* Up to FAKE_MAX processes a device: bench/bench_scrape.py lists 200. */
#define FAKE_MAX 512

static int fake_list(const char *env, unsigned *count, void *infos) {
  const char *spec = getenv(env);
  unsigned pids[FAKE_MAX];
  unsigned long long mem[FAKE_MAX];
  unsigned n = 0;
  for (const char *p = spec ? spec : ""; *p && n < FAKE_MAX;) {
    char *end;
    pids[n] = (unsigned)strtoul(p, &end, 10);
    p = end + (*end == ':');
    if (strncmp(p, "na", 2) == 0)
      mem[n] = ~0ull, p += 2;
    else
      mem[n] = strtoull(p, &end, 10), p = end;
    n++;
    if (*p == ',') p++;
  }
  if (*count < n || !infos) {
    *count = n;
    return n ? 7 : 0; /* NVML_ERROR_INSUFFICIENT_SIZE */
  }
  const char *s = getenv("FAKE_NVML_STRIDE");
  size_t stride = s ? strtoul(s, NULL, 10) : 24;
  unsigned char *b = infos;
  for (unsigned i = 0; i < n; i++) {
    unsigned char *r = b + i * stride;
    unsigned none = ~0u;
    unsigned long long zero = 0;
    memset(r, 0, 8);
    memcpy(r, &pids[i], 4);
    memcpy(r + 8, &mem[i], 8);
    if (stride >= 24) memcpy(r + 16, &none, 4), memcpy(r + 20, &none, 4);
    if (stride >= 32) memcpy(r + 24, &zero, 8);
  }
  *count = n;
  return 0;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned *count, void *infos) {
  if (getenv("FAKE_NVML_FAIL_PROCS")) return 999; /* NVML_ERROR_UNKNOWN: the query itself fails */
  char name[32] = "FAKE_NVML_PROCS";
  if (fake_index(dev) > 0) snprintf(name, sizeof name, "FAKE_NVML_PROCS_%u", fake_index(dev));
  return fake_list(name, count, infos);
}
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *dev, unsigned *count, void *infos) {
  if (fake_index(dev) > 0) return 0 * (int)(*count = 0);
  return fake_list("FAKE_NVML_GRAPHICS", count, infos);
}

/* Field i of FAKE_NVML_TELEMETRY, or 3 (NVML_ERROR_NOT_SUPPORTED) when it is not given. */
static int fake_telemetry(int i, unsigned *out) {
  const char *p = getenv("FAKE_NVML_TELEMETRY");
  for (int k = 0; p && k < i; k++) p = strchr(p, ','), p = p ? p + 1 : NULL;
  if (!p || *p == ',' || !*p) return 3;
  *out = (unsigned)strtoul(p, NULL, 10);
  return 0;
}
int nvmlDeviceGetUtilizationRates(void *dev, unsigned *util) {
  (void)dev;
  int r = fake_telemetry(0, &util[0]);
  return r ? r : fake_telemetry(1, &util[1]);
}
int nvmlDeviceGetTemperature(void *dev, int sensor, unsigned *temp) {
  (void)dev;
  return sensor == 0 ? fake_telemetry(2, temp) : 2;
}
int nvmlDeviceGetPowerUsage(void *dev, unsigned *mw) {
  (void)dev;
  return fake_telemetry(3, mw);
}
int nvmlDeviceGetEnforcedPowerLimit(void *dev, unsigned *mw) {
  (void)dev;
  return fake_telemetry(4, mw);
}
