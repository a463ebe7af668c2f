/* host_impl.h — the host backend's private layout, shared by host_faults.c (the device's state and
 * fault injection), host.c (memory, the device) and host_stream.c (simulated streams, events,
 * waits, graph capture): included from src/backend/ alone. */
#ifndef GG_HOST_IMPL_H
#define GG_HOST_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"

/* ---- fault injection ------------------------------------------------------------------------- */

#define GG__HOST_OPS(X) \
  X(open)               \
  X(mem_info)           \
  X(reserve)            \
  X(release)            \
  X(map)                \
  X(unmap)              \
  X(unmap_range)        \
  X(remap)              \
  X(copy)               \
  X(set)                \
  X(event_create)       \
  X(event_record)       \
  X(event_query)        \
  X(event_sync)         \
  X(event_destroy)      \
  X(stream_sync)        \
  X(stream_query)       \
  X(stream_wait)        \
  X(ctx_reset)          \
  X(stream_capture)     \
  X(graph_retain)       \
  X(ctx_sync)

enum gg__host_op {
#define GG__OP_ENUM(n) GG__OP_##n,
  GG__HOST_OPS(GG__OP_ENUM)
#undef GG__OP_ENUM
      GG__OP_COUNT
};

typedef struct gg__fault {
  unsigned long long nth; /* 0: not armed */
  bool sticky;            /* fail the nth call and every later one */
  int code;
} gg__fault_t;

/* The simulated device is process-wide, like a real one. Everything here is reset when the device
 * goes from no open handle to one (env re-read) or by gg_host_fault_set (faults and counters). */
struct gg__host_dev {
  pthread_mutex_t lock;
  int opens;
  size_t capacity, granularity, used;
  bool vmm;
  bool populate; /* commit pages at map time (resident memory grows), as cuMemCreate does */
  bool busy;     /* every stream always has work queued: queries say busy, waits return at once */
  bool range_unmap; /* one unmap may span several mappings (GPUGUARD_HOST_RANGE_UNMAP) */
  gg__fault_t faults[GG__OP_COUNT];
  _Atomic unsigned long long calls[GG__OP_COUNT];
  atomic_bool
      armed; /* some fault is armed: only then does an operation read the table under the lock */
};
extern struct gg__host_dev gg__host;

/* Counts a call of op and fails it when a fault is armed for that call: 0 or the injected code. */
int gg__op(enum gg__host_op op);
/* A fault spec (`OP:N`, `OP:N+`, `OP:*`, each `=nomem` optionally, comma-separated) into out[];
 * GG_EINVAL naming `what` and the bad part. */
int gg__host_fault_parse(const char *what, const char *spec, gg__fault_t out[GG__OP_COUNT]);
/* Arms faults[] and resets every operation counter; gg__host.lock held. */
void gg__host_faults_arm_locked(const gg__fault_t faults[GG__OP_COUNT]);

/* ---- host_stream.c: the ops of streams, events, capture and waits (host.c's ops table) ----------
 */

int gg__h_event_create(gg__dev_t *d, void **ev);
int gg__h_event_record(gg__dev_t *d, void *ev, void *stream);
int gg__h_event_query(gg__dev_t *d, void *ev);
int gg__h_event_sync(gg__dev_t *d, void *ev);
int gg__h_event_destroy(gg__dev_t *d, void *ev);
int gg__h_stream_sync(gg__dev_t *d, void *stream);
int gg__h_stream_query(gg__dev_t *d, void *stream);
int gg__h_stream_wait(gg__dev_t *d, void *stream, void *ev);
int gg__h_stream_check(gg__dev_t *d, void *stream, const char *op);
int gg__h_stream_capture(gg__dev_t *d, void *stream, unsigned long long *capture_id);
int gg__h_graph_retain(gg__dev_t *d, void *stream, void (*destroy)(void *user), void *user);
int gg__h_ctx_sync(gg__dev_t *d, int timeout_ms);
/* At the device's configuration (its first open): no event outstanding, and a held stream destroyed
 * unreleased no longer blocks the default stream. */
void gg__hstreams_reset(void);
/* The live-stream table's lock around fork(), taken after the device's (host.c's fork handlers). */
void gg__hstreams_fork_lock(void);
void gg__hstreams_fork_unlock(void);

#endif
