/* host.c — the host backend: a simulated device in host memory (mmap reserve, commit, decommit),
 * with a capacity, simulated streams and deterministic fault injection of every operation. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "gpuguard/host.h"
#include "backend/host/host_impl.h"
#include "core/internal.h"

#define GG__HOST_DEFAULT_CAPACITY    (1ull << 30)
#define GG__HOST_DEFAULT_GRANULARITY (2ull << 20)

/* ---- memory ---------------------------------------------------------------------------------- */

/* Mapped chunks of one open device, so copies can be checked like a real device checks addresses.
 * */
typedef struct gg__hmap {
  uintptr_t ptr;
  size_t size;
  struct gg__hmap *next;
} gg__hmap_t;

typedef struct gg__hdev {
  pthread_mutex_t lock;
  gg__hmap_t *maps;
  size_t mapped;
} gg__hdev_t;

static int gg__h_mem_info(gg__dev_t *d, size_t *free_b, size_t *total_b) {
  (void)d;
  int rc = gg__op(GG__OP_mem_info);
  if (rc < 0) return rc;
  pthread_mutex_lock(&gg__host.lock);
  *total_b = gg__host.capacity;
  *free_b = gg__host.capacity - gg__host.used;
  pthread_mutex_unlock(&gg__host.lock);
  return 0;
}

