/* test_torch_adapter.cpp — the torch-free core of gpuguard's PyTorch backend
 * (bindings/python/gpuguard/torch/native/adapter*.cpp), built alone and run on the host backend
 * with stub runtime calls: the pool rules, the statistics, capture routing (announced and not), the
 * blocks a graph keeps, record_stream joins, and the trace file. No PyTorch, no GPU. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "torch/native/adapter.h"
#include "gg_test.hpp"

using gg_torch::Adapter;
using gg_torch::PoolId;
using gg_torch::Stream;

namespace {

constexpr size_t MiB = size_t(1) << 20;

/* ---- the stub runtime: captures and graphs are what the test says they are */

std::map<Stream, uint64_t> g_capturing;                           /* stream -> capture id */
std::vector<std::pair<void (*)(void *), void *>> g_graph_holders; /* graph_retain's callbacks */
int g_device_syncs = 0;
int g_stream_syncs = 0;

int g_capture_queries = 0;
int stub_capture_id(Stream s, uint64_t *id) {
  g_capture_queries++;
  auto it = g_capturing.find(s);
  *id = it == g_capturing.end() ? 0 : it->second;
  return 0;
}

int stub_graph_retain(Stream, void (*done)(void *), void *user) {
  g_graph_holders.push_back({done, user});
  return 0;
}

int stub_stream_sync(Stream) { return ++g_stream_syncs, 0; }
int stub_device_sync(int) { return ++g_device_syncs, 0; }
void stub_relax(bool, int *) {}

/* Events: done when the test says the streams are (g_streams_done); with g_one_busy, only the
 * events of that one stream are not. */
bool g_streams_done = false;
bool g_one_busy = false;
Stream g_busy_stream = nullptr;
int g_events_live = 0;
int stub_event_record(int, Stream s, void **ev) {
  *ev = new Stream(s);
  g_events_live++;
  return 0;
}
int g_event_queries = 0;
int stub_event_query(void *ev) {
  g_event_queries++;
  if (g_one_busy) {
    return *static_cast<Stream *>(ev) == g_busy_stream ? 0 : 1;
  }
  return g_streams_done ? 1 : 0;
}
void stub_event_destroy(void *ev) {
  delete static_cast<Stream *>(ev);
  g_events_live--;
}

/* The graph is destroyed: the runtime calls what was tied to it. */
void destroy_graphs() {
  for (auto &h : g_graph_holders) {
    h.first(h.second);
  }
  g_graph_holders.clear();
}

gg_torch::Runtime stub_runtime() {
  return gg_torch::Runtime{stub_capture_id,  stub_graph_retain, stub_stream_sync,
                           stub_device_sync, stub_relax,        stub_event_record,
                           stub_event_query, stub_event_destroy};
}

gg_arena_options_t host_defaults(size_t capacity) {
  return gg_test_host_options(capacity, 2 * MiB);
}

gg_arena_stats_t stats_of(gg_arena_t *a) {
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  return s;
}

void *alloc(Adapter &ad, size_t n, Stream s, PoolId *pool = nullptr) {
  void *p = nullptr;
  PoolId id;
  gg_assert_ok(ad.alloc(n, 0, s, nullptr, &p, pool ? pool : &id));
  assert_non_null(p);
  return p;
}

void release(Adapter &ad, void *p) {
  gg_torch::Freed f;
  gg_assert_ok(ad.free(p, &f));
}

} // namespace

/* The default pool: one arena per device made at first use (however many threads ask), stream
 * ordered, and PyTorch's figures per size class. */
