/* cuda_driver.c — the CUDA driver loaded at run time (dlopen + cuGetProcAddress, resolved for the
 * CUDA 12.0 ABI), the outcome kept for every later caller, CUresult codes mapped to GG_E* codes,
 * the device count and properties, and the CUDA family's row of the backend table. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_driver_internal.h"
#include "backend/cuda/nvml_internal.h"
#include "core/internal.h"

gg__cu_table_t gg__cu;

/* Loading happens once per process; the outcome (and its message) is kept so every later caller
 * gets the same clear answer. */
static pthread_once_t gg__cu_once = PTHREAD_ONCE_INIT;
static int gg__cu_status;        /* 0 or a GG_E* code */
static char gg__cu_reason[512];  /* why the driver is unusable */
static unsigned gg__cu_init_gen; /* fork generation in which cuInit ran */

typedef CUresult(CUDAAPI *gg__getproc2_t)(const char *, void **, int, cuuint64_t,
                                          CUdriverProcAddressQueryResult *);
typedef CUresult(CUDAAPI *gg__getproc1_t)(const char *, void **, int, cuuint64_t);

static const char *gg__cu_errname(CUresult r) {
  const char *s = NULL;
  if (gg__cu.fn_cuGetErrorName && gg__cu.fn_cuGetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
  return "CUDA_ERROR_UNKNOWN";
}

static const char *gg__cu_errtext(CUresult r) {
  const char *s = NULL;
  if (gg__cu.fn_cuGetErrorString && gg__cu.fn_cuGetErrorString(r, &s) == CUDA_SUCCESS && s)
    return s;
  return "unknown error";
}

static int gg__cu_code(CUresult r) {
  switch (r) {
  case CUDA_ERROR_OUT_OF_MEMORY: return GG_ENOMEM;
  case CUDA_ERROR_NO_DEVICE:
  case CUDA_ERROR_INVALID_DEVICE:
  case CUDA_ERROR_DEVICE_UNAVAILABLE: return GG_ENODEV;
  case CUDA_ERROR_NOT_SUPPORTED: return GG_ENOTSUP;
  case CUDA_ERROR_INVALID_VALUE: return GG_EINVAL;
  default: return GG_EDRIVER;
  }
}

/* Records a failed driver call with its CUresult name and text. */
int gg__cu_fail(CUresult r, const char *call) {
  return gg__err_driver(gg__cu_code(r), (int)r, "%s failed: %s (%s)", call, gg__cu_errname(r),
                        gg__cu_errtext(r));
}

static void gg__cu_load(void) {
  gg__cu_status = GG_ENODEV;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(gg__cu_reason, sizeof gg__cu_reason,
             "the CUDA driver (libcuda.so.1) could not be loaded: %s", dlerror());
    return;
  }
  /* dlsym returns an object pointer; memcpy is the conversion ISO C allows. */
  gg__getproc2_t gp2 = NULL;
  gg__getproc1_t gp1 = NULL;
  void *sym = dlsym(lib, "cuGetProcAddress_v2");
  if (sym) {
    memcpy(&gp2, &sym, sizeof sym);
  } else {
    sym = dlsym(lib, "cuGetProcAddress");
    if (sym) memcpy(&gp1, &sym, sizeof sym);
  }
  if (!gp2 && !gp1) {
    snprintf(gg__cu_reason, sizeof gg__cu_reason,
             "the CUDA driver is too old: libcuda.so.1 has no cuGetProcAddress (CUDA 11.3 or newer "
             "needed)");
    return;
  }
#define GG__CU_RESOLVE(name, args)                                                            \
  {                                                                                           \
    void *fp = NULL;                                                                          \
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;                          \
    CUresult r = gp2 ? gp2(#name, &fp, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st)               \
                     : gp1(#name, &fp, 12000, CU_GET_PROC_ADDRESS_DEFAULT);                   \
    if (r != CUDA_SUCCESS || !fp) {                                                           \
      snprintf(gg__cu_reason, sizeof gg__cu_reason,                                           \
               "the CUDA driver lacks %s (CUresult %d): a CUDA 12 driver or newer is needed", \
               #name, (int)r);                                                                \
      return;                                                                                 \
    }                                                                                         \
    memcpy(&gg__cu.fn_##name, &fp, sizeof fp);                                                \
  }
  GG__CU_FUNCS(GG__CU_RESOLVE)
#undef GG__CU_RESOLVE
  CUresult r = gg__cu.fn_cuInit(0);
  if (r != CUDA_SUCCESS) {
    snprintf(gg__cu_reason, sizeof gg__cu_reason,
             "the CUDA driver loaded but cuInit failed: %s (%s)%s", gg__cu_errname(r),
             gg__cu_errtext(r),
             r == CUDA_ERROR_NO_DEVICE ? ": this machine has no CUDA device" : "");
    return;
  }
  gg__cu_init_gen = gg__fork_generation();
  gg__cu_status = 0;
}

int gg__cu_ready(const char *call) {
  pthread_once(&gg__cu_once, gg__cu_load);
  if (gg__cu_status < 0) return gg__err(gg__cu_status, "%s: %s", call, gg__cu_reason);
  if (gg__fork_generation() != gg__cu_init_gen)
    return gg__err(
        GG_ESTATE,
        "%s: CUDA was initialised in the parent before fork(); a forked child cannot use "
        "CUDA: exec a new process (or use the multiprocessing 'spawn' start method)",
        call);
  return 0;
}

int gg__cuda_count(int *count) {
  int rc = gg__cu_ready("cuda backend");
  if (rc < 0) return rc;
  GG__CU(gg__cu.fn_cuDeviceGetCount(count), "cuDeviceGetCount");
  return 0;
}

int gg__cuda_probe(void) {
  int n = 0, rc = gg__cuda_count(&n);
  if (rc < 0) return rc;
  return n > 0 ? 0 : gg__err(GG_ENODEV, "cuda backend: the driver reports no CUDA device");
}

int gg__cu_device(int index, CUdevice *dev) {
  int n = 0, rc = gg__cuda_count(&n);
  if (rc < 0) return rc;
  if (index < 0 || index >= n)
    return gg__err(GG_ENODEV, "cuda backend: device %d does not exist (%d CUDA device%s)", index, n,
                   n == 1 ? "" : "s");
  GG__CU(gg__cu.fn_cuDeviceGet(dev, index), "cuDeviceGet");
  return 0;
}

int gg__cuda_props(int index, gg__dev_props_t *p) {
  CUdevice dev;
  int rc = gg__cu_device(index, &dev);
  if (rc < 0) return rc;
  memset(p, 0, sizeof *p);
  CUuuid u;
  int vmm = 0;
  GG__CU(gg__cu.fn_cuDeviceGetName(p->name, (int)sizeof p->name, dev), "cuDeviceGetName");
  GG__CU(gg__cu.fn_cuDeviceGetUuid(&u, dev), "cuDeviceGetUuid");
  GG__CU(gg__cu.fn_cuDeviceTotalMem(&p->total_mem, dev), "cuDeviceTotalMem");
  GG__CU(gg__cu.fn_cuDeviceGetAttribute(&p->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                        dev),
         "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)");
  GG__CU(gg__cu.fn_cuDeviceGetAttribute(&p->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                        dev),
         "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)");
  GG__CU(gg__cu.fn_cuDeviceGetAttribute(
             &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
         "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
  GG__CU(gg__cu.fn_cuDriverGetVersion(&p->driver_version), "cuDriverGetVersion");
  p->vmm = vmm != 0;
  const unsigned char *b = (const unsigned char *)u.bytes;
  snprintf(p->uuid, sizeof p->uuid,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
           b[15]);
  return 0;
}

/* /dev/nvidia<minor>: the GPUs (nvidiactl, nvidia-uvm and the rest share the prefix). */
static void gg__cuda_device_node(int minor, int index, char *buf, size_t n) {
  snprintf(buf, n, "/dev/nvidia%d", minor >= 0 ? minor : index);
}

static const char *const gg__cuda_device_files[] = {"/dev/nvidia", NULL};

const gg__family_t gg__cuda_family = {
    .name = "cuda",
    .simulated = false,
    .probe = gg__cuda_probe,
    .open = gg__cuda_open,
    .count = gg__cuda_count,
    .props = gg__cuda_props,
    .telemetry = &gg__nvml_telemetry,
    .device_files = gg__cuda_device_files,
    .device_node = gg__cuda_device_node,
};
