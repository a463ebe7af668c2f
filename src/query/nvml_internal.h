/* nvml_internal.h — the few NVML calls gpuguard makes (NVML loaded at run time; the toolkit ships
 * no nvml.h). */
#ifndef GG_NVML_INTERNAL_H
#define GG_NVML_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

typedef struct gg__gpu_proc {
  unsigned pid;
  long long used; /* bytes; -1 when the driver does not say */
} gg__gpu_proc_t;

/* Lists the compute and graphics processes on one device, found by uuid (as CUDA names it) or, when
 * uuid is NULL, by NVML index. Opens NVML for the call and shuts it down after. *minor receives the
 * device's /dev/nvidia<minor> number (-1 when unknown). GG_ENOTSUP when NVML cannot be loaded (the
 * caller falls back to scanning descriptors), GG_ENODEV for an unknown device, GG_EDRIVER
 * otherwise. */
int gg__nvml_processes(const char *uuid, int index, gg__gpu_proc_t *out, size_t cap, size_t *n,
                       int *minor);

/* The device's memory as NVML sees it, without creating a CUDA context (which would itself take
 * ~500 MiB of the memory being measured, and ~100 ms). GG_ENOTSUP without NVML. */
int gg__nvml_memory(const char *uuid, int index, size_t *total, size_t *free_b);

/* Utilisation, temperature and power as NVML reports them; each field -1 when the device does not
 * say. GG_ENOTSUP without NVML, GG_ENODEV when NVML does not know the device. */
typedef struct gg__nvml_telemetry {
  int util_gpu, util_memory, temperature_c; /* percent, percent, degrees Celsius */
  long long power_mw, power_limit_mw;       /* milliwatts */
} gg__nvml_telemetry_t;
int gg__nvml_telemetry(const char *uuid, int index, gg__nvml_telemetry_t *t);

/* One device as NVML numbers it (its index is what nvidia-smi and DCGM call `gpu`, whatever
 * CUDA_VISIBLE_DEVICES says). rc < 0 (with error) when NVML could not open it. */
typedef struct gg__nvml_dev {
  int index, rc, minor; /* minor: /dev/nvidia<minor>, -1 unknown */
  char name[96], uuid[96], pci_bus_id[32];
  bool have_memory;
  size_t total, free_b;
  gg__nvml_telemetry_t tel;
  char error[256];
} gg__nvml_dev_t;
/* Every device NVML sees, in NVML's order (one NVML session for all). *out is malloc'ed (free it).
 * GG_ENOTSUP when NVML cannot be loaded, GG_EDRIVER when it cannot count its devices. */
int gg__nvml_devices(gg__nvml_dev_t **out, int *count);

/* The process-info struct grew twice without a new symbol (16, 24, then 32 bytes in R535, and back
 * to 24 later). Given a buffer pre-filled with GG__NVML_SENTINEL and the count the driver reported,
 * returns the stride the driver used (16, 24 or 32), or 0 when it cannot tell. */
#define GG__NVML_SENTINEL 0xA5
size_t gg__nvml_stride(const unsigned char *buf, size_t bufsize, unsigned count);
/* Decodes count records of the given stride: pid at 0, memory at 8 (all three layouts agree). */
void gg__nvml_decode(const unsigned char *buf, size_t stride, unsigned count, gg__gpu_proc_t *out);

/* gg_process_list's work for a device named by NVML UUID (NULL: by NVML index `device`); the rows'
 * device field is `device`. The Prometheus report lists NVML's devices, CUDA or not. */
struct gg_process;
int gg__process_list_at(const char *uuid, int device, struct gg_process *rows, size_t cap,
                        size_t *count);

#endif
