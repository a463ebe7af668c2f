/* gpuguard/share.h — sharing an arena block with another process: its physical memory exported as
 * POSIX file descriptors, and mapped again on the other side. */
#ifndef GPUGUARD_SHARE_H
#define GPUGUARD_SHARE_H

#include <stddef.h>

#include "gpuguard/arena.h"
#include "gpuguard/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @defgroup gg_share Sharing memory between processes
 *  A block of an arena travels to another process as one file descriptor per physical allocation
 *  under it (descriptors cross processes over a Unix socket with SCM_RIGHTS; that transport is the
 *  caller's). The receiver maps the pieces again, in order, into one range of its own. Once
 *  exported, a descriptor keeps its memory alive by itself: a block freed and trimmed while a
 *  receiver maps it stays valid there. Export and map in batches when a block has many pieces, so
 *  that neither side holds more descriptors than it must.
 *  @{ */

/** One physical allocation under a shared block. */
typedef struct gg_share_piece {
  int fd;      /**< the descriptor: the caller's to send and close */
  size_t size; /**< bytes of the physical allocation (a multiple of the device's granularity) */
} gg_share_piece_t;

/** Exports the physical allocations under [@p ptr, @p ptr + @p size) of a live block, in address
 *  order, from the @p first one on: at most @p cap of them are written to @p pieces.
 *  @param arena the arena that holds the block.
 *  @param ptr the block's address (or any address inside it).
 *  @param size bytes from @p ptr (at least 1).
 *  @param first index of the first piece to export (0 for the first call of a batch).
 *  @param[out] pieces receives min(@p cap, total - @p first) pieces; NULL with @p cap 0 only
 *  counts (on every backend: no descriptor is made then).
 *  @param cap room in @p pieces.
 *  @param[out] total receives the number of pieces under the range.
 *  @param[out] offset receives where @p ptr sits within the first piece (NULL if not needed).
 *  @return 0; GG_ENOTSUP when the memory cannot be exported (allocations the driver made without
 *  shareable handles, or a backend without them); GG_ENOTFOUND when part of the range is not
 *  mapped by the arena; GG_EINVAL for a NULL, destroyed or foreign arena, a NULL @p ptr or
 *  @p total, a size of 0 or @p first beyond the last piece; GG_EIO with the cause when the process
 *  has no descriptor left (EMFILE), the pieces already written this call closed again; GG_ESTATE
 *  after fork or teardown. Thread-safe. */
GG_API int gg_arena_export(gg_arena_t *arena, const void *ptr, size_t size, size_t first,
                           gg_share_piece_t *pieces, size_t cap, size_t *total, size_t *offset);

/** A range of device memory mapped from pieces another process exported. */
typedef struct gg_import gg_import_t;

/** Reserves @p size bytes of address space on @p device for pieces to be mapped with
 *  gg_import_map().
 *  @param[out] imp receives the handle.
 *  @param backend the backend the exporting arena ran on (gg_arena_backend() there: "cuda"), so
 *  that the receiver maps with the same family whatever GPUGUARD_BACKEND says here; NULL picks
 *  the backend as gg_arena_create() does (the environment, else auto).
 *  @param device the device (as the backend numbers it).
 *  @param size the sum of the pieces' sizes.
 *  @return 0; GG_EINVAL for NULL @p imp, a size of 0 or an unknown backend name; GG_ENODEV without
 *  the device; GG_ENOTSUP on a backend that cannot import; GG_EDRIVER or GG_ENOMEM with the
 *  driver's error. */
GG_API int gg_import_open(gg_import_t **imp, const char *backend, int device, size_t size);

/** Maps the next piece (in the order they were exported) after those mapped before. The descriptor
 *  stays the caller's and may be closed as soon as this returns. Once every byte is mapped, the
 *  range is made readable and writable from the device.
 *  @return 0; GG_EINVAL for a NULL handle, a bad descriptor or a piece that overruns the range;
 *  GG_EDRIVER with the driver's error. */
GG_API int gg_import_map(gg_import_t *imp, const gg_share_piece_t *piece);

/** The range's first address, once every piece is mapped; NULL before. */
GG_API void *gg_import_ptr(const gg_import_t *imp);

/** Unmaps and releases the range. NULL is a harmless no-op.
 *  @return 0; GG_EDRIVER when the driver refused (the handle is freed anyway). */
GG_API int gg_import_close(gg_import_t *imp);

/** @} */

#ifdef __cplusplus
}
#endif

#endif