static void test_default_pool_counts_each_block_once(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  std::vector<std::thread> t;
  gg_arena_t *made[8] = {};
  for (int i = 0; i < 8; i++) {
    t.emplace_back([&, i] { ad.device_arena(0, &made[i]); });
  }
  for (auto &x : t) {
    x.join();
  }
  for (int i = 1; i < 8; i++) {
    assert_ptr_equal(made[i], made[0]);
  }
  gg_arena_options_t o;
  gg_assert_ok(gg_arena_get_options(made[0], &o));
  assert_string_equal(o.name, "torch");
  assert_true(o.flags & GG_ARENA_KEEP_HOLES);
  void *small = alloc(ad, 1000, nullptr);
  void *large = alloc(ad, 3 * MiB, nullptr);
  gg_torch::DeviceStats d = ad.stats(0);
  assert_int_equal(d.allocation[gg_torch::kAll].current, 2);
  assert_int_equal(d.allocation[gg_torch::kSmall].current, 1);
  assert_int_equal(d.allocated_bytes[gg_torch::kAll].current, 1024 + 3 * MiB);
  assert_int_equal(d.requested_bytes[gg_torch::kSmall].current, 1000);
  gg_assert_ok(ad.check());
  size_t sz = 0;
  assert_true(ad.block_size(large, &sz));
  assert_int_equal(sz, 3 * MiB);
  release(ad, small);
  release(ad, large);
  gg_torch::Freed f;
  assert_int_equal(ad.free(small, &f), GG_ENOTFOUND); /* a double free is refused */
  d = ad.stats(0);
  assert_int_equal(d.allocation[gg_torch::kAll].current, 0);
  assert_int_equal(d.allocation[gg_torch::kAll].peak, 2);
  assert_int_equal(d.allocated_bytes[gg_torch::kAll].freed, 1024 + 3 * MiB);
  assert_int_equal(stats_of(made[0]).n_live, 0);
  ad.reset_peaks(0);
  ad.reset_totals(0);
  d = ad.stats(0);
  assert_int_equal(d.allocation[gg_torch::kAll].peak, 0);
  assert_int_equal(d.allocated_bytes[gg_torch::kAll].freed, 0);
  gg_torch::Reserved r = ad.reserved(0);
  assert_true(r.current >= int64_t(4 * MiB));
  gg_assert_ok(ad.check());
}

/* use_arena: the device's default pool uses the caller's arena; one per device, never NO_STREAM. */
static void test_use_arena_serves_the_default_pool(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  gg_arena_options_t o = host_defaults(32 * MiB);
  gg_arena_t *mine = nullptr;
  gg_assert_ok(gg_arena_create(&mine, &o));
  gg_assert_ok(ad.use_arena(0, mine));
  gg_assert_ok(ad.use_arena(0, mine)); /* again: the same one */
  void *p = alloc(ad, 4096, nullptr);
  assert_int_equal(stats_of(mine).n_live, 1);
  release(ad, p);
  assert_int_equal(stats_of(mine).n_live, 0);
  gg_arena_t *other = nullptr;
  gg_assert_ok(gg_arena_create(&other, &o));
  assert_int_equal(ad.use_arena(0, other), GG_ESTATE);
  gg_arena_t *nostream = nullptr;
  o.flags = GG_ARENA_NO_STREAM;
  gg_assert_ok(gg_arena_create(&nostream, &o));
  assert_int_equal(ad.use_arena(1, nostream), GG_EINVAL);
  gg_assert_ok(gg_arena_destroy(nostream));
  gg_assert_ok(gg_arena_destroy(other));
  gg_assert_ok(ad.check());
  /* the adapter does not own it: the caller destroys it once PyTorch is done */
  gg_assert_ok(gg_arena_destroy(mine));
}

/* An announced capture's allocations go to its pool; the pool's memory goes back once it has no use
 * and no live block, after a device synchronisation. */
static void test_announced_capture_fills_its_pool(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  void *side = nullptr;
  gg_assert_ok(gg_host_stream_create(&side));
  PoolId id{0, 1};
  ad.begin_capture(0, id, [side](Stream s) { return s == side; });
  PoolId got;
  g_capture_queries = 0;
  void *in_pool = alloc(ad, 8192, side, &got);
  assert_true(got == id);
  assert_int_equal(g_capture_queries, 0); /* the filter took it: the driver is not asked */
  void *outside = alloc(ad, 8192, nullptr, &got);
  assert_true(got == PoolId{});
  assert_int_equal(g_capture_queries, 1); /* no filter took it: is its stream capturing? */
  assert_int_equal(ad.pool_use_count(id), 1);
  assert_int_equal(ad.counters().n_captures, 1);
  gg_assert_ok(ad.end_capture(0, id));
  assert_int_equal(ad.end_capture(0, id), GG_ENOTFOUND);
  assert_true(ad.pool_blocks_are(0, id, {in_pool}));
  ad.release_pool(0, id);
  assert_int_equal(ad.release_freeable(0), 0); /* a live block keeps it */
  release(ad, in_pool);
  int syncs = g_device_syncs;
  assert_int_equal(ad.release_freeable(0), 1);
  assert_int_equal(g_device_syncs, syncs + 1);
  assert_int_equal(ad.counters().n_pools, 0);
  release(ad, outside);
  gg_assert_ok(ad.check());
  gg_host_stream_destroy(side);
}

/* A pool's block another stream used (record_stream), freed during the capture: in the graph that
 * stream's reads are ordered before a later node only once it joins, so the block is not handed
 * out again until the capture ends (PyTorch's rule), then it is. */
