/* render.c — JSON and Prometheus text (format 0.0.4) renderings of devices, GPU processes and this
 * process's arenas. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "arena/arena_internal.h"
#include "gpuguard/query.h"
#include "gpuguard/report.h"
#include "core/internal.h"
#include "core/json_internal.h"
#include "core/vec_internal.h"
#include "backend/backend.h"
#include "query/labels_internal.h"
#include "query/query_internal.h"

/* Prometheus label value: backslash, double quote and newline escaped, as the exposition format
 * asks; the value is made valid UTF-8 (the format's requirement), other control characters and
 * every byte that is not part of well-formed UTF-8 becoming U+FFFD, so a command line cannot break
 * the text. */
static void gg__prom_label(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    size_t n = gg__utf8_len(p);
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p == '\n')
      fputs("\\n", f);
    else if (n == 0 || *p < 0x20 || *p == 0x7f) {
      fputs("\xef\xbf\xbd", f);
      n = 1;
    } else
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
  bool procs_failed;
  int minor;    /* /dev/nvidia<minor>, -1 unknown */
  char pci[32]; /* PCI bus id from NVML, "" unknown */
} gg__devrow_t;

/* The processes holding one device (uuid: by NVML UUID; else by the device number), grown until
 * they fit; this process is left out under GG_REPORT_NOT_SELF. */
static void gg__collect_procs(gg__devrow_t *r, unsigned what, const char *uuid, int device,
                              bool by_uuid) {
  size_t count = 0;
  for (int attempt = 0; attempt < 3; attempt++) { /* the list may grow between the two calls */
    int rc = by_uuid ? gg__process_list_at(uuid, device, r->procs, r->nprocs, &count)
                     : gg_process_list(device, r->procs, r->nprocs, &count);
    if (rc < 0) { /* no GPU: no processes */
      gg__strlcpy(r->error, gg_last_error(), sizeof r->error);
      r->procs_failed = rc != GG_ENODEV;
      count = 0;
      break;
    }
    if (count <= r->nprocs) {
      r->nprocs = count;
      break;
    }
    gg_process_t *grown = realloc(r->procs, (count + 8) * sizeof *grown);
    if (!grown) break;
    r->procs = grown;
    r->nprocs = count + 8;
  }
  if (count > r->nprocs) count = r->nprocs;
  r->nprocs = 0;
  for (size_t j = 0; j < count; j++) /* a monitor's own descriptors are not worth a row */
    if (!(what & GG_REPORT_NOT_SELF) || r->procs[j].pid != (int)getpid())
      r->procs[r->nprocs++] = r->procs[j];
}

/* The devices as the GPU family's telemetry numbers them (NVML: what nvidia-smi and DCGM call
 * `gpu`): every GPU of the machine, whatever CUDA_VISIBLE_DEVICES hides, also where there is NVML
 * but no CUDA (a container given only the `utility` capability). GG_ENOTSUP without telemetry. One
 * reading of the telemetry and one driver question per GPU for the whole report; with gpu >= 0
 * only that GPU is read (*rows empty when it does not exist). *total: the machine's GPUs. */
static int gg__collect_nvml(unsigned what, int gpu, gg__devrow_t **rows, int *nrows, int *total) {
  gg__gpus_t s;
  *rows = NULL;
  *nrows = 0;
  *total = 0;
  int rc = gg__gpus_telemetry(&s, gpu >= 0 ? gpu : GG__GPUS_ALL);
  if (rc < 0 && !s.fam->telemetry) rc = gg__err(GG_ENOTSUP, "gg_report: no telemetry");
  gg__devrow_t *r = rc < 0 ? NULL : calloc(s.ndevs > 0 ? (size_t)s.ndevs : 1, sizeof *r);
  if (rc == 0 && !r) rc = gg__err(GG_ENOMEM, "gg_report: out of host memory");
  if (rc < 0) {
    gg__gpus_free(&s);
    return rc;
  }
  for (int k = 0; k < s.ndevs; k++) {
    const gg__mon_dev_t *d = &s.devs[k];
    int i = s.first + k;
    r[k].minor = d->minor;
    r[k].info.index = i;
    r[k].rc = d->rc;
    if (d->rc < 0) {
      gg__strlcpy(r[k].error, d->error, sizeof r[k].error);
      continue;
    }
    gg__strlcpy(r[k].info.backend, s.fam->telemetry->name, sizeof r[k].info.backend);
    gg__strlcpy(r[k].info.name, d->name, sizeof r[k].info.name);
    gg__strlcpy(r[k].info.uuid, d->uuid, sizeof r[k].info.uuid);
    gg__gpus_driver_view(&s, &r[k].info);
    gg__strlcpy(r[k].pci, d->pci_bus_id, sizeof r[k].pci);
    if (d->have_memory) {
      r[k].info.total_bytes = d->total;
      r[k].info.free_bytes = d->free_b;
      r[k].info.used_bytes = d->total - d->free_b;
    }
    gg__telemetry_from(&r[k].tel, i, &d->tel);
    if (what & GG_REPORT_PROCESSES)
      gg__collect_procs(&r[k], what, d->uuid[0] ? d->uuid : NULL, i, true);
  }
  *rows = r;
  *nrows = s.ndevs;
  *total = s.n;
  gg__gpus_free(&s);
  return 0;
}

