/* cmd_plot.c — `gpuguard plot`: a memory timeline drawn as HTML by the Python package, run from
 * here. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_internal.h"

/* The chart is drawn by the Python package (gpuguard.diagnostics.plot): one renderer for timelines
 * recorded by gpuguard.record() and by `watch --record`. Says clearly what is missing when Python
 * or the package is. */
int cmd_plot(int argc, char **argv) {
  if (argc < 2) return bad_usage("%s", "no timeline given (gpuguard plot FILE -o memory.html)");
  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout, current);
      return 0;
    }
  /* The package loads the C library: the one this command runs on, unless the caller chose
   * another. */
  Dl_info info;
  const char *(*fn)(void) = gg_version;
  void *addr;
  memcpy(&addr, &fn, sizeof addr); /* ISO C's way from a function pointer to an address */
  if (!getenv("GPUGUARD_LIBRARY") && dladdr(addr, &info) && info.dli_fname)
    setenv("GPUGUARD_LIBRARY", info.dli_fname, 1);
  /* `python3 -c` puts the current directory ('') first on sys.path, so a gpuguard/ package
   * planted where the user stands (a shared /tmp, a downloaded tree) would run, as root too.
   * PYTHONSAFEPATH (3.11) keeps it off; older interpreters ignore it, so the script drops it
   * itself before importing anything that is not built in. */
  setenv("PYTHONSAFEPATH", "1", 1);
  static const char boot[] = "import sys\n"
                             "if sys.path and sys.path[0] in ('', '.'):\n"
                             "    del sys.path[0]\n"
                             "try:\n"
                             "    from gpuguard.diagnostics.plot import main\n"
                             "except ImportError as e:\n"
                             "    sys.stderr.write('gpuguard plot: the Python package gpuguard "
                             "draws the chart and cannot be '\n"
                             "                     'imported (%s); install it (pip install "
                             "./bindings/python) or set PYTHONPATH\\n' "
                             "% e)\n"
                             "    sys.exit(1)\n"
                             "sys.exit(main(sys.argv[1:]))\n";
  char **args = calloc((size_t)argc + 3, sizeof *args);
  if (!args) {
    fprintf(stderr, "gpuguard plot: out of memory\n");
    return 1;
  }
  /* The interpreter the package was installed into (the wheel's `gpuguard` sets GPUGUARD_PYTHON),
   * else python3 from PATH. */
  const char *py = getenv("GPUGUARD_PYTHON");
  if (!py || !*py) py = "python3";
  args[0] = (char *)py;
  args[1] = "-c";
  args[2] = (char *)boot;
  for (int i = 1; i < argc; i++) args[i + 2] = argv[i];
  fflush(NULL);
  execvp(py, args);
  int err = errno;
  free(args);
  fprintf(stderr,
          "gpuguard plot: cannot run %s (%s): the chart is drawn by the Python package gpuguard\n",
          py, strerror(err));
  return err == ENOENT ? 127 : 126;
}
