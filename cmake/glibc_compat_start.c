/* glibc_compat_start.c — for the command line built with GPUGUARD_GLIBC_COMPAT: the start file's call
 * of __libc_start_main (renamed gg__libc_start_main in a copy of the toolchain's Scrt1.o, made at build
 * time) goes to the version every glibc has. glibc 2.34+'s Scrt1.o passes no init function and lets
 * libc run the program's constructors; older libcs only run what init runs, so init runs them here
 * (preinit, _init, init arrays), which newer libcs then leave to it. */
#include <stddef.h>

typedef void (*gg__ctor_t)(int, char **, char **);
extern gg__ctor_t __preinit_array_start[] __attribute__((visibility("hidden")));
extern gg__ctor_t __preinit_array_end[] __attribute__((visibility("hidden")));
extern gg__ctor_t __init_array_start[] __attribute__((visibility("hidden")));
extern gg__ctor_t __init_array_end[] __attribute__((visibility("hidden")));
extern void _init(void);

int gg__libc_start_main(int (*main)(int, char **, char **), int argc, char **argv, gg__ctor_t init,
                        void (*fini)(void), void (*rtld_fini)(void), void *stack_end);
int gg__libc_start_old(int (*main)(int, char **, char **), int argc, char **argv, gg__ctor_t init,
                       void (*fini)(void), void (*rtld_fini)(void), void *stack_end);
__asm__(".symver gg__libc_start_old,__libc_start_main@GLIBC_2.2.5");

static void gg__run_ctors(int argc, char **argv, char **envp) {
  for (gg__ctor_t *f = __preinit_array_start; f < __preinit_array_end; f++) (*f)(argc, argv, envp);
  _init();
  for (gg__ctor_t *f = __init_array_start; f < __init_array_end; f++) (*f)(argc, argv, envp);
}

int gg__libc_start_main(int (*main)(int, char **, char **), int argc, char **argv, gg__ctor_t init,
                        void (*fini)(void), void (*rtld_fini)(void), void *stack_end) {
  return gg__libc_start_old(main, argc, argv, init ? init : gg__run_ctors, fini, rtld_fini, stack_end);
}