/* The devices of the backend gpuguard uses (CUDA's ordinals, or the simulated host device); with
 * gpu >= 0 that device alone (none when it does not exist). *total: how many there are. */
static int gg__collect(unsigned what, int gpu, gg__devrow_t **rows, int *nrows, int *total) {
  int n = 0, rc = gg_device_count(&n);
  *rows = NULL;
  *nrows = 0;
  *total = 0;
  if (rc < 0) return rc;
  int lo = 0, hi = n;
  if (gpu >= 0) { /* that device alone, or none */
    lo = gpu;
    hi = gpu < n ? gpu + 1 : gpu;
  }
  gg__devrow_t *r = calloc(hi > lo ? (size_t)(hi - lo) : 1, sizeof *r);
  if (!r) return gg__err(GG_ENOMEM, "gg_report: out of host memory");
  for (int i = lo; i < hi; i++) {
    gg__devrow_t *row = &r[i - lo];
    row->minor = -1;
    row->rc = gg_device_info(i, &row->info);
    row->info.index = i; /* also where the reading failed */
    if (row->rc < 0) {
      gg__strlcpy(row->error, gg_last_error(), sizeof row->error);
      continue;
    }
    gg__err_saved_t saved;
    gg__err_save(&saved);
    gg_device_telemetry(i, &row->tel); /* no NVML (the host backend): every reading stays -1 */
    gg__err_restore(&saved);
    if (what & GG_REPORT_PROCESSES) gg__collect_procs(row, what, NULL, i, false);
  }
  *rows = r;
  *nrows = hi > lo ? hi - lo : 0;
  *total = n;
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
  unsigned long long id; /* unique among this process's live arenas, stable for the arena's life */
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
  r.device = gg_arena_get_options(a, &o) == 0 ? o.device : -1;
  gg__err_restore(&saved);
  /* The handle's address, mixed (splitmix64's finaliser) so the label tells nothing of the
   * layout. */
  unsigned long long z = (unsigned long long)(uintptr_t)a + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  r.id = (z ^ (z >> 31)) & 0xffffffffffffULL;
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

/* The "devices" array: each device's figures and telemetry, or the error that kept them. */
static void gg__json_devices(FILE *f, const gg__devrow_t *rows, int n) {
  fputs(",\"devices\":[", f);
  for (int i = 0; i < n; i++) {
    const gg_device_info_t *d = &rows[i].info;
    fprintf(f, "%s{\"index\":%d", i ? "," : "", rows[i].info.index);
    if (rows[i].rc < 0) {
      fputs(",\"error\":", f);
      gg__json_fputs(f, rows[i].error);
      fputc('}', f);
      continue;
    }
    fputs(",\"backend\":", f);
    gg__json_fputs(f, d->backend);
    fputs(",\"name\":", f);
    gg__json_fputs(f, d->name);
    fputs(",\"uuid\":", f);
    gg__json_fputs(f, d->uuid);
    fprintf(f,
            ",\"total_bytes\":%zu,\"free_bytes\":%zu,\"used_bytes\":%zu,\"compute_capability\":"
            "\"%d.%d\","
            "\"driver_version\":%d,\"vmm_supported\":%s",
            d->total_bytes, d->free_bytes, d->used_bytes, d->cc_major, d->cc_minor,
            d->driver_version, d->vmm_supported ? "true" : "false");
    gg__json_telemetry(f, &rows[i].tel);
    fputc('}', f);
  }
  fputc(']', f);
}

/* The "processes" array: every device's processes, one array. */
static void gg__json_processes(FILE *f, const gg__devrow_t *rows, int n, unsigned what) {
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
      fputs(",\"class\":", f);
      gg__json_fputs(f, gg_process_class_name(p->cls));
      fprintf(f, ",\"orphan\":%s,\"session\":", p->cls == GG_PROCESS_ORPHAN ? "true" : "false");
      gg__json_fputs(f, p->session);
      /* another user's command line may carry secrets; a root reader sees it classed stranded or
       * detached, not foreign, so the uid decides */
      bool hide = p->uid != geteuid() && !(what & GG_REPORT_ALL_COMMANDS);
      fputs(",\"command\":", f);
      gg__json_fputs(f, hide ? "" : p->command);
      fputs(",\"why\":", f);
      gg__json_fputs(f, p->why);
      fputc('}', f);
    }
  fputc(']', f);
}

