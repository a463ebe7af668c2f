/* gpuguard/query.h — what the devices are and how much memory they have free. */
#ifndef GPUGUARD_QUERY_H
#define GPUGUARD_QUERY_H

#include <stddef.h>

#include "gpuguard/export.h"

/** @defgroup gg_query Query
 *  Devices and their memory, as the driver reports them. The backend is chosen as everywhere else:
 *  GPUGUARD_BACKEND=auto|cuda|host (auto: CUDA when a usable device exists, else the host backend).
 *  @{ */

/** One device, as gg_device_info() reports it. */
typedef struct gg_device_info {
  int index;                /**< the device ordinal, as CUDA numbers it */
  char backend[8];          /**< "cuda" or "host" */
  char name[256];           /**< e.g. "NVIDIA H200" */
  char uuid[48];            /**< "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it */
  size_t total_bytes;       /**< device memory size */
  size_t free_bytes;        /**< free device memory, as the driver reports it now */
  size_t used_bytes;        /**< total_bytes - free_bytes */
  int cc_major;             /**< compute capability, major (0 on the host backend) */
  int cc_minor;             /**< compute capability, minor */
  int driver_version;       /**< CUDA driver version, e.g. 13000 (0 on the host backend) */
  int vmm_supported;        /**< 1 when the device supports virtual memory management */
} gg_device_info_t;

GG_BEGIN_DECLS

/** Number of devices on the selected backend (the host backend has one).
 *  @param[out] count receives the number.
 *  @return 0; GG_EINVAL for NULL or a bad GPUGUARD_BACKEND; GG_ENODEV when GPUGUARD_BACKEND=cuda and
 *  the driver cannot be loaded. Thread-safe. */
GG_API int gg_device_count(int *count);

/** Describes one device, including its free memory now. Reading free memory needs the device's
 *  primary context, which this call retains and releases (it does not create one that stays).
 *  @param device the ordinal, 0 .. gg_device_count()-1.
 *  @param[out] info filled on success.
 *  @return 0; GG_EINVAL for NULL; GG_ENODEV for a device that does not exist or no driver;
 *  GG_EDRIVER when the driver fails (gg_last_error() names the call). Thread-safe. */
GG_API int gg_device_info(int device, gg_device_info_t *info);

GG_END_DECLS

/** @} */
#endif
