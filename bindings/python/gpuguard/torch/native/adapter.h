/* adapter.h (gpuguard.torch) — the torch-free core of gpuguard's PyTorch backend: one block table,
 * one set of statistics per device, the private pools, and the one place that routes an allocation
 * to a pool. Plain C++17 over libgpuguard's public headers; what it needs of the CUDA runtime (is a
 * stream capturing, tie a callback to a graph, wait for a device) comes as function pointers, so it
 * builds and is tested without PyTorch (tests/test_torch_adapter.cpp, on the host backend). The
 * facade (backend.cpp) maps PyTorch's CUDAAllocator methods onto it, a few lines each.
 *
 * Rules kept here, each written once:
 *  - The default pool of a device is one arena (made at first use, or given by use_arena), used in
 *    stream order: gg_alloc_on / gg_free_on, other streams joined on the device.
 *  - A private pool (a CUDA graph's, a MemPool's) owns one NO_STREAM arena per stream it allocates
 *    for (or the arena mem_pool() gave it); its memory goes back once the pool has no use and no
 *    live block, after a device synchronisation, never at once.
 *  - An allocation goes to the newest announced capture whose filter takes its stream; else, while
 *    captures may be under way (one announced, or captures=any), to the private pool of the capture
 *    its stream is in; else to the default pool. A capture nobody announced gets a pool tied to its
 *    graph (graph_retain): released when the graph is destroyed.
 *  - A default-pool block freed while its stream captures is kept for that capture's graph (its
 *    replays read it) and freed in stream order once the graph is gone.
 *  - A MemPool with its own allocator (MemPool(allocator=...)) takes segments of PyTorch's sizes
 *    from it and cuts its blocks from them; a freed block stays cached in its segment, and a
 *    segment goes back whole (empty_cache, or with its pool). The segments count in the device's
 *    reserved figures and, with its arena's mapped bytes, against its limit (memory fraction).
 * Lock order: make_mu_ (making a device's arena), the adapter's lock, then an arena's. */
#ifndef GG_TORCH_ADAPTER_H
#define GG_TORCH_ADAPTER_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

/* gg_arena_stats is a function and a struct tag: fine in C, but g++ -Wshadow says the function
 * "hides the constructor". */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif
#include "gpuguard/arena.h"
#include "gpuguard/error.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* The adapter's table invariants: checked in debug builds (GG_TORCH_DEBUG, which the CMake test
 * sets), compiled out in the backend PyTorch loads. A broken invariant is a bug here: abort. */
