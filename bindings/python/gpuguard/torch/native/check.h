/* check.h (gpuguard.torch) — GG_CHECK: a failed check throws c10::Error, as TORCH_CHECK does.
 * TORCH_CHECK's failure path (c10::detail::torchCheckFail, in libc10) took the process down when it
 * ran from this library on the H200 (torch 2.11: a segfault instead of the exception), while an
 * exception this library throws itself reaches PyTorch's handlers. */
#ifndef GG_TORCH_CHECK_H
#define GG_TORCH_CHECK_H

#include <c10/util/Exception.h>

#define GG_CHECK(cond, ...)                            \
  do {                                                 \
    if (C10_UNLIKELY(!(cond))) {                       \
      C10_THROW_ERROR(Error, ::c10::str(__VA_ARGS__)); \
    }                                                  \
  } while (0)

#endif
