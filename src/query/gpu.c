/* gpu.c — the machine's GPUs as nvidia-smi numbers them. The GPU family's telemetry (NVML) is the
 * one truth about which GPUs exist, whatever CUDA in this process sees (CUDA_VISIBLE_DEVICES, a
 * container given no CUDA); only without it are the driver's devices all there is. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend/backend.h"
#include "core/internal.h"
#include "query/query_internal.h"

/* The GPUs: the telemetry's devices in *devs (malloc'd, free it), or, without telemetry, *devs NULL
 * and the driver's count in *n. GG_ENODEV when neither loads; the telemetry's error when it loads
 * but cannot list its devices. */
static int gg__gpus(const char *call, const gg__family_t **fam, gg__mon_dev_t **devs, int *n) {
  const gg__family_t *g = gg__gpu_family();
  *fam = g;
  *devs = NULL;
  *n = 0;
  const char *tel = g->telemetry ? g->telemetry->name : "no";
  char why[256] = "";
  gg__err_saved_t saved;
  gg__err_save(&saved);
  if (g->telemetry) {
    int rc = g->telemetry->devices(devs, n);
    if (rc != GG_ENOTSUP) return rc;
    gg__strlcpy(why, gg_last_error(), sizeof why);
  }
  int rc = g->count(n);
  if (rc < 0)
    return gg__err(GG_ENODEV,
                   "%s: no GPU here: neither %s telemetry nor the %s driver is usable (%s)", call,
                   tel, g->name, why[0] ? why : gg_last_error());
  gg__err_restore(&saved);
  return 0;
}

/* GG_ENODEV naming a GPU number that does not exist. */
static int gg__no_gpu(const char *call, const char *id, int n) {
  return gg__err(GG_ENODEV, "%s: GPU %s does not exist (this machine has %d GPU%s)", call, id, n,
                 n == 1 ? "" : "s");
}

static int gg__gpu_range(const char *call, int gpu, int n) {
  if (gpu >= 0 && gpu < n) return 0;
  char id[24];
  snprintf(id, sizeof id, "%d", gpu);
  return gg__no_gpu(call, id, n);
}

/* GPU `gpu` exists: 0 with its family and whether the telemetry numbers it (*by_index; else only
 * the driver does); GG_ENODEV otherwise. */
static int gg__gpu_at(const char *call, int gpu, const gg__family_t **g, bool *by_index) {
  gg__mon_dev_t *devs;
  int n = 0, rc = gg__gpus(call, g, &devs, &n);
  if (rc == 0) rc = gg__gpu_range(call, gpu, n);
  *by_index = devs != NULL;
  free(devs);
  return rc;
}

int gg_gpu_count(int *count) {
  if (!count) return gg__err(GG_EINVAL, "gg_gpu_count: count is NULL");
  const gg__family_t *g;
  gg__mon_dev_t *devs;
  int n = 0, rc = gg__gpus("gg_gpu_count", &g, &devs, &n);
  free(devs);
  if (rc == 0) *count = n;
  return rc;
}

/* Without telemetry: the driver's device, opened for its memory. */
static int gg__gpu_info_driver(const gg__family_t *g, int gpu, gg_device_info_t *info) {
  gg__dev_t *d = NULL;
  int rc = g->open(gpu, &d);
  if (rc < 0) return rc;
  size_t free_b = 0, total_b = 0;
  rc = d->ops->mem_info(d, &free_b, &total_b);
  if (rc == 0) gg__fill_info(info, gpu, g, &d->props, free_b, total_b);
  gg__dev_close(d);
  return rc;
}

void gg__gpu_driver_view(const gg__family_t *g, gg_device_info_t *info) {
  gg__err_saved_t saved;
  gg__err_save(&saved);
  int n = 0;
  if (g->count(&n) != 0) n = 0;
  for (int i = 0; i < n; i++) {
    gg__dev_props_t p;
    if (g->props(i, &p) != 0 || strcasecmp(p.uuid, info->uuid) != 0) continue;
    gg__strlcpy(info->backend, g->name, sizeof info->backend);
    info->cc_major = p.cc_major;
    info->cc_minor = p.cc_minor;
    info->driver_version = p.driver_version;
    info->vmm_supported = p.vmm;
    break;
  }
  gg__err_restore(&saved);
}

