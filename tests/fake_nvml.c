/* fake_nvml.c — a stand-in libnvidia-ml for tests on machines without a GPU: reports the processes
 * named in FAKE_NVML_PROCS ("pid:bytes,pid:na,...") with the record size in FAKE_NVML_STRIDE (16,
 * 24 or 32, the three layouts drivers have used), utilisation, temperature and power from
 * FAKE_NVML_TELEMETRY ("gpu%,mem%,celsius,milliwatts,limit-milliwatts"; absent: not supported), and
 * logs init/shutdown to FAKE_NVML_LOG. */
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
  if (i != 0) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *dev = (void *)0x1;
  return 0;
}
int nvmlDeviceGetHandleByUUID(const char *uuid, void **dev) {
  (void)uuid;
  *dev = (void *)0x1;
  return 0;
}
int nvmlDeviceGetMinorNumber(void *dev, unsigned *minor) {
  (void)dev;
  const char *m = getenv("FAKE_NVML_MINOR"); /* a node number no real device of the machine has */
  *minor = m ? (unsigned)atoi(m) : 0;
  return 0;
}

static int fake_list(const char *env, unsigned *count, void *infos) {
  const char *spec = getenv(env);
  unsigned pids[64];
  unsigned long long mem[64];
  unsigned n = 0;
  for (const char *p = spec ? spec : ""; *p && n < 64;) {
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
  (void)dev;
  return fake_list("FAKE_NVML_PROCS", count, infos);
}
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *dev, unsigned *count, void *infos) {
  (void)dev;
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