#ifdef GG_TORCH_DEBUG
#define GG_TORCH_ASSERT(cond) \
  ((cond) ? (void)0 : ::gg_torch::assert_failed(#cond, __FILE__, __LINE__))
#else
#define GG_TORCH_ASSERT(cond) ((void)0)
#endif

namespace gg_torch {

[[noreturn]] void assert_failed(const char *what, const char *file, int line);

using Stream = void *;

constexpr int kMaxDevices = 64;
/* A device number the adapter has no slot for. */
inline bool bad_device(int device) { return device < 0 || device >= kMaxDevices; }
constexpr size_t kSmallMax = size_t(1) << 20; /* PyTorch's small pool: blocks of at most 1 MiB */
constexpr size_t kQuantum = 256;              /* the arena rounds every block to this */

/* The bytes a request of n takes: 512 at least (PyTorch's smallest block), n rounded to the
 * arena's quantum, or with PyTorch's roundup_power2_divisions (see Adapter::alloc) to the next
 * division step. */
size_t block_bytes(size_t n, size_t divisions);

/* A pool's id as PyTorch names it (MempoolId_t); {0, 0} is the default pool. */
struct PoolId {
  uint64_t first = 0;
  uint64_t second = 0;
  bool operator==(const PoolId &o) const { return first == o.first && second == o.second; }
  bool operator!=(const PoolId &o) const { return !(*this == o); }
  bool operator<(const PoolId &o) const {
    return first < o.first || (first == o.first && second < o.second);
  }
};

/* One figure as PyTorch reports it, field for field (c10::CachingAllocator::Stat). */
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;
  void add(int64_t n) {
    current += n;
    allocated += n;
    peak = current > peak ? current : peak;
  }
  void sub(int64_t n) {
    current -= n;
    freed += n;
    GG_TORCH_ASSERT(current >= 0);
  }
};

enum { kAll = 0, kSmall = 1, kLarge = 2 }; /* PyTorch's StatType order */

/* Every figure PyTorch's memory_stats() reports, per device, with PyTorch's meaning
 * (c10::CachingDeviceAllocator::DeviceStats), as gpuguard's arenas give it:
 *  - allocation, active, allocated_bytes, active_bytes, requested_bytes: PyTorch's blocks, by the
 *    size class of the block (small: at most 1 MiB); written by alloc and free only. A block is
 *    active from its allocation to its free (the arena keeps a freed block from reuse until its
 *    stream is past it, as PyTorch's events do, but that memory is no longer counted as active).
 *  - reserved_bytes, segment: the memory every arena of the device has mapped, and its chunks
 *    (PyTorch's segments); allocated = mapped, freed = given back to the driver. All of it is
 *    counted in the large pool (the arenas have no separate small pool).
 *  - inactive_split, inactive_split_bytes: the free stretches inside mapped ranges that hold a
 *    live block (PyTorch's free blocks split from a segment; a range with no live block can be
 *    given back whole), counted and summed at each read; allocated/freed are the
 *    increases and decreases seen between reads, so current = allocated - freed since a reset.
 *  - oversize_allocations, oversize_segments: 0 (no max_split_size: every block may be split).
 *  - num_sync_all_streams: host waits for a stream the arenas made (to reuse or give back
 *    memory released in stream order), PyTorch's synchronize-and-free-events;
 *  - num_device_alloc, num_device_free: chunks mapped and unmapped (cuMemCreate / cuMemRelease).
 *  - num_alloc_retries: an allocation retried after freeing unused pools; num_ooms: refusals.
 *  - max_split_size: -1 (unlimited, PyTorch's default). */
struct DeviceStats {
  Stat allocation[3], active[3], allocated_bytes[3], active_bytes[3], requested_bytes[3];
  Stat segment[3], inactive_split[3], reserved_bytes[3], inactive_split_bytes[3];
  Stat oversize_allocations, oversize_segments;
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  int64_t num_sync_all_streams = 0;
  int64_t num_device_alloc = 0;
  int64_t num_device_free = 0;
  int64_t max_split_size = -1;
};

/* What the arenas of a device hold, summed (PyTorch's reserved and segment figures). */
struct Reserved {
  int64_t current = 0, peak = 0, freed = 0, segments = 0, maps = 0, unmaps = 0;
  uint64_t waits = 0;
};

/* The runtime calls the core cannot make itself. Every pointer must be set (tests pass stubs). */
struct Runtime {
  /* *id = the id of the capture `stream` is in, 0 when it is not capturing. 0, or <0. */
  int (*capture_id)(Stream stream, uint64_t *id);
  /* Ties done(user) to the graph being captured on `stream`: called once (on any thread) after the
   * graph and every executable graph made from it are destroyed. 0, or <0 (then never called). */
  int (*graph_retain)(Stream stream, void (*done)(void *), void *user);
  int (*stream_sync)(Stream stream);
  int (*device_sync)(int device);
  /* Switches this thread to the relaxed capture mode (begin) and back (end, with what begin saved),
   * around the arena calls a capture must not see as unsafe (reserving and mapping memory). */
  void (*relax)(bool begin, int *saved);
  /* An event recorded now on `stream` of `device` (*event is the caller's until event_destroy).
   * 0, or <0. */
  int (*event_record)(int device, Stream stream, void **event);
  /* 1: the work queued before the event is done; 0: not yet; <0: an error. */
  int (*event_query)(void *event);
  void (*event_destroy)(void *event);
};

/* A block PyTorch holds: the one record of it. What few blocks carry lives apart (Extra), so the
 * table stays dense. */
struct Block {
  struct Extra {
    std::vector<Stream> recorded;  /* Tensor.record_stream */
    uint64_t ipc_id = 0;           /* registered for sharing: forgotten when freed */
    std::shared_ptr<void> context; /* the facade's recorded stack (opaque here) */
  };
  size_t requested = 0;
  size_t size = 0; /* as the arena counts it */
  Stream stream = nullptr;
  struct Pool *pool = nullptr; /* nullptr: the default pool */
  gg_arena_t *arena = nullptr; /* where the memory came from (nullptr: a custom allocator) */
  int device = 0;
  std::unique_ptr<Extra> extra;
  Extra &more();
};

/* A custom allocator a MemPool was made with (MemPool(allocator=...)): its calls, opaque here. */
struct Custom {
  std::function<void *(size_t, Stream)> alloc;
  std::function<void(void *)> free;
  std::shared_ptr<void> owner; /* keeps the allocator alive as long as the pool */
};

/* PyTorch's segment for a request of n bytes (its get_allocation_size): 2 MiB for a block of at
 * most 1 MiB, 20 MiB below 10 MiB, else n rounded up to 2 MiB. A custom allocator's pool asks for
 * memory in these sizes and splits its blocks from them. */
size_t segment_bytes(size_t n);

/* A segment a pool's custom allocator gave (adapter_custom.cpp): blocks are cut from its free
 * ranges, and it goes back to the allocator only whole, at empty_cache or with its pool.
 * Invariants: the free ranges lie inside the segment, never overlap nor touch (coalesced), and
 * live + the free ranges' bytes = size. */
struct Segment {
  size_t size = 0;
  size_t live = 0;                  /* bytes of its live blocks */
  Stream stream = nullptr;          /* its blocks are reused on this stream only, as in PyTorch */
  bool small = false;               /* PyTorch's small pool: blocks of at most 1 MiB */
  std::map<uintptr_t, size_t> free; /* start -> bytes */
  std::shared_ptr<Custom> custom;   /* the allocator that gave it, and takes it back */
};

/* A segment taken from its pool, on its way back to the allocator that gave it. */
struct Spent {
  uintptr_t addr;
  size_t size;
  int device;
  std::shared_ptr<Custom> custom;
};

/* What the custom allocators' segments of a device add to its reserved and segment figures. */
struct SegmentTotals {
  int64_t bytes = 0, count = 0, peak = 0, maps = 0, unmaps = 0, freed = 0;
  int64_t asking = 0; /* bytes asked of an allocator now: already counted against the limit */
};

/* A default-pool block freed while streams it was recorded on (Tensor.record_stream) may still
 * use it: given back to its arena once an event recorded on each of them at the free is done, as
 * PyTorch's allocator does (until then it counts as active, not allocated). */
struct Recorded {
  void *ptr;
  gg_arena_t *arena;
  Stream stream;
  int device;
  size_t size;
  size_t requested;
  std::vector<void *> events;
  std::vector<Stream> on; /* the stream each event was recorded on */
};

/* A default-pool block a capture's graph still reads: freed once the graph is gone. Also a pool's
 * block other streams used (record_stream), freed while a capture is under way: held until that
 * capture ends (`pool`, `size`), as PyTorch's allocator defers it. */
struct Held {
  void *ptr;
  gg_arena_t *arena;
  Stream stream;
  struct Pool *pool = nullptr; /* a pool's block: it still counts in pool->live until freed */
  size_t size = 0;
  std::vector<Stream> recorded; /* a pool's block: the streams joined before it is freed */
};

/* A private pool: CUDA graphs, torch.cuda.MemPool, and captures nobody announced. */
struct Pool {
  PoolId id;
  int device = 0;
  int use_count = 0;
  size_t live = 0;
  bool use_on_oom = false;
  bool implicit = false;          /* made for a capture nobody announced */
  std::atomic<bool> dead{false};  /* implicit: its graph is gone (set by the runtime's thread) */
  gg_arena_t *given = nullptr;    /* mem_pool(arena): the user's arena serves it */
  std::shared_ptr<Custom> custom; /* MemPool(allocator=...) */
  std::map<uintptr_t, Segment> segments; /* custom: what its allocator gave, by address */
  std::vector<std::pair<Stream, gg_arena_t *>> arenas; /* its own, one per stream */
  std::vector<Held> held; /* implicit: default-pool blocks its graph reads */
};

/* What a free hands back to the facade (for history records and IPC). */
struct Freed {
  int device = 0;
  size_t size = 0; /* the block's, as PyTorch's figures count it */
  size_t requested = 0;
  Stream stream = nullptr;
  PoolId pool;
  uint64_t ipc_id = 0;
  std::shared_ptr<void> context;
};

/* One block as a snapshot shows it. */
struct BlockView {
  uintptr_t addr;
  size_t size;
  size_t requested;
  Stream stream;
  std::shared_ptr<void> context;
};

/* A mapped range of one arena, owned by a pool ({0, 0}: the default pool). */
struct Range {
  uintptr_t addr;
  size_t size;
  PoolId owner;
  int device;
  bool custom = false; /* a custom allocator's segment (not expandable) */
};

/* A private pool's live blocks at one moment (CUDA-graph trees' checkpoints): what restore() puts
 * back. Opaque to the facade. */
struct Checkpoint {
  struct Live {
    void *ptr;
    size_t requested;
    size_t size; /* the block's, as the arena counts it */
    Stream stream;
    gg_arena_t *arena;
  };
  PoolId id;
  int device = 0;
  std::vector<Live> live; /* by address */
};

class Adapter {
public:
  /* `defaults`: the options of the arenas it makes (backend, capacity, chunk size). */
  Adapter(const Runtime &rt, const gg_arena_options_t &defaults);
  ~Adapter();
  Adapter(const Adapter &) = delete;
  Adapter &operator=(const Adapter &) = delete;

  /* ---- arenas (adapter.cpp) */
  int device_arena(int device, gg_arena_t **out); /* the default pool's, made at first use */
  gg_arena_t *device_arena_if_any(int device) const;
  int use_arena(int device, gg_arena_t *arena);    /* gpuguard.torch.use_arena */
  std::vector<gg_arena_t *> arenas_of(int device); /* every arena serving the device, once each */

  /* ---- blocks (adapter.cpp): the only place that routes, counts and records */
  /* `divisions`: PyTorch's roundup_power2_divisions for n (allocator settings); above 1, a request
   * of more than 512 * divisions bytes takes the next of `divisions` steps between two powers of
   * two (its block, and active_bytes, that size), as PyTorch's allocator rounds it. */
  int alloc(size_t n, int device, Stream stream, std::shared_ptr<void> context, void **ptr,
            PoolId *pool, size_t divisions = 0);
  int free(void *ptr, Freed *out);             /* GG_ENOTFOUND: not a block of ours */
  int record_stream(void *ptr, Stream stream); /* 0; GG_ENOTFOUND: not ours */
  bool block_size(void *ptr, size_t *size);
  int share_info(void *ptr, gg_arena_t **arena, size_t *size, int *device, uint64_t *ipc_id);
  void set_ipc_id(void *ptr, uint64_t id);

  /* ---- statistics (adapter_stats.cpp) */
  DeviceStats stats(int device); /* every figure of DeviceStats, filled */
  Reserved reserved(int device); /* since creation (no reset applies) */
  int64_t allocated(int device); /* allocated_bytes.all.current */
  void reset_peaks(int device);
  void reset_totals(int device);
  size_t note_oom(int device); /* counts it; the bytes allocated now */

  /* ---- pools (adapter_pools.cpp) */
  void begin_capture(int device, PoolId id, std::function<bool(Stream)> filter);
  int end_capture(int device, PoolId id); /* GG_ENOTFOUND when none is under way */
  void release_pool(int device, PoolId id);
  int pool_use_count(PoolId id);
  void create_or_incref(int device, PoolId id, std::shared_ptr<Custom> custom);
  int pool_use_arena(int device, PoolId id, gg_arena_t *arena); /* gpuguard.torch.mem_pool */
  void set_use_on_oom(int device, PoolId id, bool on);
  void touch_pool(int device, PoolId id);
  size_t release_freeable(int device); /* pools freed */
  int empty_cache(PoolId id);          /* {0, 0}: all, the default arenas trimmed too */
  std::vector<void *> pool_blocks(int device, PoolId id);
  bool pool_blocks_are(int device, PoolId id, const std::unordered_set<void *> &expected);
  std::vector<Range> ranges(PoolId id); /* {0, 0}: all */

  /* ---- checkpoints (adapter_checkpoint.cpp): CUDA-graph trees rewinding a pool */
  Checkpoint checkpoint(int device, PoolId id);
  /* The pool as it was at `c`: every block live now is freed (its address into *freed), then every
   * block of the checkpoint is allocated again at its address (into *made), as PyTorch's allocator
   * returns it. 0; GG_ENOTFOUND: no such pool on the device; GG_ENOTSUP: a pool with its own
   * allocator; GG_ESTATE: an arena of the checkpoint is no longer the pool's, or a range of it is
   * not free (nothing changed in both cases, checked before anything is freed). */
  int restore(const Checkpoint &c, std::vector<void *> *freed, std::vector<void *> *made);
  std::vector<BlockView> blocks_sorted();
  void drop_contexts(); /* every block's recorded stack released (at the interpreter's exit) */

  /* ---- modes and diagnostics */
  void set_capture_any(bool on);
  /** The limit the device's arena gets when it is made (PyTorch's per_process_memory_fraction
   *  setting); an arena made already keeps its own. */
  void set_first_limit(int device, size_t bytes);
  /** The device's limit now (set_per_process_memory_fraction): what its arena maps and the custom
   *  allocators' segments together may not pass; the arena's limit leaves room for the segments
   *  held. 0; an error of gg_arena_set_limit. */
  int set_limit(int device, size_t bytes);
  /** Whether a graph may be capturing now: one announced, or captures that are not announced. */
  bool capturing_maybe() const {
    return n_announced_.load(std::memory_order_relaxed) ||
           capture_any_.load(std::memory_order_relaxed);
  }
  struct Counters {
    uint64_t n_pools, n_pool_blocks, n_blocks, n_captures;
  };
  Counters counters();
  std::vector<std::pair<PoolId, std::pair<int, size_t>>> pool_list(); /* use_count, live */
  int check(); /* every invariant walked (tests): 0, or GG_ESTATE naming the first broken one */

private:
  Pool *route_locked(int device, Stream stream, uint64_t capture);
  int route(int device, Stream stream, Pool **out);
  Pool *implicit_of_locked(uint64_t capture);
  Pool &pool_locked(int device, PoolId id);
  int pool_alloc(Pool &p, size_t n, Stream stream, void **ptr, gg_arena_t **used);
  int pool_arena(Pool &p, Stream stream, gg_arena_t **out);
  int default_alloc(size_t n, int device, Stream stream, void **ptr, Pool **pool, gg_arena_t **used,
                    bool *pinned);
  void free_default(void *ptr, const Block &b);
  void free_pooled(void *ptr, const Block &b);
  void release_pooled(const Held &h);
  bool hold_for_graph(void *ptr, const Block &b);
  void sweep();
  void sweep_locked(std::vector<Held> *out);
  int implicit_pool_locked(int device, Stream stream, uint64_t capture, Pool **out);
  void destroy_arenas(int device, const std::vector<gg_arena_t *> &dead); /* device synced */
  void account_locked(const Block &b, bool add, bool active = true);
  bool insert_locked(void *ptr, Block &&b);
  bool quiet_locked(bool asked) const;
  Block remove_locked(std::unordered_map<void *, Block>::iterator it);
  bool defer_free(void *ptr, const Block &b); /* adapter_recorded.cpp */
  void deactivate_locked(const Block &b);     /* the active figures of a deferred free */
  void drain_recorded(bool wait, bool asked = false);
  void free_stretches(int device, int64_t *count, int64_t *bytes);
  void note_gone(int device, gg_arena_t *a);
  std::vector<std::pair<void *, Block>> free_pool_locked(Pool &p);
  int place_locked(Pool &p, void *ptr, Block b);
  /* custom allocators' segments (adapter_custom.cpp) */
  int custom_alloc(Pool &p, size_t n, Stream stream, void **ptr, bool grow);
  bool cut_locked(Pool &p, size_t n, Stream stream, void **ptr);
  void custom_free_locked(Pool &p, void *ptr, size_t n);
  int reserve_locked(int device, int64_t bytes);
  void unreserve_locked(int device, int64_t bytes);
  void add_segment_locked(Pool &p, void *base, size_t bytes, Stream stream, bool small,
                          std::shared_ptr<Custom> custom);
  int limit_arena_locked(int device, gg_arena_t *a);
  size_t held_beside_locked(int device);
  bool relimit(int device);
  void take_spent_locked(Pool &p, std::vector<Spent> *out);
  /* Segments freed by their allocators, the device synchronised already: an allocator's error. */
  std::exception_ptr give_back(const std::vector<Spent> &spent);
  int check_segments_locked();
  void trace(char op, const void *ptr, size_t size, Stream stream);
  static void trace_init(); /* opens GPUGUARD_PLUGIN_TRACE's file once per process */
  static void graph_gone(void *user);

  Runtime rt_;
  gg_arena_options_t defaults_;
  std::mutex mu_;
  std::mutex make_mu_; /* two first allocations on a device make one arena */
  std::atomic<gg_arena_t *> arenas_[kMaxDevices] = {};
  bool owned_[kMaxDevices] = {};    /* made here (destroyed with the adapter) */
  size_t limits_[kMaxDevices] = {}; /* arena + custom segments, set_limit (0: none); mu_ */
  DeviceStats dev_[kMaxDevices];    /* the block figures; the rest is filled at each read */
  struct Seen {                     /* per device: what the last read saw, and the reset's bases */
    Reserved base;                  /* totals at reset_totals */
    int64_t reserved_peak = 0, segment_peak = 0;
    Stat inactive, inactive_bytes;
  } seen_[kMaxDevices];
  Reserved gone_[kMaxDevices]; /* what arenas destroyed with their pools had mapped and done */
  SegmentTotals custom_[kMaxDevices]; /* custom allocators' segments held; mu_ */
  std::unordered_map<void *, Block> blocks_;
  static constexpr size_t kSpareNodes = 1024;
  std::vector<std::unordered_map<void *, Block>::node_type> spare_; /* nodes for blocks_, reused */
  std::map<PoolId, std::unique_ptr<Pool>> pools_;
  struct Capture {
    int device;
    PoolId id;
    std::function<bool(Stream)> filter;
  };
  std::vector<Capture> captures_; /* announced, oldest first */
  std::atomic<int> n_announced_{0};
  std::atomic<bool> capture_any_{false};
  std::atomic<uint64_t> deaths_{0}; /* graphs gone: a change means "sweep" */
  std::atomic<uint64_t> seen_deaths_{0};
  std::atomic<size_t> n_held_{0};  /* deferred_.size(), read without the lock */
  std::vector<Held> deferred_;     /* blocks of gone graphs whose stream captured again; pool blocks
                                      other streams used, freed in a capture: until it ends */
  std::vector<Recorded> recorded_; /* freed, waiting for the streams they were recorded on */
  std::atomic<size_t> n_recorded_{0};
};

} // namespace gg_torch

#endif
