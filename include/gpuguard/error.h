/* gpuguard/error.h — status codes, their names and texts, and this thread's detail message. */
#ifndef GPUGUARD_ERROR_H
#define GPUGUARD_ERROR_H

#include <stddef.h>

#include "gpuguard/export.h"

/** @defgroup gg_errors Errors and version
 *  Every call returns 0 or a negative GG_E* code; gg_last_error() says what failed.
 *  @{ */

/** The one table of status codes: name, value, text. It expands into the enum, gg_strerror() and
 *  gg_err_name(), so the three can never disagree. */
#define GG_ERRORS(X)                            \
  X(OK, 0, "success")                           \
  X(EINVAL, -1, "invalid argument")             \
  X(ENOMEM, -2, "out of device memory")         \
  X(ENODEV, -3, "no usable device")             \
  X(EDRIVER, -4, "driver error")                \
  X(ESTATE, -5, "call not valid in this state") \
  X(EPERM, -6, "operation not permitted")       \
  X(ENOTFOUND, -7, "not found")                 \
  X(ETIMEDOUT, -8, "timed out")                 \
  X(ENOTSUP, -9, "not supported")               \
  X(EIO, -10, "input/output error")

/** Status codes returned by every gpuguard call (0 is success). */
enum gg_status {
#define GG__ERR_ENUM(name, value, text) GG_##name = (value),
  GG_ERRORS(GG__ERR_ENUM)
#undef GG__ERR_ENUM
};

GG_BEGIN_DECLS

/** A short English text for a status code, e.g. "invalid argument".
 *  @param code a GG_E* code (or any int).
 *  @return a static string, never NULL; "unknown error" for codes not in the table.
 *  Thread-safe and async-signal-safe. */
GG_API const char *gg_strerror(int code);

/** The symbolic name of a status code, e.g. "GG_EINVAL".
 *  @param code a GG_E* code (or any int).
 *  @return a static string, never NULL; "GG_UNKNOWN" for codes not in the table.
 *  Thread-safe and async-signal-safe. */
GG_API const char *gg_err_name(int code);

/** The detail of this thread's last failed gpuguard call: which call, which argument, and for
 *  driver failures the driver's error name and text.
 *  @return a thread-local string, "" when no call on this thread has failed yet. It stays valid
 *  until the next failing call on the same thread. Successful calls leave it unchanged (like
 *  errno). */
GG_API const char *gg_last_error(void);

/** The raw driver status (a CUresult) of this thread's last failed driver call, 0 if none. */
GG_API int gg_last_driver_error(void);

/** Forgets this thread's detail message and driver status, so that gg_last_error() returns "". */
GG_API void gg_clear_error(void);

/** The library's version as "MAJOR.MINOR.PATCH" (compare with GG_VERSION_STRING from
 *  gpuguard/version.h to detect a header/library mismatch). Never NULL. */
GG_API const char *gg_version(void);

GG_END_DECLS

/** @} */
#endif