static void test_recorded_block_freed_in_a_capture_waits_for_its_end(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  void *cap = nullptr;
  void *other = nullptr;
  gg_assert_ok(gg_host_stream_create(&cap));
  gg_assert_ok(gg_host_stream_create(&other));
  PoolId id{0, 7};
  ad.begin_capture(0, id, [cap](Stream s) { return s == cap; });
  g_capturing[cap] = 42;
  PoolId got;
  void *x = alloc(ad, 512, cap, &got);
  gg_assert_ok(ad.record_stream(x, other));
  release(ad, x);
  gg_assert_ok(ad.check());       /* still the pool's: it counts in its live blocks */
  for (int i = 0; i < 200; i++) { /* the pool's cache cycles through every free block it has */
    void *y = alloc(ad, 512, cap, &got);
    assert_ptr_not_equal(y, x);
    release(ad, y);
  }
  g_capturing.erase(cap);
  PoolId next{0, 8};
  ad.begin_capture(0, next, [](Stream) { return false; }); /* another capture, announced */
  gg_assert_ok(ad.end_capture(0, id));
  int syncs = g_stream_syncs;
  void *d1 = alloc(ad, 512, nullptr, &got); /* a call that sweeps */
  /* x goes back once the stream it was recorded on is done (work queued there outside the capture
   * may read it), and that stream is synchronised only while no capture may be under way */
  assert_int_equal(g_stream_syncs, syncs);
  gg_assert_ok(ad.end_capture(0, next));
  void *d2 = alloc(ad, 512, nullptr, &got);
  assert_int_equal(g_stream_syncs, syncs + 1);
  ad.begin_capture(0, id, [cap](Stream s) { return s == cap; }); /* a second graph, same pool */
  void *y = alloc(ad, 512, cap, &got);
  assert_true(got == id);
  assert_true(ad.pool_blocks_are(0, id, {y})); /* x no longer counts: free in the pool's arena */
  gg_assert_ok(ad.check());
  release(ad, y);
  release(ad, d1);
  release(ad, d2);
  gg_assert_ok(ad.end_capture(0, id));
  gg_assert_ok(ad.check());
  ad.release_pool(0, id);
  ad.release_pool(0, id);
  ad.release_pool(0, next);
  assert_int_equal(ad.release_freeable(0), 2);
  gg_host_stream_destroy(other);
  gg_host_stream_destroy(cap);
}

/* mem_pool(arena): a MemPool whose blocks come from the caller's arena. */
static void test_mem_pool_draws_from_the_given_arena(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  gg_arena_options_t o = host_defaults(32 * MiB);
  gg_arena_t *mine = nullptr;
  gg_assert_ok(gg_arena_create(&mine, &o));
  PoolId id{7, 0};
  ad.create_or_incref(0, id, nullptr);
  gg_assert_ok(ad.pool_use_arena(0, id, mine));
  ad.begin_capture(0, id, [](Stream) { return true; }); /* use_mem_pool: every stream */
  void *p = alloc(ad, 1 << 16, nullptr);
  assert_int_equal(stats_of(mine).n_live, 1);
  gg_assert_ok(ad.end_capture(0, id));
  gg_arena_t *a2 = nullptr;
  gg_assert_ok(gg_arena_create(&a2, &o));
  assert_int_equal(ad.pool_use_arena(0, id, a2), GG_ESTATE); /* it holds memory of mine */
  release(ad, p);
  assert_int_equal(stats_of(mine).n_live, 0);
  ad.release_pool(0, id); /* use_mem_pool's end */
  ad.release_pool(0, id); /* the MemPool deleted */
  assert_int_equal(ad.release_freeable(0), 1);
  gg_assert_ok(gg_arena_destroy(a2));
  gg_assert_ok(gg_arena_destroy(mine)); /* never destroyed by the adapter */
}

/* captures=any: a capture nobody announced gets a pool tied to its graph, and a default-pool block
 * freed during it stays allocated until the graph is gone. */
