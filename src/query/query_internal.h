/* query_internal.h — what query.c and gpu.c offer render.c, which names devices as the telemetry
 * does. */
#ifndef GG_QUERY_INTERNAL_H
#define GG_QUERY_INTERNAL_H

#include <stddef.h>

#include "backend/backend.h"
#include "gpuguard/query.h"

/* gg_process_list's work for a device named by the telemetry's UUID (NULL: by the telemetry's
 * index `device`); the rows' device field is `device`. The Prometheus report lists the telemetry's
 * devices, whether the driver offers them here or not. */
struct gg_process;
int gg__process_list_at(const char *uuid, int device, struct gg_process *rows, size_t cap,
                        size_t *count);

/* A GPU the driver in this process sees too (info->uuid): its backend and what only the driver says
 * (gpu.c). One it does not see (CUDA_VISIBLE_DEVICES, no CUDA here) keeps the telemetry's name. */
void gg__gpu_driver_view(const gg__family_t *g, gg_device_info_t *info);
/* A device's public description from its family, properties and memory (query.c): the struct is
 * cleared first and its index set to `device`. */
void gg__fill_info(gg_device_info_t *info, int device, const gg__family_t *f,
                   const gg__dev_props_t *p, size_t free_b, size_t total_b);
/* The telemetry's readings as the public struct gives them (watts, -1 unknown). */
void gg__telemetry_from(gg_device_telemetry_t *t, int index, const gg__readings_t *r);

#endif
