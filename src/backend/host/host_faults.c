/* host_faults.c — the host backend's simulated device state and its deterministic fault injection
 * (gg_host_fault_set, gg_host_op_count): what every operation of host.c and host_stream.c counts
 * and may fail through gg__op(). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/host/host_impl.h"
#include "core/internal.h"
#include "gpuguard/host.h"

/* The simulated device's state (host_impl.h). */
struct gg__host_dev gg__host = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const char *const gg__op_names[GG__OP_COUNT] = {
#define GG__OP_NAME(n) #n,
    GG__HOST_OPS(GG__OP_NAME)
#undef GG__OP_NAME
};

static bool gg__any_armed(const gg__fault_t f[GG__OP_COUNT]) {
  for (int i = 0; i < GG__OP_COUNT; i++)
    if (f[i].nth) return true;
  return false;
}

static int gg__op_index(const char *name, size_t len) {
  for (int i = 0; i < GG__OP_COUNT; i++)
    if (strlen(gg__op_names[i]) == len && strncmp(gg__op_names[i], name, len) == 0) return i;
  return -1;
}

/* Parses a fault spec into out[]; on error nothing is changed by the caller. */
int gg__host_fault_parse(const char *what, const char *spec, gg__fault_t out[GG__OP_COUNT]) {
  memset(out, 0, sizeof(gg__fault_t) * GG__OP_COUNT);
  const char *p = spec ? spec : "";
  while (*p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char item[64];
    if (len == 0 || len >= sizeof item)
      return gg__err(GG_EINVAL, "%s='%s': empty or overlong item", what, spec);
    memcpy(item, p, len);
    item[len] = '\0';
    char *colon = strchr(item, ':');
    int op = colon ? gg__op_index(item, (size_t)(colon - item)) : -1;
    if (op < 0)
      return gg__err(GG_EINVAL, "%s='%s': '%s' does not start with a known operation and ':'", what,
                     spec, item);
    gg__fault_t f = {.code = GG_EDRIVER};
    char *eq = strchr(colon, '=');
    if (eq) {
      if (strcmp(eq, "=nomem") != 0)
        return gg__err(GG_EINVAL, "%s='%s': '%s' (only '=nomem' may follow the count)", what, spec,
                       eq);
      f.code = GG_ENOMEM;
      *eq = '\0';
    }
    const char *n = colon + 1;
    size_t nlen = strlen(n);
    if (strcmp(n, "*") == 0) {
      f.nth = 1;
      f.sticky = true;
    } else {
      if (nlen && n[nlen - 1] == '+') {
        f.sticky = true;
        colon[nlen] = '\0';
      }
      long v;
      if (*n < '0' || *n > '9' ||
          gg__parse_int(what, n, 1, 1000000000L, &v) < 0) /* digits only: no ' 3' */
        return gg__err(GG_EINVAL, "%s='%s': '%s' needs a call number >= 1, 'N+' or '*'", what, spec,
                       item);
      f.nth = (unsigned long long)v;
    }
    out[op] = f;
    if (end && !end[1]) return gg__err(GG_EINVAL, "%s='%s': a trailing ','", what, spec);
    p = end ? end + 1 : p + len;
  }
  return 0;
}

void gg__host_faults_arm_locked(const gg__fault_t faults[GG__OP_COUNT]) {
  memcpy(gg__host.faults, faults, sizeof gg__host.faults);
  for (int i = 0; i < GG__OP_COUNT; i++) atomic_store(&gg__host.calls[i], 0);
  atomic_store(&gg__host.armed, gg__any_armed(faults));
}

int gg_host_fault_set(const char *spec) {
  gg__fault_t parsed[GG__OP_COUNT];
  int rc = gg__host_fault_parse("gg_host_fault_set", spec, parsed);
  if (rc < 0) return rc;
  pthread_mutex_lock(&gg__host.lock);
  gg__host_faults_arm_locked(parsed);
  pthread_mutex_unlock(&gg__host.lock);
  return 0;
}

unsigned long long gg_host_op_count(const char *op) {
  int i = op ? gg__op_index(op, strlen(op)) : -1;
  return i < 0 ? 0 : atomic_load(&gg__host.calls[i]);
}

/* Counts the call and fails it when a fault is armed for it. */
int gg__op(enum gg__host_op op) {
  unsigned long long n = atomic_fetch_add(&gg__host.calls[op], 1) + 1;
  if (!atomic_load(&gg__host.armed))
    return 0; /* no lock on the common path: threads call in together */
  pthread_mutex_lock(&gg__host.lock);
  gg__fault_t f = gg__host.faults[op];
  pthread_mutex_unlock(&gg__host.lock);
  if (f.nth && (n == f.nth || (f.sticky && n > f.nth)))
    return gg__err(f.code, "host backend: injected fault in '%s' (call %llu)", gg__op_names[op], n);
  return 0;
}
