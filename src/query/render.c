/* render.c — JSON and Prometheus text (format 0.0.4) renderings of devices, GPU processes and this
 * process's arenas. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "arena/arena_internal.h"
#include "gpuguard/report.h"
#include "core/internal.h"
#include "core/json_internal.h"
#include "core/vec_internal.h"

/* Prometheus label value: backslash, double quote and newline escaped, as the exposition format asks;
 * the value is made valid UTF-8 (the format's requirement), other control characters and every byte
 * that is not part of well-formed UTF-8 becoming U+FFFD, so a command line cannot break the text. */
static void gg__prom_label(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    size_t n = gg__utf8_len(p);
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p == '\n')
      fputs("\\n", f);
    else if (n == 0 || *p < 0x20 || *p == 0x7f)
      fputs("\xef\xbf\xbd", f), n = 1;
    else
      fwrite(p, 1, n, f);
    p += n ? n : 1;
  }
  fputc('"', f);
}

static void gg__prom_head(FILE *f, const char *name, const char *type, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The devices, each with its info or the error that prevented reading it. */
typedef struct gg__devrow {
  int rc;
  gg_device_info_t info;
  gg_device_telemetry_t tel; /* readings -1 when NVML does not give them */
  char error[256];
  gg_process_t *procs;
  size_t nprocs;
} gg__devrow_t;

static int gg__collect(unsigned what, gg__devrow_t **rows, int *nrows) {
  int n = 0, rc = gg_device_count(&n);
  *rows = NULL, *nrows = 0;
  if (rc < 0) return rc;
  gg__devrow_t *r = calloc(n > 0 ? (size_t)n : 1, sizeof *r);
  if (!r) return gg__err(GG_ENOMEM, "gg_report: out of host memory");
  for (int i = 0; i < n; i++) {
    r[i].rc = gg_device_info(i, &r[i].info);
    if (r[i].rc < 0) {
      gg__strlcpy(r[i].error, gg_last_error(), sizeof r[i].error);
      continue;
    }
    gg__err_saved_t saved;
    gg__err_save(&saved);
    gg_device_telemetry(i, &r[i].tel); /* no NVML (the host backend): every reading stays -1 */
    gg__err_restore(&saved);
    if (!(what & GG_REPORT_PROCESSES)) continue;
    size_t count = 0;
    for (int attempt = 0; attempt < 3; attempt++) { /* the list may grow between the two calls */
      if (gg_process_list(i, r[i].procs, r[i].nprocs, &count) < 0) { /* no GPU: no processes */
        gg__strlcpy(r[i].error, gg_last_error(), sizeof r[i].error);
        break;
      }
      if (count <= r[i].nprocs) {
        r[i].nprocs = count;
        break;
      }
      gg_process_t *grown = realloc(r[i].procs, (count + 8) * sizeof *grown);
      if (!grown) break;
      r[i].procs = grown, r[i].nprocs = count + 8;
    }
    if (count > r[i].nprocs) count = r[i].nprocs;
    r[i].nprocs = 0;
    for (size_t j = 0; j < count; j++) /* a monitor's own descriptors are not worth a row */
      if (!(what & GG_REPORT_NOT_SELF) || r[i].procs[j].pid != (int)getpid())
        r[i].procs[r[i].nprocs++] = r[i].procs[j];
  }
  *rows = r, *nrows = n;
  return 0;
}

static void gg__release(gg__devrow_t *rows, int n) {
  for (int i = 0; i < n; i++) free(rows[i].procs);
  free(rows);
}

/* This process's arenas: name, backend and statistics, read one at a time. */
typedef struct gg__arow {
  char name[64], backend[8];
  int device;
  gg_arena_stats_t st;
} gg__arow_t;

typedef struct gg__arows {
  gg__arow_t *rows;
  size_t n, cap;
} gg__arows_t;

static int gg__arena_row(gg_arena_t *a, void *user) {
  gg__arows_t *l = user;
  gg__arow_t r;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  int ok = gg_arena_stats(a, &r.st) == 0; /* an arena torn down by its guard is skipped */
  gg__err_restore(&saved);
  if (!ok) return 0;
  gg_arena_options_t o;
  r.device = gg__arena_options_of(a, &o) == 0 ? o.device : -1;
  gg__err_restore(&saved);
  gg__strlcpy(r.name, gg_arena_name(a), sizeof r.name);
  gg__strlcpy(r.backend, gg_arena_backend(a), sizeof r.backend);
  gg__arow_t *grown = gg__vec_reserve(l->rows, &l->cap, l->n + 1, sizeof *grown);
  if (!grown) return 0; /* the report lists fewer arenas rather than failing */
  l->rows = grown;
  l->rows[l->n++] = r;
  return 0;
}

/* Utilisation, temperature and power; null where NVML does not say. */
static void gg__json_telemetry(FILE *f, const gg_device_telemetry_t *t) {
  const int pct[3] = {t->utilization_gpu, t->utilization_memory, t->temperature_c};
  static const char *const pct_name[3] = {"utilization_gpu", "utilization_memory", "temperature_c"};
  for (int k = 0; k < 3; k++)
    if (pct[k] < 0)
      fprintf(f, ",\"%s\":null", pct_name[k]);
    else
      fprintf(f, ",\"%s\":%d", pct_name[k], pct[k]);
  const double w[2] = {t->power_watts, t->power_limit_watts};
  static const char *const w_name[2] = {"power_watts", "power_limit_watts"};
  for (int k = 0; k < 2; k++)
    if (w[k] < 0)
      fprintf(f, ",\"%s\":null", w_name[k]);
    else
      fprintf(f, ",\"%s\":%.3f", w_name[k], w[k]);
}

static void gg__json(FILE *f, unsigned what, const gg__devrow_t *rows, int n, const gg__arows_t *ar) {
  fprintf(f, "{\"version\":");
  gg__json_fputs(f, gg_version());
  if (what & GG_REPORT_DEVICES) {
    fputs(",\"devices\":[", f);
    for (int i = 0; i < n; i++) {
      const gg_device_info_t *d = &rows[i].info;
      fprintf(f, "%s{\"index\":%d", i ? "," : "", i);
      if (rows[i].rc < 0) {
        fputs(",\"error\":", f);
        gg__json_fputs(f, rows[i].error);
        fputc('}', f);
        continue;
      }
      fputs(",\"backend\":", f), gg__json_fputs(f, d->backend);
      fputs(",\"name\":", f), gg__json_fputs(f, d->name);
      fputs(",\"uuid\":", f), gg__json_fputs(f, d->uuid);
      fprintf(f,
              ",\"total_bytes\":%zu,\"free_bytes\":%zu,\"used_bytes\":%zu,\"compute_capability\":\"%d.%d\","
              "\"driver_version\":%d,\"vmm_supported\":%s",
              d->total_bytes, d->free_bytes, d->used_bytes, d->cc_major, d->cc_minor, d->driver_version,
              d->vmm_supported ? "true" : "false");
      gg__json_telemetry(f, &rows[i].tel);
      fputc('}', f);
    }
    fputc(']', f);
  }
  if (what & GG_REPORT_PROCESSES) {
    fputs(",\"processes\":[", f);
    bool first = true;
    for (int i = 0; i < n; i++)
      for (size_t j = 0; j < rows[i].nprocs; j++, first = false) {
        const gg_process_t *p = &rows[i].procs[j];
        fprintf(f, "%s{\"device\":%d,\"pid\":%d,\"ppid\":%d,\"uid\":%u,\"user\":", first ? "" : ",",
                p->device, p->pid, p->ppid, p->uid);
        gg__json_fputs(f, p->user);
        fprintf(f, ",\"state\":\"%c\",\"start_time\":%llu,\"used_bytes\":", p->state ? p->state : '?',
                p->start_time);
        if (p->used_bytes < 0)
          fputs("null", f);
        else
          fprintf(f, "%lld", p->used_bytes);
        fputs(",\"class\":", f), gg__json_fputs(f, gg_process_class_name(p->cls));
        fprintf(f, ",\"orphan\":%s,\"session\":", p->cls == GG_PROCESS_ORPHAN ? "true" : "false");
        gg__json_fputs(f, p->session);
        fputs(",\"command\":", f), gg__json_fputs(f, p->command);
        fputs(",\"why\":", f), gg__json_fputs(f, p->why);
        fputc('}', f);
      }
    fputc(']', f);
  }
  if (what & GG_REPORT_ARENAS) {
    fputs(",\"arenas\":[", f);
    for (size_t i = 0; i < ar->n; i++) {
      const gg_arena_stats_t *s = &ar->rows[i].st;
      fprintf(f, "%s{\"pid\":%d,\"name\":", i ? "," : "", (int)getpid());
      gg__json_fputs(f, ar->rows[i].name);
      fputs(",\"backend\":", f), gg__json_fputs(f, ar->rows[i].backend);
      fprintf(f,
              ",\"bytes_in_use\":%zu,\"bytes_mapped\":%zu,\"bytes_reserved\":%zu,\"peak_in_use\":%zu,"
              "\"peak_mapped\":%zu,\"largest_free_block\":%zu,\"n_live\":%llu,\"n_allocs\":%llu,"
              "\"n_frees\":%llu,\"n_trims\":%llu,\"bytes_trimmed\":%llu,\"scope_depth\":%d,"
              "\"fragmentation\":%.6f,\"bytes_pending\":%zu}",
              s->bytes_in_use, s->bytes_mapped, s->bytes_reserved, s->peak_in_use, s->peak_mapped,
              s->largest_free_block, s->n_live, s->n_allocs, s->n_frees, s->n_trims, s->bytes_trimmed,
              s->scope_depth, s->fragmentation, s->bytes_pending);
    }
    fputc(']', f);
  }
  fputs("}\n", f);
}

/* The labels every series starts with, as DCGM exporter writes them: gpu="INDEX",UUID="GPU-...". The
 * UUID comes from the device rows when the report read them, else from the device itself. */
static void gg__prom_gpu(FILE *f, const gg__devrow_t *rows, int n, int device) {
  fprintf(f, "gpu=\"%d\",UUID=", device);
  if (device >= 0 && device < n && rows[device].rc == 0) {
    gg__prom_label(f, rows[device].info.uuid);
    return;
  }
  gg_device_info_t d;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  int rc = device >= 0 ? gg_device_info(device, &d) : -1;
  gg__err_restore(&saved);
  gg__prom_label(f, rc == 0 ? d.uuid : "");
}

/* One gauge per arena statistic, labelled with the arena's device, name, backend and this process's
 * pid. No arena: no families (an empty family tells a scraper nothing). */
static void gg__prom_arenas(FILE *f, const gg__devrow_t *rows, int n, const gg__arows_t *ar) {
  enum { SIZE, ULL, DBL };
  static const struct {
    const char *name, *help;
    size_t off;
    int type;
  } m[] = {
      {"gpuguard_arena_in_use_bytes", "Bytes in live blocks of the arena.",
       offsetof(gg_arena_stats_t, bytes_in_use), SIZE},
      {"gpuguard_arena_mapped_bytes", "Physical device memory the arena has mapped.",
       offsetof(gg_arena_stats_t, bytes_mapped), SIZE},
      {"gpuguard_arena_reserved_bytes", "Address space the arena reserved.",
       offsetof(gg_arena_stats_t, bytes_reserved), SIZE},
      {"gpuguard_arena_peak_in_use_bytes", "Highest bytes in use since the arena was created.",
       offsetof(gg_arena_stats_t, peak_in_use), SIZE},
      {"gpuguard_arena_peak_mapped_bytes", "Highest bytes mapped since the arena was created.",
       offsetof(gg_arena_stats_t, peak_mapped), SIZE},
      {"gpuguard_arena_largest_free_block_bytes", "Largest free block of mapped memory.",
       offsetof(gg_arena_stats_t, largest_free_block), SIZE},
      {"gpuguard_arena_live_blocks", "Live blocks in the arena.", offsetof(gg_arena_stats_t, n_live), ULL},
      {"gpuguard_arena_fragmentation_ratio",
       "1 - largest free block / (mapped - in use); 0 when nothing mapped is free.",
       offsetof(gg_arena_stats_t, fragmentation), DBL},
  };
  if (ar->n == 0) return;
  for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
    gg__prom_head(f, m[k].name, "gauge", m[k].help);
    for (size_t i = 0; i < ar->n; i++) {
      const char *field = (const char *)&ar->rows[i].st + m[k].off;
      fprintf(f, "%s{", m[k].name);
      gg__prom_gpu(f, rows, n, ar->rows[i].device);
      fprintf(f, ",pid=\"%d\",arena=", (int)getpid());
      gg__prom_label(f, ar->rows[i].name);
      fputs(",backend=", f), gg__prom_label(f, ar->rows[i].backend);
      if (m[k].type == SIZE) {
        size_t v;
        memcpy(&v, field, sizeof v);
        fprintf(f, "} %zu\n", v);
      } else if (m[k].type == ULL) {
        unsigned long long v;
        memcpy(&v, field, sizeof v);
        fprintf(f, "} %llu\n", v);
      } else {
        double v;
        memcpy(&v, field, sizeof v);
        fprintf(f, "} %.6f\n", v);
      }
    }
  }
}

