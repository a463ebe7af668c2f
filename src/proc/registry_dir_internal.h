/* registry_dir_internal.h — registry_dir.c's calls for registry.c: opening the registry's directory
 * and the lock its fork handlers take. */
#ifndef GG_REGISTRY_DIR_INTERNAL_H
#define GG_REGISTRY_DIR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

/* Opens the registry's directory (created 0700 when missing): 0 with *dfd and its path in path,
 * else a GG_E* error (GG_EPERM for one another user could have planted or can reach). */
int gg__reg_open(char *path, size_t cap, int *dfd);

/* Takes (true) or releases (false) the lock of the relative directory's resolution. */
void gg__registry_dir_lock(bool lock);

#endif