static void test_unannounced_capture_is_kept_for_its_graph(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  ad.set_capture_any(true);
  void *s = nullptr;
  gg_assert_ok(gg_host_stream_create(&s));
  void *before = alloc(ad, 1 << 20, s);
  gg_arena_t *main_arena = ad.device_arena_if_any(0);
  g_capturing[s] = 42;
  PoolId got;
  void *during = alloc(ad, 4096, s, &got);
  assert_int_equal(got.second, 42);
  assert_int_equal(g_graph_holders.size(), 1);
  release(ad, before); /* the graph reads it at every replay */
  assert_int_equal(stats_of(main_arena).n_live, 1);
  release(ad, during);
  g_capturing.erase(s);
  assert_int_equal(ad.release_freeable(0), 0); /* the graph lives */
  destroy_graphs();
  void *after = alloc(ad, 4096, s, &got); /* the next call gives back what the graph held */
  assert_true(got == PoolId{});
  assert_int_equal(stats_of(main_arena).n_live, 1);
  assert_int_equal(ad.release_freeable(0), 1);
  release(ad, after);
  assert_int_equal(stats_of(main_arena).n_live, 0);
  gg_assert_ok(ad.check());
  gg_host_stream_destroy(s);
}

/* Tensor.record_stream: the block goes back to its arena only once the streams it was recorded on
 * are past its free (an event each), counting as active until then; no allocation gets it before.
 * After that, an allocation of its size gets it back (PyTorch's test_record_stream). */
static void test_recorded_small_block_is_reused_once_done(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  void *side = nullptr;
  gg_assert_ok(gg_host_stream_create(&side));
  void *keep = alloc(ad, 16, nullptr);
  void *p = alloc(ad, 16, side);
  gg_assert_ok(ad.record_stream(p, nullptr));
  g_streams_done = false;
  release(ad, p);
  void *q = alloc(ad, 16, side);
  assert_ptr_not_equal(q, p);
  g_streams_done = true;
  void *r = alloc(ad, 16, side);
  assert_ptr_equal(r, p);
  release(ad, q);
  release(ad, r);
  release(ad, keep);
  gg_assert_ok(ad.check());
  gg_host_stream_destroy(side);
}

/* Many recorded frees pending on busy streams: an allocation asks one event per stream, not one per
 * block (events of one stream complete in order), and all go back once the streams are done. */
static void test_pending_recorded_frees_cost_one_query_per_stream(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  void *side = nullptr;
  gg_assert_ok(gg_host_stream_create(&side));
  g_streams_done = false;
  for (int i = 0; i < 50; i++) {
    void *p = alloc(ad, 4096, side);
    gg_assert_ok(ad.record_stream(p, nullptr));
    release(ad, p);
  }
  assert_int_equal(g_events_live, 100);
  g_event_queries = 0;
  void *q = alloc(ad, 4096, side);
  assert_in_range(g_event_queries, 1, 2); /* 50 before */
  /* The stream asked first (the recorded one) done, the block's own busy: still one a stream. */
  g_one_busy = true;
  g_busy_stream = side;
  g_event_queries = 0;
  release(ad, alloc(ad, 4096, nullptr));
  assert_int_equal(g_event_queries, 2); /* 51 with a busy list that only grew */
  g_one_busy = false;
  assert_int_equal(ad.stats(0).active[gg_torch::kAll].current, 51);
  g_streams_done = true;
  release(ad, alloc(ad, 4096, side));
  assert_int_equal(g_events_live, 0);
  assert_int_equal(ad.stats(0).active[gg_torch::kAll].current, 1);
  release(ad, q);
  gg_assert_ok(ad.check());
  gg_host_stream_destroy(side);
}

static void test_recorded_streams_hold_the_block_until_done(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  void *side = nullptr;
  gg_assert_ok(gg_host_stream_create(&side));
  void *p = alloc(ad, 3 * MiB, side);
  gg_assert_ok(ad.record_stream(p, nullptr));
  gg_assert_ok(ad.record_stream(p, nullptr)); /* once is enough */
  int x = 0;
  assert_int_equal(ad.record_stream(&x, side), GG_ENOTFOUND);
  g_streams_done = false;
  release(ad, p);
  assert_int_equal(g_events_live, 2); /* the recorded stream and its own */
  gg_torch::DeviceStats d = ad.stats(0);
  assert_int_equal(d.allocated_bytes[gg_torch::kAll].current, 0);
  assert_int_equal(d.active_bytes[gg_torch::kAll].current,
                   3 * MiB); /* still in use by the stream */
  assert_int_equal(d.requested_bytes[gg_torch::kAll].current, 3 * MiB);
  void *q = alloc(ad, 3 * MiB, side);
  assert_ptr_not_equal(q, p); /* not reused too soon */
  g_streams_done = true;
  void *r = alloc(ad, 3 * MiB, side);
  assert_ptr_equal(r, p); /* the streams are done: reused */
  assert_int_equal(g_events_live, 0);
  d = ad.stats(0);
  assert_int_equal(d.active[gg_torch::kAll].current, 2);
  assert_int_equal(d.active_bytes[gg_torch::kAll].current, 6 * MiB);
  release(ad, q);
  release(ad, r);
  /* empty_cache waits for the device: nothing stays held */
  void *t = alloc(ad, 3 * MiB, side);
  gg_assert_ok(ad.record_stream(t, nullptr));
  g_streams_done = false;
  release(ad, t);
  int syncs = g_device_syncs;
  g_streams_done = true; /* what the device wait makes true */
  gg_assert_ok(ad.empty_cache(PoolId{}));
  assert_int_equal(g_device_syncs, syncs + 1);
  assert_int_equal(ad.stats(0).active_bytes[gg_torch::kAll].current, 0);
  assert_int_equal(g_events_live, 0);
  gg_assert_ok(ad.check());
  gg_host_stream_destroy(side);
}

