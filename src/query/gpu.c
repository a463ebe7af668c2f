/* gpu.c — the machine's GPUs as nvidia-smi numbers them. The GPU family's telemetry (NVML) is the
 * one truth about which GPUs exist, whatever CUDA in this process sees (CUDA_VISIBLE_DEVICES, a
 * container given no CUDA); only without it are the driver's devices all there is. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend/backend.h"
#include "core/internal.h"
#include "query/query_internal.h"

int gg__gpus_telemetry(gg__gpus_t *s, int only) {
  memset(s, 0, sizeof *s);
  s->fam = gg__gpu_family();
  s->nprops = -1;
  const gg__telemetry_t *tel = s->fam->telemetry;
  if (!tel) return gg__err(GG_ENOTSUP, "the %s backend has no telemetry", s->fam->name);
  if (only == GG__GPUS_ALL) {
    int rc = tel->devices(&s->devs, &s->n);
    s->ndevs = s->devs ? s->n : 0;
    return rc;
  }
  gg__mon_dev_t one;
  int rc = tel->device(only, &one, &s->n);
  if (rc < 0 || only < 0 || only >= s->n) return rc;
  s->devs = malloc(sizeof *s->devs);
  if (!s->devs) return gg__err(GG_ENOMEM, "NVML device: out of host memory");
  *s->devs = one;
  s->first = only;
  s->ndevs = 1;
  return 0;
}

/* GG_ENODEV when neither the telemetry nor the driver loads; the telemetry's error when it loads
 * but cannot list its devices. */
int gg__gpus_load(gg__gpus_t *s, const char *call, int only) {
  char why[256] = "";
  gg__err_saved_t saved;
  gg__err_save(&saved);
  int rc = gg__gpus_telemetry(s, only);
  s->by_index = rc == 0;
  if (rc != GG_ENOTSUP) return rc;
  const char *tel = s->fam->telemetry ? s->fam->telemetry->name : "no";
  if (s->fam->telemetry) gg__strlcpy(why, gg_last_error(), sizeof why);
  s->n = 0;
  rc = s->fam->count(&s->n);
  if (rc < 0)
    return gg__err(GG_ENODEV,
                   "%s: no GPU here: neither %s telemetry nor the %s driver is usable (%s)", call,
                   tel, s->fam->name, why[0] ? why : gg_last_error());
  gg__err_restore(&saved);
  return 0;
}

void gg__gpus_free(gg__gpus_t *s) {
  free(s->devs);
  free(s->props);
  free(s->props_state);
  s->devs = NULL;
  s->props = NULL;
  s->props_state = NULL;
}

const gg__mon_dev_t *gg__gpus_dev(const gg__gpus_t *s, int gpu) {
  if (!s->devs || gpu < s->first || gpu >= s->first + s->ndevs) return NULL;
  return &s->devs[gpu - s->first];
}

/* The driver's device i (0 .. s->nprops - 1), asked of the driver once per snapshot; NULL when it
 * cannot say (the reason is no error here). tmp holds it when there is no room to keep it. */
static const gg__dev_props_t *gg__gpus_props(gg__gpus_t *s, int i, gg__dev_props_t *tmp) {
  if (s->props_state && s->props_state[i]) return s->props_state[i] > 0 ? &s->props[i] : NULL;
  gg__dev_props_t *p = s->props_state ? &s->props[i] : tmp;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  bool ok = s->fam->props(i, p) == 0;
  gg__err_restore(&saved);
  if (s->props_state) s->props_state[i] = ok ? 1 : -1;
  return ok ? p : NULL;
}

/* How many devices the driver has, asked once per snapshot (0 when it cannot say). */
static int gg__gpus_nprops(gg__gpus_t *s) {
  if (s->nprops >= 0) return s->nprops;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  int n = 0;
  if (s->fam->count(&n) != 0) n = 0;
  gg__err_restore(&saved);
  s->nprops = n;
  s->props = n ? calloc((size_t)n, sizeof *s->props) : NULL;
  s->props_state = s->props ? calloc((size_t)n, 1) : NULL;
  if (!s->props_state) { /* no room to keep them: each is asked for when needed */
    free(s->props);
    s->props = NULL;
  }
  return n;
}

/* The driver device whose UUID is uuid: the one numbered `hint` first (the driver and the telemetry
 * number them alike unless CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER says otherwise), then the
 * others in order; NULL when none is. */
