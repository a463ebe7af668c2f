/* json.c — the one JSON string writer: UTF-8-correct, escapes what JSON requires, replaces what is
 * not text (see json_internal.h for the exact rules). */
#include <string.h>

#include "core/internal.h"
#include "core/json_internal.h"

/* p is NUL-terminated, so a truncated sequence stops at the NUL, which is never a continuation
 * byte. */
size_t gg__utf8_len(const unsigned char *p) {
  unsigned char c = p[0];
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c == 0xE0) {
    n = 3;
    lo = 0xA0;
  } else if (c >= 0xE1 && c <= 0xEC)
    n = 3;
  else if (c == 0xED) { /* U+D800..U+DFFF are surrogates */
    n = 3;
    hi = 0x9F;
  } else if (c >= 0xEE && c <= 0xEF)
    n = 3;
  else if (c == 0xF0) {
    n = 4;
    lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3)
    n = 4;
  else if (c == 0xF4) { /* nothing above U+10FFFF */
    n = 4;
    hi = 0x8F;
  } else
    return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  return n;
}

void gg__json_string(const char *s, gg__json_sink_fn put, void *ctx) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  put(ctx, "\"", 1);
  while (*p) {
    /* The longest run that needs nothing: one put per run, not per byte. */
    const unsigned char *run = p;
    size_t n;
    while (*p && *p >= 0x20 && *p != 0x7f && *p != '"' && *p != '\\' && (n = gg__utf8_len(p)) > 0)
      p += n;
    if (p > run) put(ctx, (const char *)run, (size_t)(p - run));
    if (!*p) break;
    unsigned char c = *p++;
    if (c == '"')
      put(ctx, "\\\"", 2);
    else if (c == '\\')
      put(ctx, "\\\\", 2);
    else if (c == '\n')
      put(ctx, "\\n", 2);
    else if (c == '\r')
      put(ctx, "\\r", 2);
    else if (c == '\t')
      put(ctx, "\\t", 2);
    else if (c < 0x20 || c == 0x7f) {
      char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
      put(ctx, e, 6);
    } else {
      put(ctx, "\\ufffd", 6); /* not text: one replacement per byte */
    }
  }
  put(ctx, "\"", 1);
}

static void gg__file_sink(void *ctx, const char *p, size_t n) { fwrite(p, 1, n, (FILE *)ctx); }

void gg__json_fputs(FILE *f, const char *s) { gg__json_string(s, gg__file_sink, f); }