/* Out of memory: the arena's error, counted as PyTorch counts it. */
static void test_out_of_memory_is_reported_and_counted(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(8 * MiB));
  void *p = nullptr;
  PoolId id;
  assert_int_equal(ad.alloc(16 * MiB, 0, nullptr, nullptr, &p, &id), GG_ENOMEM);
  assert_null(p);
  assert_int_equal(ad.note_oom(0), 0);
  assert_int_equal(ad.stats(0).num_ooms, 1);
  assert_int_equal(ad.alloc(16, -1, nullptr, nullptr, &p, &id), GG_EINVAL);
  gg_assert_ok(ad.check());
}

/* Every figure of memory_stats() with PyTorch's meaning: reserved = mapped, segments = chunks
 * (allocated: mapped, freed: given back), inactive split = free stretches inside chunks that hold
 * a live block, totals reset by reset_totals and peaks by reset_peaks. */
static void test_every_figure_has_pytorchs_meaning(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  void *a = alloc(ad, 256 * 1024, nullptr);
  void *b = alloc(ad, 256 * 1024, nullptr);
  void *c = alloc(ad, 256 * 1024, nullptr);
  gg_arena_t *arena = ad.device_arena_if_any(0);
  gg_arena_stats_t s = stats_of(arena);
  gg_torch::DeviceStats d = ad.stats(0);
  assert_int_equal(d.reserved_bytes[gg_torch::kAll].current, s.bytes_mapped);
  assert_int_equal(d.reserved_bytes[gg_torch::kLarge].current, s.bytes_mapped);
  assert_int_equal(d.reserved_bytes[gg_torch::kSmall].current, 0);
  assert_int_equal(d.reserved_bytes[gg_torch::kAll].allocated, s.bytes_mapped);
  assert_int_equal(d.segment[gg_torch::kAll].current, s.n_chunks);
  assert_int_equal(d.segment[gg_torch::kAll].allocated, s.n_maps);
  assert_int_equal(d.num_device_alloc, s.n_maps);
  assert_int_equal(d.max_split_size, -1);
  assert_int_equal(d.oversize_allocations.current, 0);
  int64_t free_before = d.inactive_split_bytes[gg_torch::kAll].current;
  release(ad, b); /* a hole between two live blocks */
  d = ad.stats(0);
  assert_true(d.inactive_split[gg_torch::kAll].current >= 1);
  assert_true(d.inactive_split_bytes[gg_torch::kAll].current >= free_before + 256 * 1024);
  assert_true(d.inactive_split_bytes[gg_torch::kAll].current <=
              d.reserved_bytes[gg_torch::kAll].current - d.allocated_bytes[gg_torch::kAll].current);
  assert_int_equal(d.inactive_split_bytes[gg_torch::kAll].current,
                   d.inactive_split_bytes[gg_torch::kAll].allocated -
                       d.inactive_split_bytes[gg_torch::kAll].freed);
  release(ad, a);
  release(ad, c);
  d = ad.stats(0);
  assert_int_equal(d.inactive_split[gg_torch::kAll].current, 0); /* nothing live: releasable */
  assert_int_equal(d.inactive_split_bytes[gg_torch::kAll].current, 0);
  assert_true(d.inactive_split_bytes[gg_torch::kAll].peak >= 256 * 1024);
  ad.reset_totals(0);
  ad.reset_peaks(0);
  d = ad.stats(0);
  assert_int_equal(d.num_device_alloc, 0);
  assert_int_equal(d.reserved_bytes[gg_torch::kAll].allocated, 0);
  assert_int_equal(d.inactive_split_bytes[gg_torch::kAll].peak, 0);
  int64_t mapped = d.reserved_bytes[gg_torch::kAll].current;
  assert_true(mapped > 0);
  gg_assert_ok(ad.empty_cache(PoolId{}));
  d = ad.stats(0);
  assert_int_equal(d.reserved_bytes[gg_torch::kAll].current, 0);
  assert_int_equal(d.reserved_bytes[gg_torch::kAll].freed, mapped);
  assert_int_equal(d.reserved_bytes[gg_torch::kAll].peak, mapped); /* peaks stay until reset */
  assert_int_equal(d.segment[gg_torch::kAll].current, 0);
  assert_int_equal(d.num_device_free, stats_of(arena).n_unmaps);
  assert_int_equal(d.num_device_free, d.segment[gg_torch::kAll].freed);
  /* a pool's arena destroyed with its pool: its memory is counted as freed, not forgotten */
  PoolId id{1, 0};
  ad.begin_capture(0, id, [](Stream) { return true; });
  void *p = alloc(ad, 3 * MiB, nullptr);
  gg_assert_ok(ad.end_capture(0, id));
  int64_t with_pool = ad.stats(0).reserved_bytes[gg_torch::kAll].current;
  assert_true(with_pool >= int64_t(3 * MiB));
  release(ad, p);
  ad.release_pool(0, id);
  gg_assert_ok(ad.empty_cache(PoolId{}));
  d = ad.stats(0);
  assert_int_equal(d.reserved_bytes[gg_torch::kAll].current, 0);
  assert_int_equal(d.reserved_bytes[gg_torch::kAll].freed, mapped + with_pool);
  assert_int_equal(d.reserved_bytes[gg_torch::kAll].allocated, with_pool);
  gg_assert_ok(ad.check());
}