static const gg__dev_props_t *gg__gpus_by_uuid(gg__gpus_t *s, const char *uuid, int hint,
                                               gg__dev_props_t *tmp) {
  int n = gg__gpus_nprops(s);
  for (int k = -1; k < n; k++) {
    int i = k < 0 ? hint : k;
    if (i < 0 || i >= n || (k >= 0 && i == hint)) continue;
    const gg__dev_props_t *p = gg__gpus_props(s, i, tmp);
    if (p && strcasecmp(p->uuid, uuid) == 0) return p;
  }
  return NULL;
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

int gg_gpu_count(int *count) {
  if (!count) return gg__err(GG_EINVAL, "gg_gpu_count: count is NULL");
  gg__gpus_t s;
  int rc = gg__gpus_load(&s, "gg_gpu_count", GG__GPUS_COUNT);
  gg__gpus_free(&s);
  if (rc == 0) *count = s.n;
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

void gg__gpus_driver_view(gg__gpus_t *s, gg_device_info_t *info) {
  gg__dev_props_t tmp;
  const gg__dev_props_t *p = gg__gpus_by_uuid(s, info->uuid, info->index, &tmp);
  if (!p) return;
  gg__strlcpy(info->backend, s->fam->name, sizeof info->backend);
  info->cc_major = p->cc_major;
  info->cc_minor = p->cc_minor;
  info->driver_version = p->driver_version;
  info->vmm_supported = p->vmm;
}

int gg__gpus_info(gg__gpus_t *s, int gpu, gg_device_info_t *info) {
  int rc = gg__gpu_range("gg_gpu_info", gpu, s->n);
  if (rc < 0) return rc;
  memset(info, 0, sizeof *info);
  info->index = gpu;
  if (!s->by_index) return gg__gpu_info_driver(s->fam, gpu, info);
  const gg__mon_dev_t *m = gg__gpus_dev(s, gpu);
  if (!m) return gg__err(GG_EDRIVER, "gg_gpu_info: GPU %d was not read", gpu);
  if (m->rc < 0) return gg__err(GG_EDRIVER, "gg_gpu_info: %s", m->error);
  gg__strlcpy(info->backend, s->fam->telemetry->name, sizeof info->backend);
  gg__strlcpy(info->name, m->name, sizeof info->name);
  gg__strlcpy(info->uuid, m->uuid, sizeof info->uuid);
  if (m->have_memory) {
    info->total_bytes = m->total;
    info->free_bytes = m->free_b;
    info->used_bytes = m->total - m->free_b;
  }
  gg__gpus_driver_view(s, info);
  return 0;
}

int gg_gpu_info(int gpu, gg_device_info_t *info) {
  if (!info) return gg__err(GG_EINVAL, "gg_gpu_info: info is NULL");
  gg__gpus_t s;
  /* Only this GPU is read: a table of n GPUs asks n questions, not n passes over every GPU. */
  int rc = gg__gpus_load(&s, "gg_gpu_info", gpu >= 0 ? gpu : GG__GPUS_COUNT);
  if (rc == 0) rc = gg__gpus_info(&s, gpu, info);
  gg__gpus_free(&s);
  return rc;
}

int gg__gpus_processes(const gg__gpus_t *s, int gpu, gg_process_t *rows, size_t cap,
                       size_t *count) {
  *count = 0;
  int rc = gg__gpu_range("gg_gpu_processes", gpu, s->n);
  if (rc < 0) return rc;
  /* The telemetry's index is the GPU's number; without telemetry the driver names it. */
  gg__dev_props_t props;
  const char *uuid = NULL;
  if (!s->by_index && s->fam->props(gpu, &props) == 0) uuid = props.uuid;
  return gg__process_list_at(uuid, gpu, rows, cap, count);
}

int gg_gpu_processes(int gpu, gg_process_t *rows, size_t cap, size_t *count) {
  if (!count) return gg__err(GG_EINVAL, "gg_gpu_processes: count is NULL");
  if (!rows && cap) return gg__err(GG_EINVAL, "gg_gpu_processes: rows is NULL but cap is %zu", cap);
  *count = 0;
  gg__gpus_t s;
  /* The count alone: the process list is a question of its own. */
  int rc = gg__gpus_load(&s, "gg_gpu_processes", GG__GPUS_COUNT);
  if (rc == 0) rc = gg__gpus_processes(&s, gpu, rows, cap, count);
  gg__gpus_free(&s);
  return rc;
}

int gg_gpu_telemetry(int gpu, gg_device_telemetry_t *t) {
  if (!t) return gg__err(GG_EINVAL, "gg_gpu_telemetry: t is NULL");
  *t = (gg_device_telemetry_t){gpu, -1, -1, -1, -1, -1};
  gg__gpus_t s;
  int rc = gg__gpus_load(&s, "gg_gpu_telemetry", gpu >= 0 ? gpu : GG__GPUS_COUNT);
  if (rc == 0) rc = gg__gpu_range("gg_gpu_telemetry", gpu, s.n);
  if (rc == 0 && !s.by_index)
    rc = gg__err(GG_ENOTSUP, "gg_gpu_telemetry: no telemetry (the %s driver has no readings)",
                 s.fam->name);
  const gg__mon_dev_t *m = rc == 0 ? gg__gpus_dev(&s, gpu) : NULL;
  gg__readings_t r = {-1, -1, -1, -1, -1};
  if (m && m->rc == 0) /* read with the GPU: no second session */
    r = m->tel;
  else if (rc == 0) /* the device did not open: its readings say why, as they always did */
    rc = s.fam->telemetry->readings(NULL, gpu, &r);
  gg__gpus_free(&s);
  if (rc < 0) return rc;
  gg__telemetry_from(t, gpu, &r);
  return 0;
}

int gg_gpu_find(const char *id, int *gpu) {
  if (!id || !gpu) return gg__err(GG_EINVAL, "gg_gpu_find: %s is NULL", id ? "gpu" : "id");
  gg__gpus_t s;
  int rc = gg__gpus_load(&s, "gg_gpu_find", GG__GPUS_ALL);
  if (rc < 0) {
    gg__gpus_free(&s);
    return rc;
  }
  int n = s.n, found = -1;
  if (*id && strspn(id, "0123456789") == strlen(id) && strlen(id) < 10) {
    int v = atoi(id);
    if (v < n) found = v;
  }
  for (int i = 0; found < 0 && i < n; i++) {
    gg__dev_props_t tmp;
    const gg__mon_dev_t *m = gg__gpus_dev(&s, i);
    const gg__dev_props_t *p = m ? NULL : gg__gpus_props(&s, i, &tmp);
    const char *uuid = m ? m->uuid : p ? p->uuid : NULL;
    if (uuid && *uuid && strcasecmp(uuid, id) == 0) found = i;
  }
  gg__gpus_free(&s);
  if (found < 0) return gg__no_gpu("gg_gpu_find", id, n);
  *gpu = found;
  return 0;
}
