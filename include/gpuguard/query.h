/* gpuguard/query.h — what the devices are and how much memory they have free. */
#ifndef GPUGUARD_QUERY_H
#define GPUGUARD_QUERY_H

#include <stddef.h>

#include "gpuguard/export.h"
#include "gpuguard/proc.h"

/** @defgroup gg_query Query
 *  Devices and their memory, as the driver reports them. The backend is chosen as everywhere else:
 *  GPUGUARD_BACKEND=auto|cuda|host (auto: CUDA when a usable device exists, else the host backend).
 *  @{ */

/** One device, as gg_device_info() reports it. */
typedef struct gg_device_info {
  int index;          /**< the device ordinal, as CUDA numbers it */
  char backend[8];    /**< "cuda" or "host" */
  char name[256];     /**< e.g. "NVIDIA H200" */
  char uuid[48];      /**< "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it */
  size_t total_bytes; /**< device memory size */
  size_t free_bytes;  /**< free device memory, as the driver reports it now */
  size_t used_bytes;  /**< total_bytes - free_bytes */
  int cc_major;       /**< compute capability, major (0 on the host backend) */
  int cc_minor;       /**< compute capability, minor */
  int driver_version; /**< CUDA driver version, e.g. 13000 (0 on the host backend) */
  int vmm_supported;  /**< 1 when the device supports virtual memory management */
  int simulated;      /**< 1 for a simulated device (the host backend's), no GPU of this machine;
                           0 for a real one. Appended in 0.2 */
} gg_device_info_t;

/** How a process holding a device relates to gpuguard's sessions. */
typedef enum gg_process_class {
  GG_PROCESS_UNKNOWN = 0,   /**< holds device memory; nothing more is known */
  GG_PROCESS_GUARDED = 1,   /**< part of a live gpuguard session */
  GG_PROCESS_ORPHAN = 2,    /**< its session's leader is dead, or its parent is gone and it was a
                                 worker */
  GG_PROCESS_FD_HOLDER = 3, /**< holds /dev/nvidia* descriptors but no context the driver lists */
  GG_PROCESS_FOREIGN = 4,   /**< belongs to another user (and nothing more is known) */
  GG_PROCESS_STRANDED = 5,  /**< a worker no gpuguard session knows whose parent is gone: a
                                 multiprocessing or DataLoader worker, a torch.distributed rank
                                 whose launcher died, a joblib or Ray worker; `gpuguard reap` ends
                                 it */
  GG_PROCESS_DETACHED = 6   /**< a main program whose parent went away on purpose (nohup, setsid,
                                 tmux or screen, a systemd service, a container's PID 1), or one
                                 whose parent is gone with no sign of being a worker; never reaped
                                 unless named */
} gg_process_class_t;

/** One process holding a device, as gg_process_list() reports it. */
typedef struct gg_process {
  int pid;                       /**< process id (as this machine's /proc numbers it) */
  int ppid;                      /**< parent process id */
  unsigned uid;                  /**< real user id */
  char user[32];                 /**< user name, or the uid in decimal */
  char state;                    /**< /proc state letter: R, S, D, Z, T, ... ('?' when
                                      unreadable) */
  unsigned long long start_time; /**< clock ticks after boot; with pid, names the process */
  long long used_bytes;          /**< device memory the driver accounts to it; -1 when unknown */
  int device;                    /**< the device ordinal asked for */
  gg_process_class_t cls;        /**< see gg_process_class_t */
  char session[40];              /**< gpuguard session id, "" when none */
  char command[256];             /**< command line, arguments separated by spaces (cut to fit) */
  char why[192];                 /**< the evidence for `cls`, in words ("multiprocessing spawn
                                      child; parent 812 is gone (reparented to init)"); "" when
                                      none. Appended in 0.2 */
} gg_process_t;

/** Utilisation, temperature and power of one device, as gg_device_telemetry() reports them (NVML's
 *  readings, as nvidia-smi shows them). A reading the device does not offer is -1. */
typedef struct gg_device_telemetry {
  int index;                /**< the device ordinal asked for */
  int utilization_gpu;      /**< percent of the last sample period in which a kernel ran; -1
                                 unknown */
  int utilization_memory;   /**< percent of that period in which device memory was read or
                                 written */
  int temperature_c;        /**< GPU core temperature, degrees Celsius; -1 unknown */
  double power_watts;       /**< power draw now, watts; -1 unknown */
  double power_limit_watts; /**< the enforced power limit, watts; -1 unknown */
} gg_device_telemetry_t;

