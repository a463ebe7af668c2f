/* clock_internal.h — the one clock reading of the library and of the command line (tools/ include
 * it: it holds no library state and needs nothing but <time.h>). */
#ifndef GG_CLOCK_INTERNAL_H
#define GG_CLOCK_INTERNAL_H

#include <time.h>

/* Milliseconds on `clock` (CLOCK_MONOTONIC for intervals and deadlines, CLOCK_REALTIME for stamps).
 * */
static inline double gg__clock_ms(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Monotonic milliseconds: what deadlines and waits measure. */
static inline double gg__now_ms(void) { return gg__clock_ms(CLOCK_MONOTONIC); }

#endif
