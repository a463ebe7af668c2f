/* query_internal.h — what query.c and gpu.c offer render.c, which names devices as the telemetry
 * does. */
#ifndef GG_QUERY_INTERNAL_H
#define GG_QUERY_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"
#include "gpuguard/query.h"

/* gg_process_list's work for a device named by the telemetry's UUID (NULL: by the telemetry's
 * index `device`); the rows' device field is `device`. The Prometheus report lists the telemetry's
 * devices, whether the driver offers them here or not. */
struct gg_process;
int gg__process_list_at(const char *uuid, int device, struct gg_process *rows, size_t cap,
                        size_t *count);

/* The machine's GPUs as one reading answers every question of a report or of one gg_gpu_* call
 * (gpu.c): the telemetry's devices, each read once, and the driver's properties of each of its
 * devices, asked at first need and kept, so a report of n GPUs asks the driver n times, not n * n.
 * The caller owns it (on its stack) and frees it with gg__gpus_free(): nothing outlives the call,
 * so there is no cache to go stale or for a test to reset. */
typedef struct gg__gpus {
  const gg__family_t *fam; /* the GPU family (gg__gpu_family()) */
  int n;                   /* GPUs of the machine, as gg_gpu_count() numbers them */
  bool by_index;           /* the telemetry answered: it numbers the GPUs (else the driver does) */
  gg__mon_dev_t *devs;     /* the GPUs read, first .. first + ndevs - 1; NULL when none was */
  int first, ndevs;
  int nprops;               /* the driver's device count; -1 until asked */
  gg__dev_props_t *props;   /* per driver device, valid where props_state is 1 */
  signed char *props_state; /* per driver device: 0 not asked, 1 read, -1 unreadable */
} gg__gpus_t;

/* What gg__gpus_load() reads: every GPU, the count alone, or (>= 0) that GPU alone. */
#define GG__GPUS_ALL   (-1)
#define GG__GPUS_COUNT (-2)

/* The telemetry's answer alone: 0; GG_ENOTSUP without telemetry or when it cannot be loaded; its
 * error when it loads but cannot count. Free *s whatever it returns. */
int gg__gpus_telemetry(gg__gpus_t *s, int only);
/* The telemetry's answer, else the driver's count (s->by_index false): 0; GG_ENODEV naming `call`
 * when neither loads; the telemetry's error when it loads but cannot count. Free *s whatever it
 * returns. */
int gg__gpus_load(gg__gpus_t *s, const char *call, int only);
void gg__gpus_free(gg__gpus_t *s);
/* GPU gpu as the telemetry read it; NULL when it was not read. */
const gg__mon_dev_t *gg__gpus_dev(const gg__gpus_t *s, int gpu);
/* A GPU the driver in this process sees too (info->uuid): its backend and what only the driver
 * says. One it does not see (CUDA_VISIBLE_DEVICES, no CUDA here) keeps the telemetry's name. */
void gg__gpus_driver_view(gg__gpus_t *s, gg_device_info_t *info);
/* gg_gpu_info() and gg_gpu_processes() answered from s. */
int gg__gpus_info(gg__gpus_t *s, int gpu, gg_device_info_t *info);
int gg__gpus_processes(const gg__gpus_t *s, int gpu, struct gg_process *rows, size_t cap,
                       size_t *count);
/* A device's public description from its family, properties and memory (query.c): the struct is
 * cleared first and its index set to `device`. */
void gg__fill_info(gg_device_info_t *info, int device, const gg__family_t *f,
                   const gg__dev_props_t *p, size_t free_b, size_t total_b);
/* The telemetry's readings as the public struct gives them (watts, -1 unknown). */
void gg__telemetry_from(gg_device_telemetry_t *t, int index, const gg__readings_t *r);

#endif
