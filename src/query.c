/* query.c — device count and device information (name, UUID, memory) through the backend. */
#include <string.h>

#include "backend/backend.h"
#include "internal.h"

int gg_device_count(int *count) {
  if (!count) return gg__err(GG_EINVAL, "gg_device_count: count is NULL");
  return gg__dev_count(NULL, count);
}

int gg_device_info(int device, gg_device_info_t *info) {
  if (!info) return gg__err(GG_EINVAL, "gg_device_info: info is NULL");
  gg__dev_t *d = NULL;
  int rc = gg__dev_open(NULL, device, &d);
  if (rc < 0) return rc;
  size_t free_b = 0, total_b = 0;
  rc = d->ops->mem_info(d, &free_b, &total_b);
  if (rc == 0) {
    memset(info, 0, sizeof *info);
    info->index = device;
    gg__strlcpy(info->backend, d->ops->name, sizeof info->backend);
    gg__strlcpy(info->name, d->props.name, sizeof info->name);
    gg__strlcpy(info->uuid, d->props.uuid, sizeof info->uuid);
    info->total_bytes = total_b;
    info->free_bytes = free_b;
    info->used_bytes = total_b - free_b;
    info->cc_major = d->props.cc_major;
    info->cc_minor = d->props.cc_minor;
    info->driver_version = d->props.driver_version;
    info->vmm_supported = d->props.vmm;
  }
  gg__dev_close(d);
  return rc;
}
