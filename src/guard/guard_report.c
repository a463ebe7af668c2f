/* guard_report.c — a guard's leak report: where it goes (options.leak_report,
 * GPUGUARD_LEAK_REPORT), the blocks its attached arenas still held at teardown grouped by arena,
 * tag and allocation site, and the text or JSON written to its destination in one bounded write. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "guard/guard_report_internal.h"
#include "core/internal.h"
#include "core/json_internal.h"
#include "core/symbol_internal.h"
#include "core/vec_internal.h"

/* ---- the destination ------------------------------------------------------------------------- */

/* "stderr", "stdout", "none", PATH, each optionally "json:" or "text:" first. */
int gg__report_parse(const char *what, const char *text, gg__report_opts_t *r) {
  memset(r, 0, sizeof *r);
  r->dest = GG__TO_STDERR;
  if (!text) return 0;
  r->asked = true;
  const char *v = text;
  if (strncmp(v, "json:", 5) == 0) {
    r->json = true;
    v += 5;
  } else if (strncmp(v, "text:", 5) == 0)
    v += 5;
  else if (strcmp(v, "json") == 0) {
    r->json = true;
    return 0;
  }
  if (!*v) return gg__err(GG_EINVAL, "%s='%s': nothing after the format prefix", what, text);
  if (strcmp(v, "stderr") == 0) return 0;
  if (strcmp(v, "stdout") == 0) {
    r->dest = GG__TO_STDOUT;
    return 0;
  }
  if (!strcmp(v, "none") || !strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "no")) {
    r->dest = GG__TO_NONE;
    return 0;
  }
  if (strlen(v) >= sizeof r->path) return gg__err(GG_EINVAL, "%s: the path is too long", what);
  r->dest = GG__TO_FILE;
  gg__strlcpy(r->path, v, sizeof r->path);
  return 0;
}

/* ---- the rows -------------------------------------------------------------------------------- */

/* Surviving blocks of one tag allocated at one site (GG_ARENA_BACKTRACE). */
typedef struct gg__site_row {
  const void *key; /* the arena's interned frames: one per site, alive while the visit lasts */
  void *pc[8];
  int n;
  unsigned long long count, bytes;
} gg__site_row_t;

typedef struct gg__tag_row {
  char tag[64];
  unsigned long long count, bytes;
  gg__site_row_t *sites;
  size_t n_sites, cap_sites;
} gg__tag_row_t;

#define GG__REPORT_TOP_SITES 3 /* sites printed under each tag, most bytes first */

typedef struct gg__obj_row {
  char name[64], backend[16];
  unsigned long long count, bytes;
  gg__tag_row_t *tags;
  size_t n_tags, cap_tags;
  bool truncated; /* out of host memory while grouping */
} gg__obj_row_t;

/* Counts a block under its site in tag row t. */
static void gg__visit_site(gg__obj_row_t *o, gg__tag_row_t *t, const gg__held_block_t *b) {
  if (b->n_frames <= 0 || !b->frames) return;
  for (size_t i = 0; i < t->n_sites; i++) {
    if (t->sites[i].key == (const void *)b->frames) {
      t->sites[i].count++;
      t->sites[i].bytes += b->size;
      return;
    }
  }
  gg__site_row_t *r = gg__vec_reserve(t->sites, &t->cap_sites, t->n_sites + 1, sizeof *r);
  if (!r) {
    o->truncated = true;
    return;
  }
  t->sites = r;
  r = &t->sites[t->n_sites++];
  r->key = b->frames;
  r->n = b->n_frames < 8 ? b->n_frames : 8;
  r->count = 1;
  r->bytes = b->size;
  memcpy(r->pc, b->frames, (size_t)r->n * sizeof *r->pc);
}

static int gg__visit_block(const gg__held_block_t *b, void *user) {
  gg__obj_row_t *o = user;
  const char *tag = b->tag ? b->tag : "";
  o->count++;
  o->bytes += b->size;
  for (size_t i = 0; i < o->n_tags; i++) {
    if (strcmp(o->tags[i].tag, tag) == 0) {
      o->tags[i].count++;
      o->tags[i].bytes += b->size;
      gg__visit_site(o, &o->tags[i], b);
      return 0;
    }
  }
  gg__tag_row_t *t = gg__vec_reserve(o->tags, &o->cap_tags, o->n_tags + 1, sizeof *t);
  if (!t) {
    o->truncated = true;
    return 0;
  }
  o->tags = t;
  t = &o->tags[o->n_tags++];
  memset(t, 0, sizeof *t);
  gg__strlcpy(t->tag, tag, sizeof t->tag);
  t->count = 1;
  t->bytes = b->size;
  gg__visit_site(o, t, b);
  return 0;
}

