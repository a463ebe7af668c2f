/* arena_share.c — share.h: a block's physical allocations exported as file descriptors, and a range
 * mapped from descriptors another process exported. The device work is the backend's (export_fd,
 * import_fd, import_access, import_unmap); here are the arena's chunks, batches and checks. */
#include <stdlib.h>
#include <unistd.h>

#include "arena/arena_base_impl.h"
#include "gpuguard/share.h"

/* Closes what this call exported so far: on failure the caller owns no descriptor of it. */
static void gg__share_undo(gg_share_piece_t *pieces, size_t n) {
  for (size_t i = 0; i < n; i++) {
    close(pieces[i].fd);
    pieces[i].fd = -1;
  }
}

/* One export call's walk over the mappings under the range (gg_arena_foreach_mapping's visitor,
 * which runs under the arena's lock: the chunks stay mapped while each is exported). */
typedef struct gg__export_walk {
  gg_arena_t *a;
  uintptr_t ptr;
  size_t first, cap, n, done, offset;
  gg_share_piece_t *pieces;
  int rc;
} gg__export_walk_t;

static int gg__export_visit(const gg_mapping_info_t *m, void *user) {
  gg__export_walk_t *w = user;
  size_t k = w->n++;
  if (k == 0) w->offset = w->ptr - (uintptr_t)m->ptr;
  if (k < w->first || w->done == w->cap) return 0; /* counted only */
  const gg__backend_ops_t *ops = w->a->ops;
  if (!ops->export_fd) {
    w->rc = gg__err(GG_ENOTSUP,
                    "gg_arena_export: the %s backend cannot export memory (its chunks are private "
                    "anonymous memory of this process)",
                    ops->name);
    return 1;
  }
  gg__chunk_t c = {.ptr = (uintptr_t)m->ptr, .size = m->size, .handle = (uintptr_t)m->handle};
  int fd = -1;
  w->rc = ops->export_fd(w->a->dev, &c, &fd);
  if (w->rc < 0) return 1;
  w->pieces[w->done++] = (gg_share_piece_t){.fd = fd, .size = m->size};
  return 0;
}

int gg_arena_export(gg_arena_t *arena, const void *ptr, size_t size, size_t first,
                    gg_share_piece_t *pieces, size_t cap, size_t *total, size_t *offset) {
  if (!ptr) return gg__err(GG_EINVAL, "gg_arena_export: ptr is NULL");
  if (!size) return gg__err(GG_EINVAL, "gg_arena_export: size is 0");
  if (!total) return gg__err(GG_EINVAL, "gg_arena_export: total is NULL");
  if (!pieces && cap)
    return gg__err(GG_EINVAL, "gg_arena_export: pieces is NULL but cap is %zu", cap);
  gg__export_walk_t w = {
      .a = arena, .ptr = (uintptr_t)ptr, .first = first, .cap = cap, .pieces = pieces};
  /* The walk says its own errors (a bad range, a hole, a dead arena) as this call's; a visit that
   * failed stopped it, which is no error of the walk's, and left its status in w.rc. */
  int rc = gg__arena_walk_mappings(arena, ptr, size, "gg_arena_export", gg__export_visit, &w);
  if (rc < 0) w.rc = rc;
  if (w.rc == 0 && first >= w.n)
    w.rc = gg__err(GG_EINVAL, "gg_arena_export: first piece %zu is beyond the last (%zu piece%s)",
                   first, w.n, w.n == 1 ? "" : "s");
  if (w.rc < 0) {
    gg__share_undo(pieces, w.done);
    return w.rc;
  }
  *total = w.n;
  if (offset) *offset = w.offset;
  return 0;
}

/* ---- the receiving side ---------------------------------------------------------------------- */

struct gg_import {
  gg__dev_t *dev;
  uintptr_t base;
  size_t size, reserved, mapped;
  bool ready; /* every byte mapped and access granted */
  size_t n, cap;
  size_t *sizes; /* each mapped piece's size, in order: unmapped one by one */
};

int gg_import_open(gg_import_t **imp, const char *backend, int device, size_t size) {
  if (!imp) return gg__err(GG_EINVAL, "gg_import_open: imp is NULL");
  *imp = NULL;
  if (!size) return gg__err(GG_EINVAL, "gg_import_open: size is 0");
  gg_import_t *m = calloc(1, sizeof *m);
  if (!m) return gg__err(GG_ENOMEM, "gg_import_open: out of host memory");
  int rc = gg__dev_open(backend, device, &m->dev);
  if (rc < 0) {
    free(m);
    return rc;
  }
  const gg__backend_ops_t *ops = m->dev->ops;
  size_t g = m->dev->granularity;
  if (!ops->import_fd || !m->dev->contiguous)
    rc =
        gg__err(GG_ENOTSUP, "gg_import_open: the %s backend cannot map memory of another process%s",
                ops->name, ops->import_fd ? " without virtual memory management" : "");
  else if (size > SIZE_MAX - g)
    rc = gg__err(GG_EINVAL, "gg_import_open: size %zu is too large", size);
  m->size = size;
  m->reserved = (size + g - 1) / g * g;
  if (rc == 0) rc = ops->va_reserve(m->dev, m->reserved, &m->base);
  if (rc < 0) {
    gg__dev_close(m->dev);
    free(m);
    return rc;
  }
  *imp = m;
  return 0;
}

int gg_import_map(gg_import_t *imp, const gg_share_piece_t *piece) {
  if (!imp) return gg__err(GG_EINVAL, "gg_import_map: imp is NULL");
  if (!piece) return gg__err(GG_EINVAL, "gg_import_map: piece is NULL");
  if (piece->fd < 0) return gg__err(GG_EINVAL, "gg_import_map: descriptor %d is bad", piece->fd);
  if (!piece->size || piece->size > imp->size - imp->mapped)
    return gg__err(GG_EINVAL,
                   "gg_import_map: a piece of %zu bytes overruns the range (%zu of %zu mapped)",
                   piece->size, imp->mapped, imp->size);
  if (imp->n == imp->cap) {
    size_t cap = imp->cap ? imp->cap * 2 : 8;
    size_t *grown = realloc(imp->sizes, cap * sizeof *grown);
    if (!grown) return gg__err(GG_ENOMEM, "gg_import_map: out of host memory");
    imp->sizes = grown;
    imp->cap = cap;
  }
  gg__dev_t *d = imp->dev;
  int rc = d->ops->import_fd(d, piece->fd, imp->base + imp->mapped, piece->size);
  if (rc < 0) return rc;
  imp->sizes[imp->n++] = piece->size;
  imp->mapped += piece->size;
  if (imp->mapped < imp->size) return 0;
  /* Complete: access once for the whole range, as the exporting side granted it. */
  rc = d->ops->import_access(d, imp->base, imp->mapped);
  imp->ready = rc == 0;
  return rc;
}

void *gg_import_ptr(const gg_import_t *imp) { return imp && imp->ready ? (void *)imp->base : NULL; }

int gg_import_close(gg_import_t *imp) {
  if (!imp) return 0;
  gg__dev_t *d = imp->dev;
  int rc = 0;
  size_t at = imp->mapped;
  for (size_t i = imp->n; i-- > 0;) { /* from the top: each piece as it was mapped */
    at -= imp->sizes[i];
    int r = d->ops->import_unmap(d, imp->base + at, imp->sizes[i]);
    if (r < 0 && rc == 0) rc = r;
  }
  int r = d->ops->va_release(d, imp->base, imp->reserved);
  if (r < 0 && rc == 0) rc = r;
  gg__dev_close(d);
  free(imp->sizes);
  free(imp);
  return rc;
}