/* PyTorch's roundup_power2_divisions (torch.cuda.memory._set_allocator_settings): a request above
 * 512 * divisions takes the next division step between two powers of two, block and figures. */
static void test_roundup_power2_divisions(void **state) {
  (void)state;
  using gg_torch::block_bytes;
  assert_int_equal(block_bytes(84 * MiB, 0), 84 * MiB);
  assert_int_equal(block_bytes(84 * MiB, 1), 84 * MiB);
  assert_int_equal(block_bytes(84 * MiB, 4), 96 * MiB);
  assert_int_equal(block_bytes(84 * MiB, 8), 88 * MiB);
  assert_int_equal(block_bytes(400 * MiB, 2), 512 * MiB);
  assert_int_equal(block_bytes(64 * MiB, 4), 64 * MiB); /* a power of two stays */
  assert_int_equal(block_bytes(1000, 4), 1024);         /* not above 512 * 4: the quantum */
  assert_int_equal(block_bytes(8, 0), 512);             /* PyTorch's smallest block */
  assert_int_equal(block_bytes(513, 0), 768);
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  void *p = nullptr;
  PoolId id;
  gg_assert_ok(ad.alloc(5000, 0, nullptr, nullptr, &p, &id, 4));
  size_t sz = 0;
  assert_true(ad.block_size(p, &sz));
  assert_int_equal(sz, 5120);
  gg_torch::DeviceStats d = ad.stats(0);
  assert_int_equal(d.active_bytes[gg_torch::kAll].allocated, 5120);
  assert_int_equal(d.requested_bytes[gg_torch::kAll].allocated, 5000);
  gg_assert_ok(ad.check());
  release(ad, p);
}

/* CUDA-graph trees: a checkpoint of a graph pool, the pool changed (a block freed, others made),
 * then restored: the checkpoint's blocks live at their addresses, the others freed, and the delta
 * as PyTorch's allocator gives it (freed: every block live before; made: every checkpoint block).
 */
