/* json_internal.h — json.c's one JSON string writer, shared by the leak report (guard.c), the
 * reports (render.c), the teardown receipt (teardown.c) and, through gg_json_write_string()
 * (render.c, report.h's layer), the CLI. */
#ifndef GG_JSON_INTERNAL_H
#define GG_JSON_INTERNAL_H

#include <stddef.h>
#include <stdio.h>

/* Length of the well-formed UTF-8 sequence at p (1..4), or 0 when p does not start one (RFC 3629:
 * no overlong forms, no surrogates, nothing above U+10FFFF). p is NUL-terminated. */
size_t gg__utf8_len(const unsigned char *p);

/* Receives the output piece by piece. */
typedef void (*gg__json_sink_fn)(void *ctx, const char *p, size_t n);

/* Writes s (NUL-terminated; NULL writes "") as a JSON string literal, quotes included, to put:
 * well-formed UTF-8 passes through as it is; '"' and '\\' are escaped; control characters (below
 * U+0020, and DEL) become \n, \r, \t or \u00XX; every byte that is not part of a well-formed UTF-8
 * sequence (a stray continuation byte, a truncated sequence, an overlong form, a surrogate, a code
 * point above U+10FFFF) becomes \ufffd (the replacement character). So the output is valid JSON and
 * valid UTF-8 (in fact ASCII plus the input's own well-formed sequences) whatever the input; what
 * is lost is only the value of bytes that had no meaning as text. */
void gg__json_string(const char *s, gg__json_sink_fn put, void *ctx);
/* The same to a stdio stream. */
void gg__json_fputs(FILE *f, const char *s);

#endif