static int gg__h_va_reserve(gg__dev_t *d, size_t size, uintptr_t *base) {
  int rc = gg__op(GG__OP_reserve);
  if (rc < 0) return rc;
  if (size == 0 || size % d->granularity)
    return gg__err(GG_EINVAL, "host backend: reserve of %zu bytes is not a multiple of %zu", size,
                   d->granularity);
  if (!d->contiguous) {
    *base = 0;
    return 0;
  }
  /* Over-reserve by one granule so the range can start on a granule boundary. */
  size_t g = d->granularity;
  if (size > SIZE_MAX - g)
    return gg__err(GG_ENOMEM, "host backend: reserve of %zu bytes overflows", size);
  void *p = mmap(NULL, size + g, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return gg__err(GG_ENOMEM, "host backend: reserving %zu bytes of address space: %s", size,
                   strerror(errno));
  uintptr_t a = (uintptr_t)p, aligned = (a + g - 1) & ~(uintptr_t)(g - 1);
  if (aligned > a) munmap(p, aligned - a);
  if (aligned + size < a + size + g)
    munmap((void *)(aligned + size), a + size + g - (aligned + size));
  *base = aligned;
  return 0;
}

static int gg__h_va_release(gg__dev_t *d, uintptr_t base, size_t size) {
  int rc = gg__op(GG__OP_release);
  if (rc < 0) return rc;
  if (d->contiguous && base && munmap((void *)base, size) != 0)
    return gg__err(GG_EDRIVER, "host backend: releasing range %#jx: %s", (uintmax_t)base,
                   strerror(errno));
  return 0;
}

static int gg__h_map(gg__dev_t *d, uintptr_t at, size_t size, gg__chunk_t *out) {
  int rc = gg__op(GG__OP_map);
  if (rc < 0) return rc;
  gg__hdev_t *h = d->impl;
  size_t g = d->granularity;
  if (size == 0 || size % g || (d->contiguous && (at == 0 || at % g)) || (!d->contiguous && at))
    return gg__err(GG_EINVAL, "host backend: map of %zu bytes at %#jx is not granule-aligned (%zu)",
                   size, (uintmax_t)at, g);
  gg__hmap_t *m = malloc(sizeof *m);
  if (!m) return gg__err(GG_ENOMEM, "host backend: map: out of host memory");
  pthread_mutex_lock(&gg__host.lock);
  bool fits = size <= gg__host.capacity - gg__host.used;
  if (fits) gg__host.used += size;
  size_t used = gg__host.used, cap = gg__host.capacity;
  pthread_mutex_unlock(&gg__host.lock);
  if (!fits) {
    free(m);
    return gg__err(GG_ENOMEM,
                   "host backend: out of device memory mapping %zu bytes (%zu of %zu in use)", size,
                   used, cap);
  }
  /* MAP_POPULATE commits the pages now, as cuMemCreate does: resident memory really grows. */
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (gg__host.populate ? MAP_POPULATE : MAP_NORESERVE) |
              (d->contiguous ? MAP_FIXED : 0);
  void *p = mmap(d->contiguous ? (void *)at : NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    pthread_mutex_lock(&gg__host.lock);
    gg__host.used -= size;
    pthread_mutex_unlock(&gg__host.lock);
    free(m);
    return gg__err(GG_ENOMEM, "host backend: committing %zu bytes: %s", size, strerror(e));
  }
  m->ptr = (uintptr_t)p;
  m->size = size;
  pthread_mutex_lock(&h->lock);
  m->next = h->maps;
  h->maps = m;
  h->mapped += size;
  pthread_mutex_unlock(&h->lock);
  *out = (gg__chunk_t){.ptr = (uintptr_t)p, .size = size, .handle = 0};
  return 0;
}

/* An inaccessible, unbacked range again (what a reservation holds where nothing is mapped). */
static void gg__h_decommit(uintptr_t p, size_t size) {
  mmap((void *)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

/* The simulated memory moves to `at` (fresh pages: a remapped chunk is free, its contents do not
 * matter); the old range stays accessible, as the driver's second mapping does, until unmapped. */
static int gg__h_remap(gg__dev_t *d, gg__chunk_t *c, uintptr_t at, gg__chunk_t *old) {
  int rc = gg__op(GG__OP_remap);
  if (rc < 0) {
    return rc;
  }
  gg__hdev_t *h = d->impl;
  if (!d->contiguous || c->alias || at % d->granularity) {
    return gg__err(GG_EINVAL,
                   "host backend: remap of %zu bytes to %#jx: not a chunk of a reservation",
                   c->size, (uintmax_t)at);
  }
  pthread_mutex_lock(&h->lock);
  gg__hmap_t *m = h->maps;
  while (m && !(m->ptr == c->ptr && m->size == c->size)) {
    m = m->next;
  }
  int flags =
      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | (gg__host.populate ? MAP_POPULATE : MAP_NORESERVE);
  void *p = m ? mmap((void *)at, c->size, PROT_READ | PROT_WRITE, flags, -1, 0) : MAP_FAILED;
  int e = errno;
  if (p != MAP_FAILED) {
    m->ptr = at;
  }
  pthread_mutex_unlock(&h->lock);
  if (!m) {
    return gg__err(GG_EINVAL, "host backend: remap of %zu bytes at %#jx: no such mapping", c->size,
                   (uintmax_t)c->ptr);
  }
  if (p == MAP_FAILED) {
    return gg__err(GG_ENOMEM, "host backend: remapping %zu bytes: %s", c->size, strerror(e));
  }
  *old = *c;
  old->alias = true;
  c->ptr = at;
  return 0;
}

static int gg__h_unmap(gg__dev_t *d, const gg__chunk_t *c) {
  int rc = gg__op(GG__OP_unmap);
  if (rc < 0) return rc;
  if (c->alias) {
    gg__h_decommit(c->ptr, c->size); /* the memory itself belongs to the chunk it moved to */
    return 0;
  }
  gg__hdev_t *h = d->impl;
  pthread_mutex_lock(&h->lock);
  gg__hmap_t **pp = &h->maps;
  while (*pp && !((*pp)->ptr == c->ptr && (*pp)->size == c->size)) pp = &(*pp)->next;
  gg__hmap_t *m = *pp;
  if (m) {
    *pp = m->next;
    h->mapped -= m->size;
  }
  pthread_mutex_unlock(&h->lock);
  if (!m)
    return gg__err(GG_EINVAL, "host backend: unmap of %zu bytes at %#jx: no such mapping", c->size,
                   (uintmax_t)c->ptr);
  free(m);
  /* Decommit: replace with an inaccessible, unbacked mapping (contiguous) or drop it (chunks). */
  if (d->contiguous)
    mmap((void *)c->ptr, c->size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  else
    munmap((void *)c->ptr, c->size);
  pthread_mutex_lock(&gg__host.lock);
  gg__host.used -= c->size;
  pthread_mutex_unlock(&gg__host.lock);
  return 0;
}

/* One unmap over [lo, lo + size): as cuMemUnmap, refused (nothing changed) unless the range is made
 * of whole mappings without a gap; with GPUGUARD_HOST_RANGE_UNMAP=0, also unless it is one mapping
 * (a driver that does not take a range spanning several). */
static int gg__h_unmap_span(gg__dev_t *d, uintptr_t lo, size_t size) {
  int rc = gg__op(GG__OP_unmap_range);
  if (rc < 0) return rc;
  gg__hdev_t *h = d->impl;
  uintptr_t hi = lo + size;
  size_t covered = 0, count = 0;
  bool partial = false;
  pthread_mutex_lock(&h->lock);
  for (gg__hmap_t *m = h->maps; m; m = m->next) {
    if (m->ptr >= hi || m->ptr + m->size <= lo) continue;
    if (m->ptr < lo || m->ptr + m->size > hi) partial = true;
    covered += m->size;
    count++;
  }
  if (!partial && covered == size && (count == 1 || gg__host.range_unmap)) {
    for (gg__hmap_t **pp = &h->maps; *pp;) {
      gg__hmap_t *m = *pp;
      if (m->ptr >= lo && m->ptr < hi) {
        *pp = m->next;
        h->mapped -= m->size;
        free(m);
      } else {
        pp = &m->next;
      }
    }
  }
  pthread_mutex_unlock(&h->lock);
  if (partial || covered != size)
    return gg__err(GG_EINVAL, "host backend: unmap of %zu bytes at %#jx: %s", size, (uintmax_t)lo,
                   partial ? "the range cuts a mapping" : "the range is not wholly mapped");
  if (count > 1 && !gg__host.range_unmap)
    return gg__err(GG_EINVAL,
                   "host backend: unmap of %zu bytes at %#jx spans %zu mappings (refused: "
                   "GPUGUARD_HOST_RANGE_UNMAP=0)",
                   size, (uintmax_t)lo, count);
  mmap((void *)lo, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  pthread_mutex_lock(&gg__host.lock);
  gg__host.used -= size;
  pthread_mutex_unlock(&gg__host.lock);
  return 0;
}

/* One range unmap where the simulated driver takes it; refused as a driver would refuse a range
 * spanning several mappings, chunk by chunk from the highest, as the CUDA backend does then. */
static int gg__h_unmap_run(gg__dev_t *d, gg__chunk_t *const *chunks, size_t n, size_t *done) {
  *done = 0;
  if (n == 0) return 0;
  if (n > 1 && d->contiguous) {
    uintptr_t lo = chunks[0]->ptr;
    int rc = gg__h_unmap_span(d, lo, chunks[n - 1]->ptr + chunks[n - 1]->size - lo);
    if (rc == 0) {
      *done = n;
      return 0;
    }
    if (rc != GG_EINVAL) return rc;
  }
  for (size_t k = n; k-- > 0; ++*done) {
    int rc = gg__h_unmap(d, chunks[k]);
    if (rc < 0) return rc;
  }
  return 0;
}

/* A real device rejects addresses that are not mapped; so does the simulation. */
static int gg__h_check_range(gg__dev_t *d, uintptr_t p, size_t n, const char *op) {
  gg__hdev_t *h = d->impl;
  size_t covered = 0;
  if (p > UINTPTR_MAX - n) return gg__err(GG_EINVAL, "host backend: %s: range wraps around", op);
  pthread_mutex_lock(&h->lock);
  for (gg__hmap_t *m = h->maps; m; m = m->next) {
    uintptr_t lo = p > m->ptr ? p : m->ptr,
              hi = p + n < m->ptr + m->size ? p + n : m->ptr + m->size;
    if (hi > lo) covered += hi - lo;
  }
  pthread_mutex_unlock(&h->lock);
  if (covered != n)
    return gg__err(GG_EINVAL,
                   "host backend: %s of %zu bytes at %#jx touches unmapped device memory", op, n,
                   (uintmax_t)p);
  return 0;
}

static int gg__h_copy_to_dev(gg__dev_t *d, uintptr_t dst, const void *src, size_t n) {
  int rc = gg__op(GG__OP_copy);
  if (rc < 0) return rc;
  rc = gg__h_check_range(d, dst, n, "copy to device");
  if (rc < 0) return rc;
  if (n) memcpy((void *)dst, src, n);
  return 0;
}

static int gg__h_copy_from_dev(gg__dev_t *d, void *dst, uintptr_t src, size_t n) {
  int rc = gg__op(GG__OP_copy);
  if (rc < 0) return rc;
  rc = gg__h_check_range(d, src, n, "copy from device");
  if (rc < 0) return rc;
  if (n) memcpy(dst, (const void *)src, n);
  return 0;
}

static int gg__h_set_d8(gg__dev_t *d, uintptr_t dst, unsigned char v, size_t n) {
  int rc = gg__op(GG__OP_set);
  if (rc < 0) return rc;
  rc = gg__h_check_range(d, dst, n, "set");
  if (rc < 0) return rc;
  if (n) memset((void *)dst, v, n);
  return 0;
}

static int gg__h_ctx_reset(gg__dev_t *d) {
  (void)d;
  return gg__op(GG__OP_ctx_reset);
}

static void gg__h_close(gg__dev_t *d) {
  if (!d) return;
  gg__hdev_t *h = d->impl;
  /* Whatever the user left mapped is given back, as the driver does when a context goes away. */
  size_t leaked = 0;
  for (gg__hmap_t *m = h->maps, *next; m; m = next) {
    next = m->next;
    munmap((void *)m->ptr, m->size);
    leaked += m->size;
    free(m);
  }
  pthread_mutex_destroy(&h->lock);
  free(h);
  pthread_mutex_lock(&gg__host.lock);
  gg__host.used -= leaked;
  gg__host.opens--;
  pthread_mutex_unlock(&gg__host.lock);
  free(d);
}

static const gg__backend_ops_t gg__host_ops = {
    .name = "host",
    .mem_info = gg__h_mem_info,
    .va_reserve = gg__h_va_reserve,
    .va_release = gg__h_va_release,
    .map = gg__h_map,
    .unmap = gg__h_unmap,
    .unmap_run = gg__h_unmap_run,
    .remap = gg__h_remap,
    .copy_to_dev = gg__h_copy_to_dev,
    .copy_from_dev = gg__h_copy_from_dev,
    .set_d8 = gg__h_set_d8,
    .event_create = gg__h_event_create,
    .event_record = gg__h_event_record,
    .event_query = gg__h_event_query,
    .event_sync = gg__h_event_sync,
    .event_destroy = gg__h_event_destroy,
    .stream_sync = gg__h_stream_sync,
    .stream_query = gg__h_stream_query,
    .stream_wait = gg__h_stream_wait,
    .stream_check = gg__h_stream_check,
    .stream_capture = gg__h_stream_capture,
    .graph_retain = gg__h_graph_retain,
    .ctx_sync = gg__h_ctx_sync,
    .ctx_reset = gg__h_ctx_reset,
    .close = gg__h_close,
};

/* A size or a switch from the environment: 0 when the variable is unset (*out keeps its default).
 */
static int gg__env_size(const char *name, size_t *out) {
  const char *v = gg__env(name);
  return v ? gg__parse_size(name, v, out) : 0;
}

static int gg__env_bool(const char *name, bool *out) {
  const char *v = gg__env(name);
  return v ? gg__parse_bool(name, v, out) : 0;
}

/* Reads the environment into the device settings; called when the first handle opens. */
static int gg__host_configure(void) {
  size_t cap = GG__HOST_DEFAULT_CAPACITY;
  size_t gran = GG__HOST_DEFAULT_GRANULARITY;
  bool vmm = true;
  bool populate = true;
  bool busy = false;
  bool range_unmap = true;
  int rc = gg__env_size("GPUGUARD_HOST_CAPACITY", &cap);
  if (rc == 0) rc = gg__env_size("GPUGUARD_HOST_GRANULARITY", &gran);
  if (rc == 0) rc = gg__env_bool("GPUGUARD_HOST_VMM", &vmm);
  if (rc == 0) rc = gg__env_bool("GPUGUARD_HOST_POPULATE", &populate);
  if (rc == 0) rc = gg__env_bool("GPUGUARD_HOST_BUSY", &busy);
  if (rc < 0) return rc;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (gran < page || (gran & (gran - 1))) {
    const char *gv = gg__env("GPUGUARD_HOST_GRANULARITY");
    return gg__err(GG_EINVAL, "GPUGUARD_HOST_GRANULARITY='%s': must be a power of two >= %zu",
                   gv ? gv : "", page);
  }
  if (cap == 0) return gg__err(GG_EINVAL, "GPUGUARD_HOST_CAPACITY: must be more than 0 bytes");
  rc = gg__env_bool("GPUGUARD_HOST_RANGE_UNMAP", &range_unmap);
  if (rc < 0) return rc;
  gg__fault_t faults[GG__OP_COUNT];
  const char *v = gg__env("GPUGUARD_HOST_FAULT");
  bool have_faults = v != NULL;
  if (have_faults) rc = gg__host_fault_parse("GPUGUARD_HOST_FAULT", v, faults);
  if (rc < 0) return rc;
  gg__host.capacity = cap;
  gg__host.granularity = gran;
  gg__host.vmm = vmm;
  gg__host.used = 0;
  gg__host.populate = populate;
  gg__host.busy = busy;
  gg__host.range_unmap = range_unmap;
  gg__hstreams_reset();
  if (have_faults) gg__host_faults_arm_locked(faults);
  return 0;
}

static int gg__host_props(int index, gg__dev_props_t *p) {
  if (index != 0)
    return gg__err(GG_ENODEV,
                   "host backend: device %d does not exist (the host backend has device 0 only)",
                   index);
  memset(p, 0, sizeof *p);
  gg__strlcpy(p->name, "gpuguard host device", sizeof p->name);
  gg__strlcpy(p->uuid, "GPU-00000000-0000-0000-0000-000000000000", sizeof p->uuid);
  pthread_mutex_lock(&gg__host.lock);
  int rc = gg__host.opens ? 0 : gg__host_configure();
  p->total_mem = gg__host.capacity;
  p->vmm = gg__host.vmm;
  pthread_mutex_unlock(&gg__host.lock);
  return rc;
}

/* fork() while another thread holds the simulated device's lock would leave it held in the child,
 * whose first open would hang: the lock is taken around fork. The forking thread owns it in the
 * child. */
static void gg__host_fork_prepare(void) {
  pthread_mutex_lock(&gg__host.lock);
  gg__hstreams_fork_lock();
}
static void gg__host_fork_release(void) {
  gg__hstreams_fork_unlock();
  pthread_mutex_unlock(&gg__host.lock);
}
GG__FORK_REGISTER(GG__FORK_HOST, gg__host_fork_prepare, gg__host_fork_release,
                  gg__host_fork_release)

static int gg__host_open(int index, gg__dev_t **out) {
  if (index != 0)
    return gg__err(GG_ENODEV,
                   "host backend: device %d does not exist (the host backend has device 0 only)",
                   index);
  gg__dev_t *d = calloc(1, sizeof *d);
  gg__hdev_t *h = calloc(1, sizeof *h);
  if (!d || !h) {
    free(d);
    free(h);
    return gg__err(GG_ENOMEM, "host backend: open: out of host memory");
  }
  pthread_mutex_lock(&gg__host.lock);
  int rc = gg__host.opens ? 0 : gg__host_configure();
  if (rc == 0) gg__host.opens++;
  pthread_mutex_unlock(&gg__host.lock);
  int opened = rc == 0;
  if (opened) rc = gg__op(GG__OP_open);
  if (opened && rc < 0) {
    pthread_mutex_lock(&gg__host.lock);
    gg__host.opens--;
    pthread_mutex_unlock(&gg__host.lock);
  }
  if (rc < 0) {
    free(d);
    free(h);
    return rc;
  }
  pthread_mutex_init(&h->lock, NULL);
  d->ops = &gg__host_ops;
  d->index = index;
  d->impl = h;
  d->granularity = gg__host.granularity;
  d->contiguous = gg__host.vmm;
  d->fork_gen = gg__fork_generation();
  gg__host_props(index, &d->props);
  *out = d;
  return 0;
}

/* One simulated device, always there. */
static int gg__host_count(int *count) {
  *count = 1;
  return 0;
}

static int gg__host_probe(void) { return 0; }

const gg__family_t gg__host_family = {
    .name = "host",
    .simulated = true,
    .probe = gg__host_probe,
    .open = gg__host_open,
    .count = gg__host_count,
    .props = gg__host_props,
};