static void test_checkpoint_round_trip(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  PoolId id{3, 0};
  ad.begin_capture(0, id, [](Stream) { return true; });
  void *a = alloc(ad, 4096, nullptr);
  void *b = alloc(ad, 3 * MiB, nullptr);
  void *c = alloc(ad, 1000, nullptr);
  gg_torch::Checkpoint cp = ad.checkpoint(0, id);
  assert_int_equal(cp.live.size(), 3);
  release(ad, b);
  void *d = alloc(ad, 2 * MiB, nullptr); /* may take b's place, in part */
  void *e = alloc(ad, 512, nullptr);
  gg_assert_ok(ad.end_capture(0, id));
  int64_t before = ad.stats(0).allocated_bytes[gg_torch::kAll].current;
  std::vector<void *> freed;
  std::vector<void *> made;
  gg_assert_ok(ad.restore(cp, &freed, &made));
  std::sort(freed.begin(), freed.end());
  std::vector<void *> want_freed{a, c, d, e};
  std::sort(want_freed.begin(), want_freed.end());
  assert_true(freed == want_freed);
  std::vector<void *> want_made{a, b, c};
  std::sort(want_made.begin(), want_made.end());
  assert_true(made == want_made);
  assert_true(ad.pool_blocks_are(0, id, {a, b, c}));
  int64_t after = ad.stats(0).allocated_bytes[gg_torch::kAll].current;
  assert_int_equal(after - before, int64_t(3 * MiB) - int64_t(2 * MiB) - 512);
  size_t sz = 0;
  assert_true(ad.block_size(c, &sz));
  assert_int_equal(sz, 1024);
  gg_assert_ok(ad.check());
  /* the same checkpoint again: nothing moves, the delta is every block both ways */
  gg_assert_ok(ad.restore(cp, &freed, &made));
  assert_int_equal(freed.size(), 3);
  assert_int_equal(made.size(), 3);
  for (void *p : {a, b, c}) {
    release(ad, p);
  }
  ad.release_pool(0, id);
  assert_int_equal(ad.release_freeable(0), 1);
  assert_int_equal(ad.restore(cp, &freed, &made), GG_ENOTFOUND); /* the pool is gone */
  gg_assert_ok(ad.check());
}

/* A range of the checkpoint taken meanwhile by someone else (the MemPool's arena is the caller's):
 * GG_ESTATE, the pool exactly as before the call. */
static void test_checkpoint_restore_refused_leaves_the_pool(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  gg_arena_options_t o = host_defaults(32 * MiB);
  o.flags = GG_ARENA_NO_STREAM;
  gg_arena_t *mine = nullptr;
  gg_assert_ok(gg_arena_create(&mine, &o));
  PoolId id{9, 0};
  ad.create_or_incref(0, id, nullptr);
  gg_assert_ok(ad.pool_use_arena(0, id, mine));
  ad.begin_capture(0, id, [](Stream) { return true; });
  void *a = alloc(ad, 1 << 16, nullptr);
  gg_torch::Checkpoint cp = ad.checkpoint(0, id);
  release(ad, a);
  void *keep = alloc(ad, 1 << 12, nullptr);
  gg_assert_ok(ad.end_capture(0, id));
  void *other = nullptr;
  gg_assert_ok(gg_alloc(mine, 1 << 16, &other)); /* inside a's old range */
  std::vector<void *> freed;
  std::vector<void *> made;
  assert_int_equal(ad.restore(cp, &freed, &made), GG_ESTATE);
  assert_true(freed.empty() && made.empty());
  assert_true(ad.pool_blocks_are(0, id, {keep}));
  assert_int_equal(stats_of(mine).n_live, 2);
  gg_assert_ok(ad.check());
  gg_assert_ok(gg_free(mine, other));
  release(ad, keep);
  ad.release_pool(0, id);
  ad.release_pool(0, id);
  assert_int_equal(ad.release_freeable(0), 1);
  gg_assert_ok(gg_arena_destroy(mine));
}

/* GPUGUARD_PLUGIN_TRACE=PATH: PATH.PID, in bench_replay's format; set in main before any call. */
static void test_trace_file_has_the_replay_format(void **state) {
  (void)state;
  Adapter ad(stub_runtime(), host_defaults(64 * MiB));
  void *p = alloc(ad, 1000, nullptr);
  release(ad, p);
  std::string path = std::string(getenv("GPUGUARD_PLUGIN_TRACE")) + "." + std::to_string(getpid());
  FILE *f = fopen(path.c_str(), "r");
  assert_non_null(f);
  char line[256];
  std::vector<std::string> lines;
  while (fgets(line, sizeof line, f)) {
    lines.push_back(line);
  }
  fclose(f);
  unlink(path.c_str());
  assert_true(lines.size() >= 3);
  assert_int_equal(lines[0].rfind("# gpuguard plugin trace, pid ", 0), 0);
  char buf[64];
  snprintf(buf, sizeof buf, "%p", p);
  assert_true(lines[lines.size() - 2] == "a " + std::string(buf) + " 1000 (nil)\n");
  assert_true(lines.back() == "f " + std::string(buf) + " (nil)\n");
}

/* GPUGUARD_PLUGIN_TRACE in hostile places (issue 42 item 18): what another user planted at the
 * name a process will trace to (a symlink to a file it must not write, a FIFO nobody reads) is
 * refused, the first allocation does not hang, and two processes each write a file of their own.
 * Each case is a child that opens the trace for the first time (the parent never traces before this
 * test), told its pid's name is ready through a pipe. Returns the child's status. */