/* A device reading as a gauge: the family is written only when some device has the reading. */
typedef double (*gg__reading_fn)(const gg__devrow_t *row);
static double gg__total(const gg__devrow_t *r) { return (double)r->info.total_bytes; }
static double gg__free(const gg__devrow_t *r) { return (double)r->info.free_bytes; }
static double gg__used(const gg__devrow_t *r) { return (double)r->info.used_bytes; }
static double gg__util(const gg__devrow_t *r) {
  return r->tel.utilization_gpu < 0 ? -1 : r->tel.utilization_gpu / 100.0;
}
static double gg__mutil(const gg__devrow_t *r) {
  return r->tel.utilization_memory < 0 ? -1 : r->tel.utilization_memory / 100.0;
}
static double gg__temp(const gg__devrow_t *r) { return r->tel.temperature_c; }
static double gg__power(const gg__devrow_t *r) { return r->tel.power_watts; }
static double gg__plimit(const gg__devrow_t *r) { return r->tel.power_limit_watts; }

static void gg__prom_devices(FILE *f, const gg__devrow_t *rows, int n) {
  static const struct {
    const char *name, *help;
    gg__reading_fn read;
  } m[] = {
      {"gpuguard_device_memory_total_bytes", "Device memory size.", gg__total},
      {"gpuguard_device_memory_free_bytes", "Device memory free, as the driver reports it.", gg__free},
      {"gpuguard_device_memory_used_bytes", "Device memory in use (total minus free).", gg__used},
      {"gpuguard_device_utilization_ratio",
       "Fraction of the last sample period in which a kernel ran (NVML).", gg__util},
      {"gpuguard_device_memory_utilization_ratio",
       "Fraction of the last sample period in which device memory was read or written (NVML).", gg__mutil},
      {"gpuguard_device_temperature_celsius", "GPU core temperature (NVML).", gg__temp},
      {"gpuguard_device_power_watts", "Power draw (NVML).", gg__power},
      {"gpuguard_device_power_limit_watts", "Enforced power limit (NVML).", gg__plimit},
  };
  bool any = false;
  for (int i = 0; i < n; i++) any |= rows[i].rc == 0;
  if (!any) return;
  gg__prom_head(f, "gpuguard_device_info", "gauge", "Device identity; the value is always 1.");
  for (int i = 0; i < n; i++) {
    if (rows[i].rc < 0) continue;
    fputs("gpuguard_device_info{", f);
    gg__prom_gpu(f, rows, n, i);
    fputs(",backend=", f), gg__prom_label(f, rows[i].info.backend);
    fputs(",name=", f), gg__prom_label(f, rows[i].info.name);
    fputs("} 1\n", f);
  }
  for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
    bool head = false;
    for (int i = 0; i < n; i++) {
      double v = rows[i].rc == 0 ? m[k].read(&rows[i]) : -1;
      if (v < 0) continue;
      if (!head) gg__prom_head(f, m[k].name, "gauge", m[k].help), head = true;
      fprintf(f, "%s{", m[k].name);
      gg__prom_gpu(f, rows, n, i);
      fprintf(f, "} %.15g\n", v); /* 15 digits: bytes stay exact, 0.87 stays 0.87 */
    }
  }
}