GG_BEGIN_DECLS

/** The name of a process class: "unknown", "guarded", "orphan", "fd-holder", "foreign", "stranded",
 *  "detached". Never NULL. */
GG_API const char *gg_process_class_name(gg_process_class_t cls);

/** Number of devices on the selected backend (the host backend has one).
 *  @param[out] count receives the number.
 *  @return 0; GG_EINVAL for NULL or a bad GPUGUARD_BACKEND; GG_ENODEV when GPUGUARD_BACKEND=cuda
 *  and the driver cannot be loaded. Thread-safe. */
GG_API int gg_device_count(int *count);

/** Describes one device, including its free memory now. Reading free memory needs the device's
 *  primary context, which this call retains and releases (it does not create one that stays).
 *  @param device the ordinal, 0 .. gg_device_count()-1.
 *  @param[out] info filled on success.
 *  @return 0; GG_EINVAL for NULL; GG_ENODEV for a device that does not exist or no driver;
 *  GG_EDRIVER when the driver fails (gg_last_error() names the call). Thread-safe. */
GG_API int gg_device_info(int device, gg_device_info_t *info);

/** Reads utilisation, temperature and power of device @p device from NVML (loaded for the call,
 *  shut down after it; GPUGUARD_NVML_LIBRARY names another file). The device is found by its UUID
 *  when the CUDA driver is there, else by NVML's index, as gg_process_list() does. Creates no CUDA
 *  context.
 *  @param device the device ordinal.
 *  @param[out] t filled on success; on GG_ENOTSUP every reading is -1.
 *  @return 0; GG_EINVAL for NULL; GG_ENODEV for a negative ordinal or one NVML does not know;
 *  GG_ENOTSUP when NVML cannot be loaded (no NVIDIA driver: the host backend has no such readings).
 *  Thread-safe. */
GG_API int gg_device_telemetry(int device, gg_device_telemetry_t *t);

/** Lists the processes holding device @p device: from NVML (libnvidia-ml.so.1, loaded for the call
 *  and shut down after it; GPUGUARD_NVML_LIBRARY names another file), with the memory each holds;
 *  where NVML is missing, from a scan of /proc/PID/fd for /dev/nvidia* (memory unknown). Each row
 *  is joined with /proc (user, state, parent, start time, command) and classified. Outside the
 *  initial PID namespace (in a container) the driver's pids may be the host's: a row is then joined
 *  only when the process of that pid here holds the device open; the others keep the driver's pid
 *  and memory, with state '?' and user "?" (a process outside this namespace, or one whose
 *  descriptors we cannot read).
 *  @param device the device ordinal.
 *  @param[out] rows array of @p cap rows (may be NULL when cap is 0, to ask for the count).
 *  @param cap rows available.
 *  @param[out] count receives the number of processes found, which may exceed cap (only cap are
 *  written).
 *  @return 0; GG_EINVAL for a NULL count (or NULL rows with cap > 0); GG_ENODEV when the device
 *  does not exist, or there is no NVIDIA GPU at all (neither NVML nor the CUDA driver loads);
 *  GG_EDRIVER when NVML fails. Thread-safe. */
GG_API int gg_process_list(int device, gg_process_t *rows, size_t cap, size_t *count);

/** Number of GPUs of this machine, numbered as nvidia-smi numbers them: every GPU the device
 *  family's management library (NVML) reports, whether or not CUDA in this process can see it
 *  (CUDA_VISIBLE_DEVICES, a container given no CUDA); without NVML, the CUDA devices. The
 *  simulated host device is never one. The gg_gpu_*() calls take these numbers.
 *  @param[out] count receives the number.
 *  @return 0; GG_EINVAL for NULL; GG_ENODEV when there is no GPU at all (neither NVML nor the
 *  driver loads); GG_EDRIVER when NVML cannot count its devices. Thread-safe. */
GG_API int gg_gpu_count(int *count);

/** Describes GPU @p gpu (as gg_gpu_count() numbers it): index is that number, name, UUID and memory
 *  as NVML reads them (without a CUDA context). backend is "cuda" when CUDA in this process sees
 *  the GPU (compute capability and driver version are then filled), "nvml" when only NVML does.
 *  @return 0; GG_EINVAL for NULL; GG_ENODEV for a GPU that does not exist (or no GPU at all);
 *  GG_EDRIVER when the GPU cannot be read. Thread-safe. */
GG_API int gg_gpu_info(int gpu, gg_device_info_t *info);