static int trace_in_child(const std::string &base, void (*plant)(const std::string &)) {
  int go[2];
  assert_int_equal(pipe(go), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char c;
    close(go[1]);
    if (read(go[0], &c, 1) != 1) _exit(3);
    alarm(10); /* a trace open that blocks (a FIFO) fails the case instead of the suite */
    Adapter ad(stub_runtime(), host_defaults(16 * MiB));
    void *p = alloc(ad, 512, nullptr);
    release(ad, p);
    _exit(0);
  }
  close(go[0]);
  if (plant) plant(base + "." + std::to_string(pid));
  assert_int_equal(write(go[1], "x", 1), 1);
  close(go[1]);
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  return st;
}

static std::string g_victim; /* the file a planted link points at */

static void plant_link(const std::string &name) {
  assert_int_equal(symlink(g_victim.c_str(), name.c_str()), 0);
}
static void plant_fifo(const std::string &name) { assert_int_equal(mkfifo(name.c_str(), 0600), 0); }

static void test_trace_refuses_links_and_fifos_per_process(void **state) {
  (void)state;
  std::string base = getenv("GPUGUARD_PLUGIN_TRACE");
  g_victim = base + ".victim";
  FILE *v = fopen(g_victim.c_str(), "w");
  assert_non_null(v);
  fputs("keep me\n", v);
  fclose(v);
  int st = trace_in_child(base, plant_link);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  char line[64] = "";
  v = fopen(g_victim.c_str(), "r");
  assert_non_null(v);
  assert_non_null(fgets(line, sizeof line, v));
  fclose(v);
  assert_string_equal(line, "keep me\n"); /* the link was not followed */
  st = trace_in_child(base, plant_fifo);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0); /* not killed by the alarm: no hang */
  /* Two processes: a file each, neither truncating the other's. */
  for (int i = 0; i < 2; i++) {
    st = trace_in_child(base, nullptr);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  size_t files = 0;
  std::string dir = base.substr(0, base.rfind('/'));
  DIR *d = opendir(dir.c_str());
  assert_non_null(d);
  for (struct dirent *e; (e = readdir(d));) {
    std::string n = std::string(dir) + "/" + e->d_name;
    struct stat sb;
    if (lstat(n.c_str(), &sb) == 0 && S_ISREG(sb.st_mode) && n != g_victim) {
      FILE *f = fopen(n.c_str(), "r");
      assert_non_null(f);
      assert_non_null(fgets(line, sizeof line, f));
      assert_int_equal(std::string(line).rfind("# gpuguard plugin trace, pid ", 0), 0);
      fclose(f);
      files++;
    }
    if (e->d_name[0] != '.') unlink(n.c_str());
  }
  closedir(d);
  assert_int_equal(files,
                   2); /* one per tracing process; nothing written through the link or FIFO */
}

int main(void) {
  setenv("GPUGUARD_HOST_POPULATE", "0", 1);
  char dir[] = "/tmp/gg-adapter-XXXXXX";
  assert_non_null(mkdtemp(dir));
  std::string trace = std::string(dir) + "/trace";
  setenv("GPUGUARD_PLUGIN_TRACE", trace.c_str(), 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_trace_refuses_links_and_fifos_per_process), /* first: no trace yet */
      cmocka_unit_test(test_default_pool_counts_each_block_once),
      cmocka_unit_test(test_use_arena_serves_the_default_pool),
      cmocka_unit_test(test_announced_capture_fills_its_pool),
      cmocka_unit_test(test_mem_pool_draws_from_the_given_arena),
      cmocka_unit_test(test_unannounced_capture_is_kept_for_its_graph),
      cmocka_unit_test(test_recorded_streams_hold_the_block_until_done),
      cmocka_unit_test(test_recorded_small_block_is_reused_once_done),
      cmocka_unit_test(test_pending_recorded_frees_cost_one_query_per_stream),
      cmocka_unit_test(test_out_of_memory_is_reported_and_counted),
      cmocka_unit_test(test_every_figure_has_pytorchs_meaning),
      cmocka_unit_test(test_roundup_power2_divisions),
      cmocka_unit_test(test_recorded_block_freed_in_a_capture_waits_for_its_end),
      cmocka_unit_test(test_checkpoint_round_trip),
      cmocka_unit_test(test_checkpoint_restore_refused_leaves_the_pool),
      cmocka_unit_test(test_trace_file_has_the_replay_format),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  rmdir(dir);
  return rc;
}
