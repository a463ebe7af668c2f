/* gpuguard/report.h — devices, GPU processes and this process's arenas as JSON or Prometheus
 * text. */
#ifndef GPUGUARD_REPORT_H
#define GPUGUARD_REPORT_H

#include <stdio.h>

#include "gpuguard/export.h"

/** @defgroup gg_report Reports
 *  The query results rendered for machines: JSON (one object), or the Prometheus text exposition
 *  format 0.0.4 with metric names `gpuguard_*` carrying their unit (`_bytes`, `_total` on
 *  counters), every device series labelled as NVIDIA's DCGM exporter labels them (`gpu` is NVML's
 *  index, whatever CUDA_VISIBLE_DEVICES says; `UUID`, `pci_bus_id`, `device`, `modelName`,
 *  `Hostname`), e.g. `gpuguard_device_memory_used_bytes{gpu="0",UUID="GPU-...",...}`. Prometheus
 *  text lists the GPUs NVML sees (also without CUDA), else CUDA's; never the simulated host device:
 *  `gpuguard_devices` says how many and from where, `gpuguard_scrape_collector_success` whether
 *  each reading worked, `gpuguard_build_info` the version. Process command lines are on
 *  `gpuguard_process_info`, apart from the memory series. Families without a sample are left out.
 *  Label values are valid UTF-8: control characters and bytes that are not well-formed UTF-8 become
 *  U+FFFD.
 *  @{ */

/** Report devices: name, UUID, memory total/free/used. */
#define GG_REPORT_DEVICES 0x1u
/** Report the processes holding each device, with their class (an `orphan` label in Prometheus). */
#define GG_REPORT_PROCESSES 0x2u
/** Report this process's live arenas and their statistics. */
#define GG_REPORT_ARENAS 0x4u
/** Everything above. */
#define GG_REPORT_ALL 0x7u
/** A modifier: leave the calling process out of the process list (a monitoring tool's own device
 *  descriptors are not worth a row). */
#define GG_REPORT_NOT_SELF 0x8u
/** A modifier: other users' command lines too. Without it they are left out of the JSON report
 *  (`"command": ""`) whatever the process's class, as `gpuguard ps` hides them: flags may carry
 *  secrets, and a root exporter classes other users' processes stranded or detached, not foreign.
 *  In Prometheus text it implies GG_REPORT_COMMANDS. */
#define GG_REPORT_ALL_COMMANDS 0x10u
/** A modifier for Prometheus text: a `command` label on `gpuguard_process_info` for the calling
 *  user's processes. None by default: a command line carries arguments (tokens), and a label
 *  that changes with every job makes new series. Since 0.2. */
#define GG_REPORT_COMMANDS 0x20u
/** Per-process Prometheus series per device when gg_report() is not told otherwise: the largest
 *  holders; every stranded or orphaned process has its series besides. */
#define GG_REPORT_TOP_DEFAULT 10u

/** Output formats of gg_report(). */
typedef enum gg_format {
  GG_FORMAT_JSON = 0,      /**< one JSON object: {"version", "devices", "processes", "arenas"} */
  GG_FORMAT_PROMETHEUS = 1 /**< Prometheus text exposition format 0.0.4 */
} gg_format_t;

GG_BEGIN_DECLS

/** Writes a report of @p what (GG_REPORT_* bits) to @p out.
 *  @param out an open stream.
 *  @param format GG_FORMAT_JSON or GG_FORMAT_PROMETHEUS.
 *  @param what GG_REPORT_* bits; 0 gives an empty but valid report.
 *  @return 0; GG_EINVAL for NULL out, an unknown format or unknown bits; GG_EIO when writing fails;
 *  errors of the queries (a device that cannot be read is skipped, and reported in the output, not
 *  failed). Thread-safe. */
GG_API int gg_report(FILE *out, gg_format_t format, unsigned what);

/** gg_report() of one GPU or all, with a bound on the per-process Prometheus series.
 *  The JSON report numbers GPUs as gg_gpu_count() does where NVML is there, as Prometheus does.
 *  Per device, the @p top_k processes holding the most memory, and every stranded or orphaned
 *  one, get series of their own (`gpuguard_process_memory_used_bytes`, `gpuguard_process_info`);
 *  the rest are counted in `gpuguard_class_memory_used_bytes` and
 *  `gpuguard_process_series_omitted`.
 *  @param out where the report goes.
 *  @param format GG_FORMAT_JSON or GG_FORMAT_PROMETHEUS.
 *  @param what GG_REPORT_* bits.
 *  @param gpu the GPU's number; -1 every GPU (what gg_report() gives).
 *  @param top_k per-process series per device besides the stranded and orphaned ones; 0 keeps only
 *  those. Ignored for JSON, which lists every process.
 *  @return as gg_report(); GG_ENODEV when the report has no GPU of that number. */
GG_API int gg_report_ex(FILE *out, gg_format_t format, unsigned what, int gpu, unsigned top_k);

/** Writes @p s as one JSON string literal (quotes included) to @p f: the library's own JSON writer,
 *  shared with its reports and receipts so every JSON gpuguard writes escapes text the same way.
 *  Well-formed UTF-8 passes through unchanged; `"` and `\` are escaped; control characters become
 *  `\n`, `\r`, `\t` or `\u00XX`; each byte that is not part of well-formed UTF-8 (stray or
 *  truncated sequences, overlong forms, surrogates, code points above U+10FFFF) becomes `\ufffd`,
 *  so the output is valid JSON and valid UTF-8 whatever the input.
 *  @param f an open stream.
 *  @param s the text; NULL writes `""`.
 *  @return 0; GG_EINVAL for a NULL stream; GG_EIO when the stream reports a write error.
 *  Thread-safe (as the stream is). */
GG_API int gg_json_write_string(FILE *f, const char *s);

GG_END_DECLS

/** @} */
#endif