static int gg__site_row_cmp(const void *x, const void *y) {
  const gg__site_row_t *a = x, *b = y;
  return a->bytes != b->bytes ? (a->bytes < b->bytes ? 1 : -1)
                              : (a->count < b->count) - (a->count > b->count);
}

/* The sites under one tag (sorted, most bytes first): the top few, each frame named. */
static void gg__render_sites(FILE *f, const gg__tag_row_t *t, bool json) {
  size_t shown = t->n_sites < GG__REPORT_TOP_SITES ? t->n_sites : GG__REPORT_TOP_SITES;
  char name[512];
  if (json) fputs(",\"sites\":[", f);
  for (size_t i = 0; i < shown; i++) {
    const gg__site_row_t *r = &t->sites[i];
    if (json)
      fprintf(f, "%s{\"count\":%llu,\"bytes\":%llu,\"frames\":[", i ? "," : "", r->count, r->bytes);
    else
      fprintf(f, "gpuguard:       %llu block%s, %llu bytes allocated at:\n", r->count,
              r->count == 1 ? "" : "s", r->bytes);
    for (int k = 0; k < r->n; k++) {
      gg__site_name(r->pc[k], name, sizeof name);
      if (json) {
        fputs(k ? "," : "", f);
        gg__json_fputs(f, name);
      } else
        fprintf(f, "gpuguard:         #%d %s\n", k, name);
    }
    if (json) fputs("]}", f);
  }
  if (json)
    fputs("]", f);
  else if (t->n_sites > shown)
    fprintf(f, "gpuguard:       (%zu more site%s)\n", t->n_sites - shown,
            t->n_sites - shown == 1 ? "" : "s");
}

void gg__report_add(gg__report_t *r, const gg__attach_ops_t *ops, void *obj) {
  if (!ops->foreach_block) return;
  gg__obj_row_t *objs = gg__vec_reserve(r->objs, &r->cap_objs, r->n_objs + 1, sizeof *objs);
  if (!objs) return;
  r->objs = objs;
  gg__obj_row_t *o = &objs[r->n_objs];
  memset(o, 0, sizeof *o);
  gg__strlcpy(o->name, ops->name ? ops->name(obj) : ops->kind, sizeof o->name);
  gg__strlcpy(o->backend, ops->backend ? ops->backend(obj) : "", sizeof o->backend);
  gg__err_saved_t saved;
  gg__err_save(&saved);
  ops->foreach_block(obj, gg__visit_block, o);
  gg__err_restore(&saved);
  for (size_t k = 0; k < o->n_tags; k++)
    if (o->tags[k].n_sites > 1) /* none: sites is NULL, which qsort must not be given */
      qsort(o->tags[k].sites, o->tags[k].n_sites, sizeof *o->tags[k].sites, gg__site_row_cmp);
  if (o->count == 0) {
    free(o->tags);
    return; /* nothing leaked: not listed */
  }
  r->n_objs++;
  r->count += o->count;
  r->bytes += o->bytes;
}

