/* error.c — status code texts and the thread-local detail of the last failed call. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "gpuguard/version.h"

#define GG__DETAIL_MAX 768 /* the same as gg__err_saved_t's text */

static _Thread_local char gg__detail[GG__DETAIL_MAX];
static _Thread_local int gg__driver_status;
/* The innermost quiet region, or NULL. Initial-exec: every reclaim on the allocation path enters
 * and leaves a region, and the default model costs a __tls_get_addr call each time in the shared
 * library. */
static _Thread_local gg__err_quiet_t *gg__quiet __attribute__((tls_model("initial-exec")));

/* Before the detail changes inside a quiet region: keeps what the region must put back. */
static void gg__quiet_copy(void) {
  gg__err_quiet_t *q = gg__quiet;
  if (GG__LIKELY(!q) || q->copied) return;
  gg__strlcpy(q->saved.text, gg__detail, sizeof q->saved.text);
  q->saved.driver_status = gg__driver_status;
  q->copied = true;
}

const char *gg_strerror(int code) {
  switch (code) {
#define GG__ERR_TEXT(name, value, text) \
  case (value): return text;
    GG_ERRORS(GG__ERR_TEXT)
#undef GG__ERR_TEXT
  }
  return "unknown error";
}

const char *gg_err_name(int code) {
  switch (code) {
#define GG__ERR_NAME(name, value, text) \
  case (value): return "GG_" #name;
    GG_ERRORS(GG__ERR_NAME)
#undef GG__ERR_NAME
  }
  return "GG_UNKNOWN";
}

const char *gg_last_error(void) { return gg__detail; }
int gg_last_driver_error(void) { return gg__driver_status; }

void gg_clear_error(void) {
  gg__detail[0] = '\0';
  gg__driver_status = 0;
}

const char *gg_version(void) { return GG_VERSION_STRING; }

/* The detail starts with the code's name so a message read on its own still says what kind of
 * failure it was. */
static void gg__vrecord(int code, const char *fmt, va_list ap) {
  gg__quiet_copy();
  int n = snprintf(gg__detail, sizeof gg__detail, "%s: ", gg_err_name(code));
  if (n < 0 || (size_t)n >= sizeof gg__detail) return;
  int m = vsnprintf(gg__detail + n, sizeof gg__detail - (size_t)n, fmt, ap);
  if (m > 0 &&
      (size_t)m >= sizeof gg__detail - (size_t)n) /* cut: keep whole characters of a name */
    gg__detail[gg__utf8_whole(gg__detail, sizeof gg__detail - 1)] = '\0';
}

int gg__err(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  gg__vrecord(code, fmt, ap);
  va_end(ap);
  gg__driver_status = 0;
  return code;
}

int gg__err_driver(int code, int driver_status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  gg__vrecord(code, fmt, ap);
  va_end(ap);
  gg__driver_status = driver_status;
  return code;
}

void gg__err_save(gg__err_saved_t *s) {
  gg__strlcpy(s->text, gg__detail, sizeof s->text);
  s->driver_status = gg__driver_status;
}

void gg__err_restore(const gg__err_saved_t *s) {
  gg__quiet_copy();
  gg__strlcpy(gg__detail, s->text, sizeof gg__detail);
  gg__driver_status = s->driver_status;
}

void gg__err_quiet_begin(gg__err_quiet_t *q) {
  q->copied = false;
  q->outer = gg__quiet;
  gg__quiet = q;
}

void gg__err_quiet_end(gg__err_quiet_t *q) {
  gg__quiet = q->outer;
  if (!q->copied) return;
  /* What q started with is also what an outer region that copied nothing yet started with. */
  gg__strlcpy(gg__detail, q->saved.text, sizeof gg__detail);
  gg__driver_status = q->saved.driver_status;
}

size_t gg__utf8_whole(const char *s, size_t len) {
  size_t i = len;
  while (i > 0 && len - i < 3 && ((unsigned char)s[i - 1] & 0xC0) == 0x80)
    i--; /* continuation bytes */
  if (i == 0) return len;
  unsigned char lead = (unsigned char)s[i - 1];
  if (lead < 0xC0 || lead > 0xF4) return len; /* ASCII, or not UTF-8: nothing to repair */
  size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2, have = len - (i - 1);
  return have < need ? i - 1 : len;
}

void gg__strlcpy(char *dst, const char *src, size_t cap) {
  if (cap == 0) return;
  size_t n = src ? strnlen(src, cap - 1) : 0;
  if (n && src[n]) n = gg__utf8_whole(src, n); /* cut: keep whole characters */
  if (n) memcpy(dst, src, n);
  dst[n] = '\0';
}

#if GG_DEBUG >= 1
/* The debug build's assertion failure (GG__ASSERT): said once, on stderr, then abort() for a core.
 * */
_Noreturn void gg__assert_fail(const char *cond, const char *file, int line, const char *func) {
  fprintf(stderr, "gpuguard: internal assertion failed: %s (%s:%d, %s)\n", cond, file, line, func);
  fflush(stderr);
  abort();
}
#endif