static void gg__prom_processes(FILE *f, const gg__devrow_t *rows, int n) {
  bool head = false;
  for (int i = 0; i < n; i++)
    for (size_t j = 0; j < rows[i].nprocs; j++) {
      const gg_process_t *p = &rows[i].procs[j];
      if (p->used_bytes < 0) continue;
      if (!head) {
        gg__prom_head(f, "gpuguard_process_memory_used_bytes", "gauge",
                      "Device memory the driver accounts to a process (absent when unknown).");
        head = true;
      }
      fputs("gpuguard_process_memory_used_bytes{", f);
      gg__prom_gpu(f, rows, n, p->device);
      fprintf(f, ",pid=\"%d\",user=", p->pid);
      gg__prom_label(f, p->user);
      fputs(",class=", f), gg__prom_label(f, gg_process_class_name(p->cls));
      fprintf(f, ",orphan=\"%s\",command=", p->cls == GG_PROCESS_ORPHAN ? "true" : "false");
      gg__prom_label(f, p->command);
      fprintf(f, "} %lld\n", p->used_bytes);
    }
  head = false;
  for (int i = 0; i < n; i++) {
    if (rows[i].rc < 0) continue;
    if (!head) {
      gg__prom_head(f, "gpuguard_processes", "gauge", "Processes holding the device, by class.");
      head = true;
    }
    for (int c = GG_PROCESS_UNKNOWN; c <= GG_PROCESS_DETACHED; c++) {
      unsigned long count = 0;
      for (size_t j = 0; j < rows[i].nprocs; j++) count += rows[i].procs[j].cls == (gg_process_class_t)c;
      fputs("gpuguard_processes{", f);
      gg__prom_gpu(f, rows, n, i);
      fprintf(f, ",class=\"%s\",orphan=\"%s\"} %lu\n", gg_process_class_name((gg_process_class_t)c),
              c == GG_PROCESS_ORPHAN ? "true" : "false", count);
    }
  }
}

