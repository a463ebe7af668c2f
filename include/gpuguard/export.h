/* gpuguard/export.h — symbol visibility and C linkage for the public headers. */
#ifndef GPUGUARD_EXPORT_H
#define GPUGUARD_EXPORT_H

/** @file
 *  Marks the library's exported symbols. The library is built with hidden visibility, so only
 *  declarations carrying GG_API are visible in libgpuguard.so. */

#if defined(GG_STATIC) || !defined(__GNUC__)
/** Marks a public, exported declaration. */
#define GG_API
#else
#define GG_API __attribute__((visibility("default"))) /**< Exported from the shared library. */
#endif

#ifdef __cplusplus
/** Opens C linkage in C++ translation units. */
#define GG_BEGIN_DECLS extern "C" {
/** Closes C linkage in C++ translation units. */
#define GG_END_DECLS }
#else
#define GG_BEGIN_DECLS /**< Nothing in C. */
#define GG_END_DECLS   /**< Nothing in C. */
#endif

#endif