/* The "arenas" array: this process's live arenas. */
static void gg__json_arenas(FILE *f, const gg__arows_t *ar) {
  fputs(",\"arenas\":[", f);
  for (size_t i = 0; i < ar->n; i++) {
    const gg_arena_stats_t *s = &ar->rows[i].st;
    fprintf(f, "%s{\"pid\":%d,\"name\":", i ? "," : "", (int)getpid());
    gg__json_fputs(f, ar->rows[i].name);
    fputs(",\"backend\":", f);
    gg__json_fputs(f, ar->rows[i].backend);
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

static void gg__json(FILE *f, unsigned what, const gg__devrow_t *rows, int n,
                     const gg__arows_t *ar) {
  fprintf(f, "{\"version\":");
  gg__json_fputs(f, gg_version());
  if (what & GG_REPORT_DEVICES) gg__json_devices(f, rows, n);
  if (what & GG_REPORT_PROCESSES) gg__json_processes(f, rows, n, what);
  if (what & GG_REPORT_ARENAS) gg__json_arenas(f, ar);
  fputs("}\n", f);
}

/* ---- Prometheus ------------------------------------------------------------------------------ */

/* What every series of one scrape shares: where the devices came from and the host's name. */
typedef struct gg__promctx {
  const gg__devrow_t *rows;
  int n;
  char hostname[256];
  unsigned what;
  unsigned top_k; /* per-process series per device, besides every stranded or orphaned one */
} gg__promctx_t;

/* The labels every device series starts with, as NVIDIA's DCGM exporter writes them, so that both
 * exporters' series join on one dashboard: gpu (NVML's index), UUID, pci_bus_id, device (nvidiaN),
 * modelName, Hostname. Unknown ones are left out. */
static void gg__prom_dev_labels(FILE *f, const gg__promctx_t *c, const gg__devrow_t *r, int gpu) {
  fprintf(f, "gpu=\"%d\",UUID=", gpu);
  gg__prom_label(f, r ? r->info.uuid : "");
  if (r && r->pci[0]) {
    fputs(",pci_bus_id=", f);
    gg__prom_label(f, r->pci);
  }
  if (r && r->minor >= 0) fprintf(f, ",device=\"nvidia%d\"", r->minor);
  if (r && r->info.name[0]) {
    fputs(",modelName=", f);
    gg__prom_label(f, r->info.name);
  }
  fputs(",Hostname=", f);
  gg__prom_label(f, c->hostname);
}

/* An arena's device (gpuguard's ordinal) among the rows: the row with its UUID (rows may be NVML's,
 * numbered differently); NULL when none is. */
static const gg__devrow_t *gg__row_of(const gg__promctx_t *c, const char *uuid) {
  for (int i = 0; uuid && uuid[0] && i < c->n; i++)
    if (c->rows[i].rc == 0 && strcmp(c->rows[i].info.uuid, uuid) == 0) return &c->rows[i];
  return NULL;
}

/* The device an arena's series are labelled with: its row among the report's (NVML's numbering),
 * else its own description under gpuguard's ordinal (own.info cleared when unreadable). */
typedef struct gg__arena_dev {
  const gg__devrow_t *row;
  gg__devrow_t own;
} gg__arena_dev_t;

static void gg__arena_dev(const gg__promctx_t *c, const gg__arow_t *a, gg__arena_dev_t *out) {
  gg_device_info_t d;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  bool known = a->device >= 0 && gg_device_info(a->device, &d) == 0;
  gg__err_restore(&saved);
  const gg__family_t *fam = gg__family(a->backend);
  out->row = known && fam && !fam->simulated ? gg__row_of(c, d.uuid) : NULL;
  memset(&out->own, 0, sizeof out->own);
  out->own.minor = -1;
  if (known) out->own.info = d;
}

/* One gauge (or counter) per arena statistic, labelled with the arena's device, name, a unique
 * arena_id (two unnamed arenas are two series), backend and this process's pid. No arena: no
 * families (an empty family tells a scraper nothing). */
static void gg__prom_arenas(FILE *f, const gg__promctx_t *c, const gg__arows_t *ar) {
  enum { SIZE, ULL, DBL };
  static const struct {
    const char *name, *type, *help;
    size_t off;
    int kind;
  } m[] = {
      {"gpuguard_arena_in_use_bytes", "gauge", "Bytes in live blocks of the arena.",
       offsetof(gg_arena_stats_t, bytes_in_use), SIZE},
      {"gpuguard_arena_mapped_bytes", "gauge", "Physical device memory the arena has mapped.",
       offsetof(gg_arena_stats_t, bytes_mapped), SIZE},
      {"gpuguard_arena_reserved_bytes", "gauge", "Address space the arena reserved.",
       offsetof(gg_arena_stats_t, bytes_reserved), SIZE},
      {"gpuguard_arena_peak_in_use_bytes", "gauge",
       "Highest bytes in use since the arena was created.", offsetof(gg_arena_stats_t, peak_in_use),
       SIZE},
      {"gpuguard_arena_peak_mapped_bytes", "gauge",
       "Highest bytes mapped since the arena was created.", offsetof(gg_arena_stats_t, peak_mapped),
       SIZE},
      {"gpuguard_arena_largest_free_block_bytes", "gauge", "Largest free block of mapped memory.",
       offsetof(gg_arena_stats_t, largest_free_block), SIZE},
      {"gpuguard_arena_live_blocks", "gauge", "Live blocks in the arena.",
       offsetof(gg_arena_stats_t, n_live), ULL},
      {"gpuguard_arena_fragmentation_ratio", "gauge",
       "1 - largest free block / (mapped - in use); 0 when nothing mapped is free.",
       offsetof(gg_arena_stats_t, fragmentation), DBL},
      {"gpuguard_arena_allocations_total", "counter",
       "Blocks allocated since the arena was created.", offsetof(gg_arena_stats_t, n_allocs), ULL},
      {"gpuguard_arena_frees_total", "counter", "Blocks freed since the arena was created.",
       offsetof(gg_arena_stats_t, n_frees), ULL},
      {"gpuguard_arena_trims_total", "counter", "Trims that returned memory to the device.",
       offsetof(gg_arena_stats_t, n_trims), ULL},
      {"gpuguard_arena_trimmed_bytes_total", "counter", "Bytes returned to the device by trims.",
       offsetof(gg_arena_stats_t, bytes_trimmed), ULL},
  };
  if (ar->n == 0) return;
  /* Each arena's device is asked about once, not once per statistic. */
  gg__arena_dev_t *devs = malloc(ar->n * sizeof *devs);
  for (size_t i = 0; devs && i < ar->n; i++) gg__arena_dev(c, &ar->rows[i], &devs[i]);
  for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
    gg__prom_head(f, m[k].name, m[k].type, m[k].help);
    for (size_t i = 0; i < ar->n; i++) {
      const gg__arow_t *a = &ar->rows[i];
      const char *field = (const char *)&a->st + m[k].off;
      fprintf(f, "%s{", m[k].name);
      gg__arena_dev_t one;
      if (!devs) /* no room to keep them: asked again */
        gg__arena_dev(c, a, &one);
      const gg__arena_dev_t *ad = devs ? &devs[i] : &one;
      if (ad->row)
        gg__prom_dev_labels(f, c, ad->row, ad->row->info.index);
      else /* a device NVML does not list (the simulated host device): gpuguard's ordinal */
        gg__prom_dev_labels(f, c, &ad->own, a->device);
      fprintf(f, ",pid=\"%d\",arena=", (int)getpid());
      gg__prom_label(f, a->name);
      fprintf(f, ",arena_id=\"%012llx\",backend=", a->id);
      gg__prom_label(f, a->backend);
      if (m[k].kind == SIZE) {
        size_t v;
        memcpy(&v, field, sizeof v);
        fprintf(f, "} %zu\n", v);
      } else if (m[k].kind == ULL) {
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
  free(devs);
}

/* A device reading as a gauge: the family is written only when some device has the reading. */
typedef double (*gg__reading_fn)(const gg__devrow_t *row);
static double gg__total(const gg__devrow_t *r) {
  return r->info.total_bytes ? (double)r->info.total_bytes : -1;
}
static double gg__free(const gg__devrow_t *r) {
  return r->info.total_bytes ? (double)r->info.free_bytes : -1;
}
static double gg__used(const gg__devrow_t *r) {
  return r->info.total_bytes ? (double)r->info.used_bytes : -1;
}
static double gg__util(const gg__devrow_t *r) {
  return r->tel.utilization_gpu < 0 ? -1 : r->tel.utilization_gpu / 100.0;
}
static double gg__mutil(const gg__devrow_t *r) {
  return r->tel.utilization_memory < 0 ? -1 : r->tel.utilization_memory / 100.0;
}
static double gg__temp(const gg__devrow_t *r) { return r->tel.temperature_c; }
static double gg__power(const gg__devrow_t *r) { return r->tel.power_watts; }
static double gg__plimit(const gg__devrow_t *r) { return r->tel.power_limit_watts; }

static void gg__prom_devices(FILE *f, const gg__promctx_t *c) {
  static const struct {
    const char *name, *help;
    gg__reading_fn read;
  } m[] = {
      {"gpuguard_device_memory_total_bytes", "Device memory size.", gg__total},
      {"gpuguard_device_memory_free_bytes", "Device memory free, as the driver reports it.",
       gg__free},
      {"gpuguard_device_memory_used_bytes", "Device memory in use (total minus free).", gg__used},
      {"gpuguard_device_utilization_ratio",
       "Fraction of the last sample period in which a kernel ran (NVML).", gg__util},
      {"gpuguard_device_memory_utilization_ratio",
       "Fraction of the last sample period in which device memory was read or written (NVML).",
       gg__mutil},
      {"gpuguard_device_temperature_celsius", "GPU core temperature (NVML).", gg__temp},
      {"gpuguard_device_power_watts", "Power draw (NVML).", gg__power},
      {"gpuguard_device_power_limit_watts", "Enforced power limit (NVML).", gg__plimit},
  };
  bool any = false;
  for (int i = 0; i < c->n; i++) any |= c->rows[i].rc == 0;
  if (!any) return;
  gg__prom_head(f, "gpuguard_device_info", "gauge", "Device identity; the value is always 1.");
  for (int i = 0; i < c->n; i++) {
    if (c->rows[i].rc < 0) continue;
    fputs("gpuguard_device_info{", f);
    gg__prom_dev_labels(f, c, &c->rows[i], c->rows[i].info.index);
    fputs("} 1\n", f);
  }
  for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
    bool head = false;
    for (int i = 0; i < c->n; i++) {
      double v = c->rows[i].rc == 0 ? m[k].read(&c->rows[i]) : -1;
      if (v < 0) continue;
      if (!head) {
        gg__prom_head(f, m[k].name, "gauge", m[k].help);
        head = true;
      }
      fprintf(f, "%s{", m[k].name);
      gg__prom_dev_labels(f, c, &c->rows[i], c->rows[i].info.index);
      fprintf(f, "} %.15g\n", v); /* 15 digits: bytes stay exact, 0.87 stays 0.87 */
    }
  }
}

/* Which processes of one device get series of their own: every stranded or orphaned one (what an
 * operator must act on, however small), then the top_k largest holders. A busy node's hundreds of
 * short-lived workers would otherwise make new series every scrape. keep[j] is set for those. */
typedef struct gg__rank {
  size_t j;
  long long bytes;
} gg__rank_t;

static int gg__by_bytes_desc(const void *a, const void *b) {
  long long x = ((const gg__rank_t *)a)->bytes, y = ((const gg__rank_t *)b)->bytes;
  return (x < y) - (x > y);
}

static size_t gg__keep_procs(const gg__devrow_t *r, unsigned top_k, bool *keep) {
  gg__rank_t *rank = malloc((r->nprocs ? r->nprocs : 1) * sizeof *rank);
  size_t kept = 0;
  for (size_t j = 0; j < r->nprocs; j++) {
    gg_process_class_t cls = r->procs[j].cls;
    keep[j] = cls == GG_PROCESS_STRANDED || cls == GG_PROCESS_ORPHAN;
    kept += keep[j];
    if (rank) rank[j] = (gg__rank_t){j, r->procs[j].used_bytes};
  }
  if (!rank) return kept; /* out of memory: the ones to act on, still */
  qsort(rank, r->nprocs, sizeof *rank, gg__by_bytes_desc);
  for (size_t k = 0; k < r->nprocs && k < top_k; k++)
    if (!keep[rank[k].j]) {
      keep[rank[k].j] = true;
      kept++;
    }
  free(rank);
  return kept;
}

/* One gpuguard_process_info series: who the process is, and what it belongs to (hpc_job as DCGM's
 * exporter names the Slurm job, since a "job" label would be renamed exported_job by Prometheus,
 * whose own job label names the scrape target; pod_uid, pod and namespace for a Kubernetes pod). No
 * command line unless asked for; never another user's unless GG_REPORT_ALL_COMMANDS. */
static void gg__prom_info(FILE *f, const gg__promctx_t *c, const gg__devrow_t *r,
                          const gg_process_t *p) {
  fputs("gpuguard_process_info{", f);
  gg__prom_dev_labels(f, c, r, r->info.index);
  fprintf(f, ",pid=\"%d\",user=", p->pid);
  gg__prom_label(f, p->user);
  fputs(",class=", f);
  gg__prom_label(f, gg_process_class_name(p->cls));
  fprintf(f, ",orphan=\"%s\"", p->cls == GG_PROCESS_ORPHAN ? "true" : "false");
  gg__workload_t w;
  gg__workload_of(p->pid, &w);
  const char *const names[] = {"hpc_job", "pod_uid", "pod", "namespace"};
  const char *const values[] = {w.job, w.pod_uid, w.pod, w.namespace};
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
    if (values[k][0]) fprintf(f, ",%s=\"%s\"", names[k], values[k]); /* checked: digits, DNS */
  bool all = c->what & GG_REPORT_ALL_COMMANDS;
  bool mine = p->uid == geteuid();
  if (all || (mine && (c->what & GG_REPORT_COMMANDS))) {
    fputs(",command=", f);
    gg__prom_label(f, p->command);
  }
  fputs("} 1\n", f);
}

/* Memory per process keyed by pid alone, for the processes gg__keep_procs picks; what describes the
 * process is on gpuguard_process_info, so a class change does not multiply the memory series. Per
 * class, every process counts: gpuguard_class_memory_used_bytes (what `used - sum` by gpu leaves
 * is memory no process explains) and gpuguard_processes. */
static void gg__prom_processes(FILE *f, const gg__promctx_t *c) {
  bool **keep = calloc(c->n > 0 ? (size_t)c->n : 1, sizeof *keep);
  if (!keep) return;
  for (int i = 0; i < c->n; i++) {
    keep[i] = calloc(c->rows[i].nprocs ? c->rows[i].nprocs : 1, sizeof **keep);
    if (keep[i]) gg__keep_procs(&c->rows[i], c->top_k, keep[i]);
  }
  for (int pass = 0; pass < 2; pass++) {
    bool head = false;
    for (int i = 0; i < c->n; i++)
      for (size_t j = 0; keep[i] && j < c->rows[i].nprocs; j++) {
        const gg_process_t *p = &c->rows[i].procs[j];
        if (!keep[i][j] || (pass == 0 && p->used_bytes < 0)) continue;
        if (!head && pass == 0)
          gg__prom_head(f, "gpuguard_process_memory_used_bytes", "gauge",
                        "Device memory the driver accounts to a process (absent when unknown); "
                        "the largest holders and every stranded or orphaned process.");
        if (!head && pass == 1)
          gg__prom_head(f, "gpuguard_process_info", "gauge",
                        "A process holding the device: user, class, Slurm job, Kubernetes pod; "
                        "the value is always 1.");
        head = true;
        if (pass == 1) {
          gg__prom_info(f, c, &c->rows[i], p);
          continue;
        }
        fputs("gpuguard_process_memory_used_bytes{", f);
        gg__prom_dev_labels(f, c, &c->rows[i], c->rows[i].info.index);
        fprintf(f, ",pid=\"%d\"} %lld\n", p->pid, p->used_bytes);
      }
  }
  static const struct {
    const char *name, *help;
  } m[] = {
      {"gpuguard_processes", "Processes holding the device, by class."},
      {"gpuguard_class_memory_used_bytes",
       "Device memory the driver accounts to the processes of each class (every process)."},
  };
  for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
    bool head = false;
    for (int i = 0; i < c->n; i++) {
      if (c->rows[i].rc < 0) continue;
      if (!head) gg__prom_head(f, m[k].name, "gauge", m[k].help);
      head = true;
      for (int cls = GG_PROCESS_UNKNOWN; cls <= GG_PROCESS_DETACHED; cls++) {
        double v = 0;
        for (size_t j = 0; j < c->rows[i].nprocs; j++) {
          const gg_process_t *p = &c->rows[i].procs[j];
          if (p->cls != (gg_process_class_t)cls) continue;
          v += k == 0 ? 1 : p->used_bytes > 0 ? (double)p->used_bytes : 0;
        }
        fprintf(f, "%s{", m[k].name);
        gg__prom_dev_labels(f, c, &c->rows[i], c->rows[i].info.index);
        fprintf(f, ",class=\"%s\"", gg_process_class_name((gg_process_class_t)cls));
        if (k == 0) fprintf(f, ",orphan=\"%s\"", cls == GG_PROCESS_ORPHAN ? "true" : "false");
        fprintf(f, "} %.15g\n", v);
      }
    }
  }
  bool head = false;
  for (int i = 0; i < c->n; i++) {
    if (c->rows[i].rc < 0) continue;
    size_t omitted = 0;
    for (size_t j = 0; j < c->rows[i].nprocs; j++) omitted += !keep[i] || !keep[i][j];
    if (!head)
      gg__prom_head(f, "gpuguard_process_series_omitted", "gauge",
                    "Processes holding the device that have no series of their own (beyond the "
                    "largest holders; counted in gpuguard_class_memory_used_bytes).");
    head = true;
    fputs("gpuguard_process_series_omitted{", f);
    gg__prom_dev_labels(f, c, &c->rows[i], c->rows[i].info.index);
    fprintf(f, "} %zu\n", omitted);
  }
  for (int i = 0; i < c->n; i++) free(keep[i]);
  free(keep);
}

/* The devices for Prometheus: NVML's (every GPU, numbered as DCGM numbers them); without NVML, the
 * CUDA devices; never the simulated host device, which is no GPU of this machine. */
static int gg__collect_prom(unsigned what, int gpu, gg__devrow_t **rows, int *n, int *total,
                            const char **source) {
  const gg__telemetry_t *tel = gg__gpu_family()->telemetry;
  int rc = gg__collect_nvml(what, gpu, rows, n, total);
  *source = tel ? tel->name : "none";
  if (rc != GG_ENOTSUP) return rc;
  const char *backend = NULL;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  int brc = gg__backend_resolve(NULL, 0, &backend);
  gg__err_restore(&saved);
  if (brc == 0 && !gg__family(backend)->simulated) {
    *source = backend;
    return gg__collect(what, gpu, rows, n, total);
  }
  *source = "none";
  *rows = NULL;
  *n = 0;
  *total = 0;
  return 0;
}

/* The devices for JSON: NVML's, numbered as nvidia-smi numbers them, whatever CUDA here sees (each
 * with backend "cuda" where CUDA sees it, else "nvml"); without NVML, gpuguard's own (CUDA's
 * ordinals, or the simulated host device). GPUGUARD_BACKEND=host asked for keeps the host device.
 */
static int gg__collect_json(unsigned what, int gpu, gg__devrow_t **rows, int *n, int *total) {
  const gg__family_t *asked = gg__family(gg__env("GPUGUARD_BACKEND"));
  gg__err_saved_t saved;
  gg__err_save(&saved);
  if (!(asked && asked->simulated) && gg__collect_nvml(what, gpu, rows, n, total) == 0) {
    if (*total > 0) return 0;
    gg__release(*rows, *n);
  }
  gg__err_restore(&saved);
  return gg__collect(what, gpu, rows, n, total);
}

static void gg__prom(FILE *f, unsigned what, unsigned top_k, const gg__devrow_t *rows, int n,
                     const char *source, int collect_rc, const gg__arows_t *ar) {
  gg__promctx_t c = {.rows = rows, .n = n, .what = what, .top_k = top_k};
  if (gethostname(c.hostname, sizeof c.hostname) != 0) c.hostname[0] = '\0';
  c.hostname[sizeof c.hostname - 1] = '\0';
  gg__prom_head(f, "gpuguard_build_info", "gauge",
                "The gpuguard library that wrote these series; always 1.");
  fputs("gpuguard_build_info{version=", f);
  gg__prom_label(f, gg_version());
  fputs("} 1\n", f);
  if (what & (GG_REPORT_DEVICES | GG_REPORT_PROCESSES)) {
    int ok = 0;
    for (int i = 0; i < n; i++) ok += rows[i].rc == 0;
    gg__prom_head(
        f, "gpuguard_devices", "gauge",
        "GPUs this report covers, and where they were read: nvml, cuda, or none (no NVIDIA GPU "
        "here, so no device series).");
    fprintf(f, "gpuguard_devices{source=\"%s\"} %d\n", source, ok);
  }
  bool dev_ok = collect_rc == 0, proc_ok = collect_rc == 0;
  for (int i = 0; i < n; i++) {
    dev_ok &= rows[i].rc == 0;
    proc_ok &= !rows[i].procs_failed;
  }
  gg__prom_head(f, "gpuguard_scrape_collector_success", "gauge",
                "1 when the collector read everything it covers, 0 when some reading failed.");
  if (what & GG_REPORT_DEVICES)
    fprintf(f, "gpuguard_scrape_collector_success{collector=\"devices\"} %d\n", dev_ok);
  if (what & GG_REPORT_PROCESSES)
    fprintf(f, "gpuguard_scrape_collector_success{collector=\"processes\"} %d\n", proc_ok);
  if (what & GG_REPORT_ARENAS)
    fputs("gpuguard_scrape_collector_success{collector=\"arenas\"} 1\n", f);
  if (what & GG_REPORT_DEVICES) gg__prom_devices(f, &c);
  if (what & GG_REPORT_PROCESSES) gg__prom_processes(f, &c);
  if (what & GG_REPORT_ARENAS) gg__prom_arenas(f, &c, ar);
}

int gg_report(FILE *out, gg_format_t format, unsigned what) {
  return gg_report_ex(out, format, what, -1, GG_REPORT_TOP_DEFAULT);
}

int gg_report_ex(FILE *out, gg_format_t format, unsigned what, int gpu, unsigned top_k) {
  const unsigned known =
      GG_REPORT_ALL | GG_REPORT_NOT_SELF | GG_REPORT_ALL_COMMANDS | GG_REPORT_COMMANDS;
  if (!out) return gg__err(GG_EINVAL, "gg_report: out is NULL");
  if (format != GG_FORMAT_JSON && format != GG_FORMAT_PROMETHEUS)
    return gg__err(GG_EINVAL, "gg_report: unknown format %d", (int)format);
  if (what & ~known) return gg__err(GG_EINVAL, "gg_report: unknown report bits %#x", what & ~known);
  gg__devrow_t *rows = NULL;
  int n = 0, total = 0, rc = 0;
  const char *source = "none";
  if (what & (GG_REPORT_DEVICES | GG_REPORT_PROCESSES)) {
    /* A GPU asked for is the only one read. A failed reading is a 0 success gauge. */
    if (format == GG_FORMAT_PROMETHEUS) {
      rc = gg__collect_prom(what, gpu, &rows, &n, &total, &source);
    } else {
      rc = gg__collect_json(what, gpu, &rows, &n, &total);
      if (rc < 0) return rc;
    }
    if (gpu >= 0 && total > 0 && n == 0) { /* no GPU at all is a report of its own */
      gg__release(rows, n);
      return gg__err(GG_ENODEV, "gg_report_ex: GPU %d does not exist (this machine has %d)", gpu,
                     total);
    }
  }
  gg__arows_t ar = {0};
  if (what & GG_REPORT_ARENAS) gg__arena_foreach_live(gg__arena_row, &ar);
  if (format == GG_FORMAT_JSON)
    gg__json(out, what, rows, n, &ar);
  else
    gg__prom(out, what, top_k, rows, n, source, rc, &ar);
  gg__release(rows, n);
  free(ar.rows);
  if (fflush(out) != 0 || ferror(out))
    return gg__err(GG_EIO, "gg_report: writing the report failed");
  return 0;
}

/* ---- the public JSON string writer ----------------------------------------------------------- */

/* report.h's, so in the report's layer; the writer itself is core's (json.c), shared by every
 * layer that writes JSON. */
int gg_json_write_string(FILE *f, const char *s) {
  if (!f) return gg__err(GG_EINVAL, "gg_json_write_string: stream is NULL");
  gg__json_fputs(f, s);
  if (ferror(f)) return gg__err(GG_EIO, "gg_json_write_string: write failed");
  return 0;
}
