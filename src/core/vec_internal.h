/* vec_internal.h — vec.c's growing array: the one place that doubles a buffer's capacity. */
#ifndef GG_VEC_INTERNAL_H
#define GG_VEC_INTERNAL_H

#include <stddef.h>

/* Makes room for at least `need` elements of `elem` bytes in items (which holds *cap of them; may
 * be NULL): doubles the capacity (from 8) until it fits. Returns the array to use from now on
 * (items itself when it was big enough) and updates *cap; NULL when out of memory or the size
 * overflows, and then items and *cap are unchanged (the caller reports and still owns items). */
void *gg__vec_reserve(void *items, size_t *cap, size_t need, size_t elem);

#endif
