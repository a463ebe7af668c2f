/* vec.c — the growing array behind every list the library builds up (cleanups, process sets,
 * teardown targets, report rows). */
#include <stdint.h>
#include <stdlib.h>

#include "core/vec_internal.h"

void *gg__vec_reserve(void *items, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return items;
  size_t n = *cap ? *cap : 8;
  while (n < need) {
    if (n > SIZE_MAX / 2) return NULL;
    n *= 2;
  }
  if (elem && n > SIZE_MAX / elem) return NULL;
  void *grown = realloc(items, n * elem);
  if (!grown) return NULL;
  *cap = n;
  return grown;
}
