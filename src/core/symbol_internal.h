/* symbol_internal.h — symbol.c's call: naming a return address for a report. */
#ifndef GG_SYMBOL_INTERNAL_H
#define GG_SYMBOL_INTERNAL_H

#include <stddef.h>

/* A return address as "function+0xoff (object)" (or "object+0xoff" where no symbol is exported),
 * for reports of allocation sites (arena_sites.c records them). */
void gg__site_name(const void *pc, char *out, size_t cap);

#endif