static void gg__prom(FILE *f, unsigned what, const gg__devrow_t *rows, int n, const gg__arows_t *ar) {
  if (what & GG_REPORT_DEVICES) gg__prom_devices(f, rows, n);
  if (what & GG_REPORT_PROCESSES) gg__prom_processes(f, rows, n);
  if (what & GG_REPORT_ARENAS) gg__prom_arenas(f, rows, n, ar);
}

int gg_report(FILE *out, gg_format_t format, unsigned what) {
  if (!out) return gg__err(GG_EINVAL, "gg_report: out is NULL");
  if (format != GG_FORMAT_JSON && format != GG_FORMAT_PROMETHEUS)
    return gg__err(GG_EINVAL, "gg_report: unknown format %d", (int)format);
  if (what & ~(GG_REPORT_ALL | GG_REPORT_NOT_SELF))
    return gg__err(GG_EINVAL, "gg_report: unknown report bits %#x",
                   what & ~(GG_REPORT_ALL | GG_REPORT_NOT_SELF));
  gg__devrow_t *rows = NULL;
  int n = 0, rc = 0;
  if (what & (GG_REPORT_DEVICES | GG_REPORT_PROCESSES)) {
    rc = gg__collect(what, &rows, &n);
    if (rc < 0) return rc;
  }
  gg__arows_t ar = {0};
  if (what & GG_REPORT_ARENAS) gg__arena_foreach_live(gg__arena_row, &ar);
  if (format == GG_FORMAT_JSON)
    gg__json(out, what, rows, n, &ar);
  else
    gg__prom(out, what, rows, n, &ar);
  gg__release(rows, n);
  free(ar.rows);
  if (fflush(out) != 0 || ferror(out)) return gg__err(GG_EIO, "gg_report: writing the report failed");
  return 0;
}