int gg_gpu_info(int gpu, gg_device_info_t *info) {
  if (!info) return gg__err(GG_EINVAL, "gg_gpu_info: info is NULL");
  const gg__family_t *g;
  gg__mon_dev_t *devs;
  int n = 0, rc = gg__gpus("gg_gpu_info", &g, &devs, &n);
  if (rc == 0) rc = gg__gpu_range("gg_gpu_info", gpu, n);
  if (rc < 0) {
    free(devs);
    return rc;
  }
  memset(info, 0, sizeof *info);
  info->index = gpu;
  if (!devs) return gg__gpu_info_driver(g, gpu, info);
  const gg__mon_dev_t *m = &devs[gpu];
  if (m->rc < 0) {
    rc = gg__err(GG_EDRIVER, "gg_gpu_info: %s", m->error);
  } else {
    gg__strlcpy(info->backend, g->telemetry->name, sizeof info->backend);
    gg__strlcpy(info->name, m->name, sizeof info->name);
    gg__strlcpy(info->uuid, m->uuid, sizeof info->uuid);
    if (m->have_memory) {
      info->total_bytes = m->total;
      info->free_bytes = m->free_b;
      info->used_bytes = m->total - m->free_b;
    }
    gg__gpu_driver_view(g, info);
  }
  free(devs);
  return rc;
}

int gg_gpu_processes(int gpu, gg_process_t *rows, size_t cap, size_t *count) {
  if (!count) return gg__err(GG_EINVAL, "gg_gpu_processes: count is NULL");
  if (!rows && cap) return gg__err(GG_EINVAL, "gg_gpu_processes: rows is NULL but cap is %zu", cap);
  *count = 0;
  const gg__family_t *g;
  bool by_index = false;
  int rc = gg__gpu_at("gg_gpu_processes", gpu, &g, &by_index);
  if (rc < 0) return rc;
  /* The telemetry's index is the GPU's number; without telemetry the driver names it. */
  gg__dev_props_t props;
  const char *uuid = NULL;
  if (!by_index && g->props(gpu, &props) == 0) uuid = props.uuid;
  return gg__process_list_at(uuid, gpu, rows, cap, count);
}

int gg_gpu_telemetry(int gpu, gg_device_telemetry_t *t) {
  if (!t) return gg__err(GG_EINVAL, "gg_gpu_telemetry: t is NULL");
  *t = (gg_device_telemetry_t){gpu, -1, -1, -1, -1, -1};
  const gg__family_t *g;
  bool by_index = false;
  int rc = gg__gpu_at("gg_gpu_telemetry", gpu, &g, &by_index);
  if (rc < 0) return rc;
  if (!by_index)
    return gg__err(GG_ENOTSUP, "gg_gpu_telemetry: no telemetry (the %s driver has no readings)",
                   g->name);
  gg__readings_t r;
  rc = g->telemetry->readings(NULL, gpu, &r);
  if (rc < 0) return rc;
  gg__telemetry_from(t, gpu, &r);
  return 0;
}

int gg_gpu_find(const char *id, int *gpu) {
  if (!id || !gpu) return gg__err(GG_EINVAL, "gg_gpu_find: %s is NULL", id ? "gpu" : "id");
  const gg__family_t *g;
  gg__mon_dev_t *devs;
  int n = 0, rc = gg__gpus("gg_gpu_find", &g, &devs, &n);
  if (rc < 0) return rc;
  int found = -1;
  if (*id && strspn(id, "0123456789") == strlen(id) && strlen(id) < 10) {
    int v = atoi(id);
    if (v < n) found = v;
  }
  for (int i = 0; found < 0 && i < n; i++) {
    gg__dev_props_t props;
    const char *uuid = devs ? devs[i].uuid : NULL;
    gg__err_saved_t saved;
    gg__err_save(&saved);
    if (!devs && g->props(i, &props) == 0) uuid = props.uuid;
    gg__err_restore(&saved);
    if (uuid && *uuid && strcasecmp(uuid, id) == 0) found = i;
  }
  free(devs);
  if (found < 0) return gg__no_gpu("gg_gpu_find", id, n);
  *gpu = found;
  return 0;
}
