/* symbol.c — a return address as a name, for the reports that print allocation sites (the guard's
 * leak report, gg_arena_report): "function+0xoff (object)", or "object+0xoff" where no symbol is
 * exported. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "core/symbol_internal.h"

void gg__site_name(const void *pc, char *out, size_t cap) {
  Dl_info info;
  memset(&info, 0, sizeof info);
  /* A return address may lie just past its function (a call that does not return): look up pc - 1.
   * */
  if (!pc || !dladdr((const char *)pc - 1, &info)) {
    snprintf(out, cap, "%p", pc);
    return;
  }
  const char *file = info.dli_fname ? strrchr(info.dli_fname, '/') : NULL;
  file = file ? file + 1 : info.dli_fname ? info.dli_fname : "?";
  if (info.dli_sname)
    snprintf(out, cap, "%s+%#tx (%s)", info.dli_sname,
             (const char *)pc - (const char *)info.dli_saddr, file);
  else
    snprintf(out, cap, "%s+%#tx", file, (const char *)pc - (const char *)info.dli_fbase);
}
