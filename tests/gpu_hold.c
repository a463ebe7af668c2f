/* gpu_hold.c — a helper for test_gpu_proc: holds device memory through the cuda backend, the way a
 * trainer or worker does.
 *   gpu_hold hold MiB               map MiB, touch it, print "ready", sleep
 *   gpu_hold fork MiB close|keep    the same, then fork a child that does not use CUDA and lives on
 *                                   (closing its inherited /dev/nvidia* descriptors, or keeping
 * them);
 *                                   prints "ready <child pid>"
 *   gpu_hold spawn4 MiB             spawns four `gpu_hold hold MiB` children through gg_proc_spawn
 * (death
 *                                   signal armed), prints "ready <pid> <pid> <pid> <pid>" once all
 * hold
 *   gpu_hold killwatch PID DEV MIB  SIGKILLs PID, then polls NVML (opened once, every 1 ms) until
 * device
 *                                   DEV lists no compute process and has at least MIB MiB free;
 * prints
 *                                   "gone <ms to no process> <ms to memory back>" (nvidia-smi
 * itself
 *                                   takes tens of ms per call: too coarse for this) */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpuguard/gpuguard.h"

static void die(const char *what) {
  fprintf(stderr, "gpu_hold: %s: %s\n", what, gg_last_error());
  exit(2);
}

static gg_arena_t *hold(size_t mib) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "cuda";
  gg_arena_t *a = NULL;
  void *p = NULL;
  if (gg_arena_create(&a, &o) != 0) die("arena");
  if (gg_alloc(a, mib << 20, &p) != 0) die("alloc");
  if (gg_arena_memset(a, p, 1, mib << 20) != 0) die("memset");
  return a;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* The NVML calls killwatch needs, loaded at run time as the library does (the toolkit has no
 * nvml.h). */
static int killwatch(pid_t victim, unsigned dev, unsigned long long want_free_mib) {
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!lib) return fprintf(stderr, "gpu_hold: no NVML\n"), 2;
  int (*init)(void), (*handle)(unsigned, void **), (*procs)(void *, unsigned *, void *),
      (*mem)(void *, void *);
  void *s[4] = {dlsym(lib, "nvmlInit_v2"), dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"),
                dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"),
                dlsym(lib, "nvmlDeviceGetMemoryInfo")};
  if (!s[2]) s[2] = dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2");
  for (int i = 0; i < 4; i++)
    if (!s[i]) return fprintf(stderr, "gpu_hold: NVML lacks a call\n"), 2;
  memcpy(&init, &s[0], sizeof s[0]);
  memcpy(&handle, &s[1], sizeof s[1]);
  memcpy(&procs, &s[2], sizeof s[2]);
  memcpy(&mem, &s[3], sizeof s[3]);
  void *h = NULL;
  if (init() != 0 || handle(dev, &h) != 0)
    return fprintf(stderr, "gpu_hold: NVML init/device\n"), 2;
  double t0 = now_ms(), t_apps = -1, t_mem = -1;
  if (kill(victim, SIGKILL) != 0) return perror("gpu_hold: kill"), 2;
  while ((t_apps < 0 || t_mem < 0) && now_ms() - t0 < 10000) {
    unsigned n = 0;
    unsigned long long m[3] = {0}; /* nvmlMemory_t: total, free, used */
    int r = procs(h, &n, NULL);    /* with no buffer: 0 when none, INSUFFICIENT_SIZE otherwise */
    if (t_apps < 0 && r == 0 && n == 0) t_apps = now_ms() - t0;
    if (t_mem < 0 && mem(h, m) == 0 && m[1] >> 20 >= want_free_mib) t_mem = now_ms() - t0;
    usleep(1000);
  }
  printf("gone %.1f %.1f\n", t_apps, t_mem);
  return t_apps < 0 || t_mem < 0;
}

int main(int argc, char **argv) {
  if (argc >= 5 && !strcmp(argv[1], "killwatch"))
    return killwatch((pid_t)atoi(argv[2]), (unsigned)atoi(argv[3]), strtoull(argv[4], NULL, 10));
  if (argc < 3) return fprintf(stderr, "usage: see the first comment of gpu_hold.c\n"), 2;
  size_t mib = strtoul(argv[2], NULL, 10);
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!strcmp(argv[1], "hold")) {
    hold(mib);
    printf("ready\n");
  } else if (!strcmp(argv[1], "fork") && argc > 3) {
    hold(mib);
    pid_t c = fork();
    if (c == 0) {
      if (!strcmp(argv[3], "close")) gg_proc_close_device_fds();
      for (;;) pause(); /* no CUDA here, and no death signal: it outlives its parent */
    }
    printf("ready %d\n", (int)c);
  } else if (!strcmp(argv[1], "spawn4")) {
    int fds[2];
    if (pipe(fds) != 0) return 2;
    char out[16];
    snprintf(out, sizeof out, "%d", fds[1]);
    pid_t kids[4];
    gg_spawn_options_t so;
    gg_spawn_options_init(&so);
    so.stdout_fd = fds[1];
    for (int i = 0; i < 4; i++) {
      const char *av[] = {argv[0], "hold", argv[2], NULL};
      if (gg_proc_spawn(NULL, av, &so, &kids[i]) != 0) die("spawn");
    }
    char buf[64];
    for (int got = 0; got < 4;) { /* each child says "ready\n" once it holds its memory */
      ssize_t n = read(fds[0], buf, sizeof buf);
      if (n <= 0) die("children");
      for (ssize_t i = 0; i < n; i++) got += buf[i] == '\n';
    }
    printf("ready %d %d %d %d\n", (int)kids[0], (int)kids[1], (int)kids[2], (int)kids[3]);
  } else {
    return fprintf(stderr, "gpu_hold: unknown mode '%s'\n", argv[1]), 2;
  }
  for (;;) pause();
}