static void gg__report_render(FILE *f, const gg__report_opts_t *opts, const char *guard,
                              const gg__report_t *r, const char *how) {
  if (opts->json) {
    fprintf(f, "{\"gpuguard\":\"leak_report\",\"pid\":%ld,\"guard\":", (long)getpid());
    gg__json_fputs(f, guard);
    fprintf(f, ",\"teardown\":\"%s\",\"live_blocks\":%llu,\"live_bytes\":%llu,\"arenas\":[", how,
            r->count, r->bytes);
    for (size_t i = 0; i < r->n_objs; i++) {
      const gg__obj_row_t *o = &r->objs[i];
      fputs(i ? ",{\"name\":" : "{\"name\":", f);
      gg__json_fputs(f, o->name);
      fputs(",\"backend\":", f);
      gg__json_fputs(f, o->backend);
      fprintf(f, ",\"live_blocks\":%llu,\"live_bytes\":%llu,\"truncated\":%s,\"tags\":[", o->count,
              o->bytes, o->truncated ? "true" : "false");
      for (size_t k = 0; k < o->n_tags; k++) {
        fputs(k ? ",{\"tag\":" : "{\"tag\":", f);
        gg__json_fputs(f, o->tags[k].tag);
        fprintf(f, ",\"count\":%llu,\"bytes\":%llu", o->tags[k].count, o->tags[k].bytes);
        if (o->tags[k].n_sites) gg__render_sites(f, &o->tags[k], true);
        fputc('}', f);
      }
      fputs("]}", f);
    }
    fputs("]}\n", f);
    return;
  }
  fprintf(f,
          "gpuguard: leak report of guard '%s' (pid %ld, teardown by %s): %llu live block%s, %llu "
          "bytes in "
          "%zu arena%s\n",
          guard, (long)getpid(), how, r->count, r->count == 1 ? "" : "s", r->bytes, r->n_objs,
          r->n_objs == 1 ? "" : "s");
  for (size_t i = 0; i < r->n_objs; i++) {
    const gg__obj_row_t *o = &r->objs[i];
    fprintf(f, "gpuguard:   arena '%s' (%s): %llu live block%s, %llu bytes%s\n", o->name,
            o->backend, o->count, o->count == 1 ? "" : "s", o->bytes,
            o->truncated ? " (some tags left out: out of memory)" : "");
    for (size_t k = 0; k < o->n_tags; k++) {
      fprintf(f, "gpuguard:     tag '%s': %llu block%s, %llu bytes\n",
              o->tags[k].tag[0] ? o->tags[k].tag : "(none)", o->tags[k].count,
              o->tags[k].count == 1 ? "" : "s", o->tags[k].bytes);
      if (o->tags[k].n_sites) gg__render_sites(f, &o->tags[k], false);
    }
  }
}

/* A report file is a regular file: a symbolic link is not followed (root appending its report to
 * the file another user's link names) and a FIFO or device is refused at once (opening a FIFO
 * nobody reads blocks, and the teardown with it, past any signal). -1 with a message on stderr. */
static int gg__report_open(const gg__report_opts_t *opts, const char *guard) {
  int fd =
      open(opts->path,
           O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0644);
  struct stat st;
  const char *why = fd < 0 ? strerror(errno) : NULL;
  if (fd < 0 && errno == ELOOP) why = "a symbolic link (not followed)";
  if (fd < 0 && errno == ENXIO) why = "a FIFO nobody reads (not a regular file)";
  if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) why = "not a regular file";
  if (!why) return fd;
  if (fd >= 0) close(fd);
  fprintf(stderr, "gpuguard: guard '%s': cannot open the leak report file '%s': %s\n", guard,
          opts->path, why);
  return -1;
}

/* Writes len bytes within about two seconds in all: stdout or stderr may be a pipe nobody reads,
 * and a teardown must end. After poll says there is room, a write of at most PIPE_BUF bytes does
 * not block. */
static void gg__report_write(int fd, const char *buf, size_t len) {
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (size_t off = 0; off < len;) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    long spent = (long)(now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    int ready = spent >= 2000 ? 0 : poll(&pf, 1, (int)(2000 - spent));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0 || (pf.revents & (POLLERR | POLLHUP | POLLNVAL))) return;
    size_t chunk = len - off < PIPE_BUF ? len - off : PIPE_BUF;
    ssize_t w = write(fd, buf + off, chunk);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) return;
    off += (size_t)w;
  }
}

/* Renders into memory first, so the report reaches its destination in one write. */
void gg__report_emit(const gg__report_opts_t *opts, const char *guard, const gg__report_t *r,
                     const char *how) {
  if (opts->dest == GG__TO_NONE || (!opts->asked && r->count == 0)) return;
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  if (!m) return;
  gg__report_render(m, opts, guard, r, how);
  fclose(m);
  int fd = opts->dest == GG__TO_STDOUT ? 1 : 2;
  bool own = opts->dest == GG__TO_FILE;
  if (own) fd = gg__report_open(opts, guard);
  if (opts->dest == GG__TO_STDOUT) fflush(stdout);
  if (fd >= 0) gg__report_write(fd, buf, len);
  if (own && fd >= 0) close(fd);
  free(buf);
}

void gg__report_free(gg__report_t *r) {
  for (size_t i = 0; i < r->n_objs; i++) {
    for (size_t k = 0; k < r->objs[i].n_tags; k++) free(r->objs[i].tags[k].sites);
    free(r->objs[i].tags);
  }
  free(r->objs);
}
