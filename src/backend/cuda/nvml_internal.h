/* nvml_internal.h — NVML, the CUDA family's telemetry (loaded at run time; the toolkit ships no
 * nvml.h): the table row's telemetry, and the record-size probe the tests check. */
#ifndef GG_NVML_INTERNAL_H
#define GG_NVML_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"

/* gg__cuda_family's telemetry: processes, memory, readings and devices as backend.h states them. */
extern const gg__telemetry_t gg__nvml_telemetry;

/* The process-info struct grew twice without a new symbol (16, 24, then 32 bytes in R535, and back
 * to 24 later). Given a buffer pre-filled with GG__NVML_SENTINEL and the count the driver reported,
 * returns the stride the driver used (16, 24 or 32), or 0 when it cannot tell. */
#define GG__NVML_SENTINEL 0xA5
size_t gg__nvml_stride(const unsigned char *buf, size_t bufsize, unsigned count);
/* Decodes count records of the given stride: pid at 0, memory at 8 (all three layouts agree). */
void gg__nvml_decode(const unsigned char *buf, size_t stride, unsigned count, gg__gpu_proc_t *out);

#endif