/** gg_process_list() for GPU @p gpu as gg_gpu_count() numbers it: each row's device is @p gpu.
 *  @return as gg_process_list(); GG_EDRIVER when NVML's process query fails (nothing can be said
 *  of the GPU then). Thread-safe. */
GG_API int gg_gpu_processes(int gpu, gg_process_t *rows, size_t cap, size_t *count);

/** gg_device_telemetry() for GPU @p gpu as gg_gpu_count() numbers it (NVML's index).
 *  @return as gg_device_telemetry(); GG_ENODEV for a GPU that does not exist. Thread-safe. */
GG_API int gg_gpu_telemetry(int gpu, gg_device_telemetry_t *t);

/** The GPU that @p id names, as nvidia-smi's -i takes it: its number or its UUID ("GPU-...").
 *  @param id the GPU's number or UUID.
 *  @param[out] gpu receives the number.
 *  @return 0; GG_EINVAL for NULL; GG_ENODEV when no GPU has that number or UUID (the message says
 *  how many there are), or there is no GPU at all. Thread-safe. */
GG_API int gg_gpu_find(const char *id, int *gpu);

/** Lists the caller's own processes that are orphans of dead gpuguard sessions: processes carrying
 *  a session id (GPUGUARD_SESSION, or a registry record) whose leader's registry record is stale
 *  (the leader died without tearing down) — whether they hold device memory or not (used_bytes is
 *  -1 and device -1 for those that do not). Only that proof counts: a session whose leader the
 *  registry never recorded is left alone. Each row carries the start time that names the process,
 *  so that acting on it later can verify the pid still means the same process.
 *  @param[out] rows array of @p cap rows (may be NULL when cap is 0).
 *  @param cap rows available.
 *  @param[out] count receives the number of orphans found (may exceed cap).
 *  @return 0; GG_EINVAL for a NULL count (or NULL rows with cap > 0); GG_EIO when /proc cannot be
 *  read. A machine without a GPU is not an error here. Thread-safe. */
GG_API int gg_orphan_list(gg_process_t *rows, size_t cap, size_t *count);

/** Describes one process as gg_process_list() would (user, state, parent, start time, command,
 *  class and evidence), whether it holds a device or not (used_bytes -1, device -1).
 *  @param pid the process.
 *  @param[out] row filled on success.
 *  @return 0; GG_EINVAL for a NULL row or pid <= 0; GG_ENOTFOUND when no such process can be read.
 *  Thread-safe. */
GG_API int gg_process_describe(int pid, gg_process_t *row);

/* GG_REAP_ALL_USERS, the flag of gg_reap_list() and gg_reap(), is proc.h's: gg_reap() is. */

/** Lists what `gpuguard reap` ends: the caller's orphans of dead sessions (as gg_orphan_list()) and
 *  the processes holding a GPU (as gg_gpu_processes() finds them, on every GPU NVML reports, each
 *  row's device in that numbering) classified GG_PROCESS_STRANDED or GG_PROCESS_ORPHAN; with
 *  GG_REAP_ALL_USERS, those of every user. Each row carries the start time to verify before acting,
 *  and its evidence in `why`.
 *  @param flags 0 or GG_REAP_ALL_USERS.
 *  @param[out] rows array of @p cap rows (may be NULL when cap is 0).
 *  @param cap rows available.
 *  @param[out] count receives the number found (may exceed cap).
 *  @return 0; GG_EINVAL for a NULL count, NULL rows with cap > 0 or unknown flags; GG_EPERM for
 *  GG_REAP_ALL_USERS when not root; GG_EIO when /proc cannot be read. No GPU is not an error.
 *  Thread-safe. */
GG_API int gg_reap_list(unsigned flags, gg_process_t *rows, size_t cap, size_t *count);

/** The size in bytes of a public struct, by its type name ("gg_arena_stats_t", "gg_device_info_t",
 *  "gg_arena_options_t", "gg_guard_options_t", "gg_spawn_options_t", "gg_process_t", ...: every
 *  struct type of the public headers): for bindings that lay structs out themselves (the Python
 *  binding's tests check each ctypes struct against it), so a layout mismatch is caught, not
 *  mis-read. Declared here, in the topmost layer's header: only that layer knows every struct.
 *  @param type_name the typedef name.
 *  @return its sizeof in this library; 0 for NULL or a name that is not a public struct.
 *  Thread-safe and async-signal-safe. */
GG_API size_t gg_sizeof(const char *type_name);

GG_END_DECLS

/** @} */
#endif
