/* glibc_compat.h — force-included (-include) into the wheel's library and command line when
 * GPUGUARD_GLIBC_COMPAT is on: binds each libc call to the oldest symbol version that has it, so a
 * binary linked on a new glibc (2.34+ moved pthread and dl functions into libc.so.6 under new versions;
 * 2.33 made stat a function) loads on glibc 2.17 and later: the manylinux_2_28 floor PyTorch has, RHEL 8,
 * Ubuntu 20.04. The same functions under their old versions live in libpthread.so.0 and libdl.so.2 on
 * old systems, so the binaries also link those two (stubs on new glibc). x86_64 only. */
#ifndef GG_GLIBC_COMPAT_H
#define GG_GLIBC_COMPAT_H
#if defined(__x86_64__) && defined(__linux__) && !defined(__ASSEMBLER__)

#define GG__OLD(fn, ver) __asm__(".symver " #fn "," #fn "@" ver)
/* pthread: versions from before 2.34 (libpthread.so.0 on old glibc) */
GG__OLD(pthread_create, "GLIBC_2.2.5");
GG__OLD(pthread_detach, "GLIBC_2.2.5");
GG__OLD(pthread_join, "GLIBC_2.2.5");
GG__OLD(pthread_once, "GLIBC_2.2.5");
GG__OLD(pthread_key_create, "GLIBC_2.2.5");
GG__OLD(pthread_key_delete, "GLIBC_2.2.5");
GG__OLD(pthread_setspecific, "GLIBC_2.2.5");
GG__OLD(pthread_getspecific, "GLIBC_2.2.5");
GG__OLD(pthread_sigmask, "GLIBC_2.2.5");
GG__OLD(pthread_atfork, "GLIBC_2.2.5");
GG__OLD(pthread_condattr_setclock, "GLIBC_2.3.3");
GG__OLD(pthread_mutexattr_init, "GLIBC_2.2.5");
GG__OLD(pthread_mutexattr_settype, "GLIBC_2.2.5");
GG__OLD(pthread_mutexattr_destroy, "GLIBC_2.2.5");
GG__OLD(pthread_kill, "GLIBC_2.2.5");
/* dl: libdl.so.2 on old glibc */
GG__OLD(dlopen, "GLIBC_2.2.5");
GG__OLD(dlsym, "GLIBC_2.2.5");
GG__OLD(dlclose, "GLIBC_2.2.5");
GG__OLD(dlerror, "GLIBC_2.2.5");
GG__OLD(dladdr, "GLIBC_2.2.5");
#undef GG__OLD

#ifdef __cplusplus
/* libstdc++ of GCC 11 and later reads glibc 2.32's __libc_single_threaded (where <sys/single_threaded.h>
 * exists) to skip atomics: a stand-in of our own that never says "single-threaded" keeps them. */
#define __libc_single_threaded gg__libc_single_threaded
extern "C" {
inline char gg__libc_single_threaded = 0;
}
#endif

/* stat, fstat, lstat, fstatat: functions since 2.33; before, inline wrappers of __xstat and friends (version
 * argument 1 on x86_64), which every glibc still exports. After <sys/stat.h>, so its declarations stay
 * as they are; `struct stat` is no call, and the macros leave it alone. */
#include <sys/stat.h>
#ifdef __cplusplus
extern "C" { /* glibc's own C symbols, also when included into C++ (the PyTorch backend) */
#endif
extern int __xstat(int ver, const char *path, struct stat *buf);
extern int __lxstat(int ver, const char *path, struct stat *buf);
extern int __fxstat(int ver, int fd, struct stat *buf);
extern int __fxstatat(int ver, int dirfd, const char *path, struct stat *buf, int flag);
#ifdef __cplusplus
}
#endif
static inline int gg__compat_stat(const char *path, struct stat *buf) { return __xstat(1, path, buf); }
static inline int gg__compat_lstat(const char *path, struct stat *buf) { return __lxstat(1, path, buf); }
static inline int gg__compat_fstat(int fd, struct stat *buf) { return __fxstat(1, fd, buf); }
#define stat(path, buf)  gg__compat_stat(path, buf)
#define lstat(path, buf) gg__compat_lstat(path, buf)
static inline int gg__compat_fstatat(int dirfd, const char *path, struct stat *buf, int flag) {
  return __fxstatat(1, dirfd, path, buf, flag);
}
#define fstat(fd, buf)   gg__compat_fstat(fd, buf)
#define fstatat(dirfd, path, buf, flag) gg__compat_fstatat(dirfd, path, buf, flag)

#endif
#endif
