/* options.c — parsing of GPUGUARD_* environment values and string options, with clear errors. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/internal.h"

/* Values are read where they are needed (object creation, never the allocation path), so a test can
 * change the environment between objects and nothing global needs resetting. */
const char *gg__env(const char *name) {
  const char *v = getenv(name);
  return (v && *v) ? v : NULL;
}

int gg__parse_size(const char *what, const char *text, size_t *out) {
  if (!text) return gg__err(GG_EINVAL, "%s: no value", what);
  const char *p = text;
  while (isspace((unsigned char)*p)) p++;
  if (!isdigit((unsigned char)*p))
    return gg__err(GG_EINVAL, "%s='%s': not a size (bytes, optionally with K, M, G or T)", what,
                   text);
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(p, &end, 10);
  if (errno == ERANGE) return gg__err(GG_EINVAL, "%s='%s': too large", what, text);
  unsigned shift = 0;
  switch (toupper((unsigned char)*end)) {
  case 'K':
    shift = 10;
    end++;
    break;
  case 'M':
    shift = 20;
    end++;
    break;
  case 'G':
    shift = 30;
    end++;
    break;
  case 'T':
    shift = 40;
    end++;
    break;
  default: break;
  }
  if (shift && (*end == 'i' || *end == 'I')) end++; /* accept KiB-style spelling */
  if (shift && (*end == 'b' || *end == 'B')) end++;
  while (isspace((unsigned char)*end)) end++;
  if (*end != '\0')
    return gg__err(GG_EINVAL, "%s='%s': trailing characters after the size", what, text);
  if (shift && v > (SIZE_MAX >> shift)) return gg__err(GG_EINVAL, "%s='%s': too large", what, text);
  *out = (size_t)(v << shift);
  return 0;
}

int gg__parse_bool(const char *what, const char *text, bool *out) {
  static const char *const yes[] = {"1", "on", "yes", "true"};
  static const char *const no[] = {"0", "off", "no", "false"};
  if (text) {
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
      if (strcasecmp(text, yes[i]) == 0) {
        *out = true;
        return 0;
      }
      if (strcasecmp(text, no[i]) == 0) {
        *out = false;
        return 0;
      }
    }
  }
  return gg__err(GG_EINVAL, "%s='%s': expected 1/0, on/off, yes/no or true/false", what,
                 text ? text : "(null)");
}

int gg__parse_int(const char *what, const char *text, long lo, long hi, long *out) {
  if (!text || !*text) return gg__err(GG_EINVAL, "%s: no value", what);
  errno = 0;
  char *end = NULL;
  long v = strtol(text, &end, 10);
  if (errno == ERANGE || *end != '\0' || end == text)
    return gg__err(GG_EINVAL, "%s='%s': not an integer", what, text);
  if (v < lo || v > hi)
    return gg__err(GG_EINVAL, "%s='%s': must be in %ld..%ld", what, text, lo, hi);
  *out = v;
  return 0;
}
