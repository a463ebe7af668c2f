/* test_torch_custom.cpp — MemPools with their own allocator in the torch-free core of gpuguard's
 * PyTorch backend (bindings/python/gpuguard/torch/native/adapter_custom.cpp), on the host backend
 * with a fake allocator that counts its calls and hands out addresses nobody reads: segments of
 * PyTorch's sizes, blocks cached and coalesced in them, segments given back only whole, the memory
 * fraction over the arena and the segments together (PyTorch's test_mempool_limited_memory_with_
 * allocator, replayed here), and bad frees answered with an error. No PyTorch, no GPU. */
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

#include "torch/native/adapter.h"
#include "gg_test.hpp"

using gg_torch::Adapter;
using gg_torch::kAll;
using gg_torch::PoolId;
using gg_torch::Stream;

namespace {

constexpr size_t MiB = size_t(1) << 20;
constexpr PoolId kPoolA{1, 1};
constexpr PoolId kPoolB{1, 2};

/* ---- a runtime with no captures, and device synchronisations counted */

int g_device_syncs = 0;
int no_capture(Stream, uint64_t *id) { return *id = 0, 0; }
int retain(Stream, void (*)(void *), void *) { return 0; }
int stream_sync(Stream) { return 0; }
int device_sync(int) { return ++g_device_syncs, 0; }
void relax(bool, int *) {}
int event_record(int, Stream, void **ev) { return *ev = nullptr, 0; }
int event_query(void *) { return 1; }
void event_destroy(void *) {}

gg_torch::Runtime runtime() {
  return gg_torch::Runtime{no_capture, retain,       stream_sync, device_sync,
                           relax,      event_record, event_query, event_destroy};
}

gg_arena_options_t host(size_t capacity) { return gg_test_host_options(capacity, 2 * MiB); }

/* ---- the fake allocator: addresses from a counter (never read), 1 MiB apart, every call kept */

struct Fake {
  uintptr_t next = uintptr_t(0x7e0000000000);
  std::set<uintptr_t> live;
  std::vector<size_t> asked; /* the size of each alloc call */
  int frees = 0;
  bool fail = false;
  int throw_frees = 0; /* the next frees that throw (as c10::Error out of PyTorch would) */
} g_fake;

std::shared_ptr<gg_torch::Custom> fake() {
  auto c = std::make_shared<gg_torch::Custom>();
  c->alloc = [](size_t n, Stream) -> void * {
    g_fake.asked.push_back(n);
    if (g_fake.fail) {
      return nullptr;
    }
    uintptr_t at = g_fake.next;
    g_fake.next += n + MiB;
    g_fake.live.insert(at);
    return reinterpret_cast<void *>(at);
  };
  c->free = [](void *p) {
    g_fake.frees++;
    assert_int_equal(g_fake.live.erase(reinterpret_cast<uintptr_t>(p)), 1);
    if (g_fake.throw_frees > 0) {
      g_fake.throw_frees--;
      throw std::runtime_error("the allocator's free failed");
    }
  };
  return c;
}

int reset(void **state) {
  (void)state;
  g_fake = Fake{};
  g_device_syncs = 0;
  return 0;
}

/* An allocation inside use_mem_pool(pool): announced, then the use given back, as PyTorch does. */
int in_pool(Adapter &ad, PoolId id, size_t n, void **p, Stream s = nullptr) {
  ad.begin_capture(0, id, [](Stream) { return true; });
  PoolId got;
  int rc = ad.alloc(n, 0, s, nullptr, p, &got);
  gg_assert_ok(ad.end_capture(0, id));
  ad.release_pool(0, id);
  if (rc == 0) {
    assert_true(got == id);
  }
  return rc;
}

void *in_pool(Adapter &ad, PoolId id, size_t n, Stream s = nullptr) {
  void *p = nullptr;
  gg_assert_ok(in_pool(ad, id, n, &p, s));
  return p;
}

void release(Adapter &ad, void *p) {
  gg_torch::Freed f;
  gg_assert_ok(ad.free(p, &f));
}

uintptr_t at(void *p) { return reinterpret_cast<uintptr_t>(p); }

int64_t reserved(Adapter &ad) { return ad.stats(0).reserved_bytes[kAll].current; }

} // namespace

/* PyTorch's segment sizes; small and large blocks in segments of their own class; a block of
 * another stream in a segment of its own. */
static void test_segments_take_pytorchs_sizes(void **state) {
  (void)state;
  assert_int_equal(gg_torch::segment_bytes(512), 2 * MiB);
  assert_int_equal(gg_torch::segment_bytes(MiB), 2 * MiB);
  assert_int_equal(gg_torch::segment_bytes(MiB + 512), 20 * MiB);
  assert_int_equal(gg_torch::segment_bytes(10 * MiB - 512), 20 * MiB);
  assert_int_equal(gg_torch::segment_bytes(10 * MiB), 10 * MiB);
  assert_int_equal(gg_torch::segment_bytes(11 * MiB - 512), 12 * MiB);
  assert_int_equal(gg_torch::segment_bytes(40 * MiB), 40 * MiB);

  Adapter ad(runtime(), host(64 * MiB));
  ad.create_or_incref(0, kPoolA, fake());
  void *s1 = in_pool(ad, kPoolA, 1000);
  void *s2 = in_pool(ad, kPoolA, 100); /* 512 bytes, right after the first 1024 */
  void *l1 = in_pool(ad, kPoolA, 3 * MiB);
  void *l2 = in_pool(ad, kPoolA, 18 * MiB); /* more than l1's segment has left */
  void *o1 = in_pool(ad, kPoolA, 1000, reinterpret_cast<Stream>(0x51));
  assert_int_equal(at(s2), at(s1) + 1024);
  assert_true(g_fake.asked == (std::vector<size_t>{2 * MiB, 20 * MiB, 18 * MiB, 2 * MiB}));
  assert_int_equal(reserved(ad), 42 * MiB);
  assert_int_equal(ad.stats(0).segment[kAll].current, 4);
  assert_int_equal(ad.stats(0).allocated_bytes[kAll].current, 1024 + 512 + 21 * MiB + 1024);
  gg_assert_ok(ad.check());
  for (void *p : {s1, s2, l1, l2, o1}) {
    release(ad, p);
  }
  assert_int_equal(g_fake.frees, 0);
  gg_assert_ok(ad.check());
}

/* A freed block stays in its segment (no allocator call) and is handed out again at its address;
 * the free ranges join their neighbours. */
static void test_freed_blocks_are_cached_and_coalesce(void **state) {
  (void)state;
  Adapter ad(runtime(), host(64 * MiB));
  ad.create_or_incref(0, kPoolA, fake());
  void *x = in_pool(ad, kPoolA, 4 * MiB); /* one 20 MiB segment: x, y, z from its start */
  void *y = in_pool(ad, kPoolA, 4 * MiB);
  void *z = in_pool(ad, kPoolA, 4 * MiB);
  assert_int_equal(at(y), at(x) + 4 * MiB);
  assert_int_equal(at(z), at(x) + 8 * MiB);
  release(ad, y);
  assert_int_equal(g_fake.frees, 0);
  assert_ptr_equal(in_pool(ad, kPoolA, 4 * MiB), y);
  release(ad, x);
  release(ad, z); /* joins the 8 MiB after it: 12 MiB free from z on */
  gg_assert_ok(ad.check());
  void *w = in_pool(ad, kPoolA, 8 * MiB); /* x's 4 MiB are too few: first fit is z's */
  assert_ptr_equal(w, z);
  release(ad, w);
  release(ad, y); /* joins both sides: the segment is one free range again */
  void *all = in_pool(ad, kPoolA, 20 * MiB);
  assert_ptr_equal(all, x);
  assert_int_equal(g_fake.asked.size(), 1);
  release(ad, all);
  gg_assert_ok(ad.check());
}

/* empty_cache gives back the wholly free segments of a pool asked by its id (after a device
 * synchronisation), never one with a live block; empty_cache() of all leaves a pool in use whole,
 * as PyTorch's does. The figures follow: reserved = segments held. */
static void test_empty_cache_gives_back_only_free_segments(void **state) {
  (void)state;
  Adapter ad(runtime(), host(64 * MiB));
  ad.create_or_incref(0, kPoolA, fake());
  void *big = in_pool(ad, kPoolA, 4 * MiB);
  void *small = in_pool(ad, kPoolA, 4096);
  release(ad, small);
  gg_assert_ok(ad.empty_cache(PoolId{}));
  assert_int_equal(g_fake.frees, 0);
  assert_int_equal(reserved(ad), 22 * MiB);
  gg_assert_ok(ad.empty_cache(kPoolA));
  assert_int_equal(g_fake.frees, 1);
  assert_int_equal(g_device_syncs, 1);
  assert_int_equal(g_fake.live.count(at(big)), 1);
  gg_torch::DeviceStats st = ad.stats(0);
  assert_int_equal(st.reserved_bytes[kAll].current, 20 * MiB);
  assert_int_equal(st.reserved_bytes[kAll].freed, 2 * MiB);
  assert_int_equal(st.segment[kAll].current, 1);
  assert_int_equal(st.num_device_alloc, 2);
  assert_int_equal(st.num_device_free, 1);
  assert_int_equal(st.inactive_split_bytes[kAll].current, 16 * MiB); /* the rest of big's */
  release(ad, big);
  gg_assert_ok(ad.empty_cache(kPoolA));
  assert_int_equal(g_fake.frees, 2);
  assert_int_equal(reserved(ad), 0);
  gg_assert_ok(ad.check());
}

/* A pool released (use count 0, no live block) gives its segments back with it. */
static void test_released_pool_frees_its_segments(void **state) {
  (void)state;
  Adapter ad(runtime(), host(64 * MiB));
  ad.create_or_incref(0, kPoolA, fake());
  void *p = in_pool(ad, kPoolA, 4 * MiB);
  void *q = in_pool(ad, kPoolA, 4096);
  std::vector<gg_torch::Range> rs = ad.ranges(kPoolA); /* snapshots: its segments */
  assert_int_equal(rs.size(), 2);
  assert_true(rs[0].custom && rs[0].owner == kPoolA);
  ad.release_pool(0, kPoolA);
  assert_int_equal(ad.release_freeable(0), 0); /* live blocks keep it */
  release(ad, p);
  release(ad, q);
  assert_int_equal(ad.release_freeable(0), 1);
  assert_int_equal(g_fake.frees, 2);
  assert_true(g_fake.live.empty());
  assert_int_equal(reserved(ad), 0);
  assert_int_equal(ad.pool_use_count(kPoolA), 0);
  gg_assert_ok(ad.check());
}

/* PyTorch's test_mempool_limited_memory_with_allocator at the adapter's level: the fraction is
 * 80 MiB over what the device holds (a byte short, as the fraction's product can be); two custom
 * pools take 40 MiB each; the default pool has no room left, and falls back on the cached segment
 * of the use_on_oom pool only. */
static void test_fraction_bounds_the_segments(void **state) {
  (void)state;
  Adapter ad(runtime(), host(256 * MiB));
  void *held = nullptr;
  PoolId id;
  gg_assert_ok(ad.alloc(6 * MiB, 0, nullptr, nullptr, &held, &id));
  size_t limit = size_t(reserved(ad)) + 80 * MiB - 1;
  gg_assert_ok(ad.set_limit(0, limit));
  ad.create_or_incref(0, kPoolA, fake()); /* pool_do_not_use */
  ad.create_or_incref(0, kPoolB, fake()); /* pool_use */
  ad.set_use_on_oom(0, kPoolB, true);
  void *a = in_pool(ad, kPoolA, 40 * MiB);
  void *b = in_pool(ad, kPoolB, 40 * MiB);
  size_t arena_limit = 0;
  gg_assert_ok(gg_arena_get_limit(ad.device_arena_if_any(0), &arena_limit));
  assert_true(arena_limit + 80 * MiB <= limit); /* the arena leaves the segments their room */
  void *c = nullptr;
  assert_int_equal(ad.alloc(40 * MiB, 0, nullptr, nullptr, &c, &id), GG_ENOMEM);
  release(ad, a);
  release(ad, b);
  int uses = ad.pool_use_count(kPoolB);
  gg_assert_ok(ad.alloc(30 * MiB, 0, nullptr, nullptr, &c, &id));
  assert_ptr_equal(c, b); /* in pool_use's cached segment */
  assert_true(id == kPoolB);
  /* The fallback held a use on each pool it tried (none freed under it), and gave every one back.
   */
  assert_int_equal(ad.pool_use_count(kPoolB), uses);
  assert_int_equal(ad.pool_use_count(kPoolA), uses);
  void *d = nullptr;
  assert_int_equal(ad.alloc(30 * MiB, 0, nullptr, nullptr, &d, &id), GG_ENOMEM);
  assert_int_equal(in_pool(ad, kPoolB, 30 * MiB, &d), GG_ENOMEM); /* a new segment: no room */
  release(ad, c);
  void *e = in_pool(ad, kPoolB, 20 * MiB);
  assert_ptr_equal(e, c);
  assert_int_equal(g_fake.asked.size(), 2);
  release(ad, e);
  ad.release_pool(0, kPoolB); /* the MemPools' destructors */
  gg_assert_ok(ad.empty_cache(kPoolB));
  ad.release_pool(0, kPoolA);
  gg_assert_ok(ad.empty_cache(kPoolA));
  assert_int_equal(g_fake.frees, 2);
  gg_assert_ok(gg_arena_get_limit(ad.device_arena_if_any(0), &arena_limit));
  assert_true(arena_limit + 2 * MiB > limit); /* the room back, to the arena's granularity */
  release(ad, held);
  gg_assert_ok(ad.check());
}

/* The out-of-memory fallback tries the use_on_oom pools in turn: a custom pool's block served after
 * a pool with its own arena had no room is a custom allocator's block, tied to no arena (the arena
 * the failed try used would be handed to IPC and freed into). */
static void test_oom_fallback_custom_block_has_no_arena(void **state) {
  (void)state;
  Adapter ad(runtime(), host(64 * MiB));
  ad.create_or_incref(0, kPoolA, nullptr); /* its own arena, tried first */
  ad.create_or_incref(0, kPoolB, fake());
  ad.set_use_on_oom(0, kPoolA, true);
  ad.set_use_on_oom(0, kPoolB, true);
  release(ad, in_pool(ad, kPoolB, 100 * MiB)); /* a cached segment larger than any arena */
  void *c = nullptr;
  PoolId id;
  gg_assert_ok(ad.alloc(100 * MiB, 0, nullptr, nullptr, &c, &id));
  assert_true(id == kPoolB);
  gg_arena_t *arena = nullptr;
  size_t size = 0;
  int device = 0;
  uint64_t ipc = 0;
  assert_int_equal(ad.share_info(c, &arena, &size, &device, &ipc), GG_ENOTSUP);
  release(ad, c);
  gg_assert_ok(ad.check());
  ad.release_pool(0, kPoolA);
  ad.release_pool(0, kPoolB);
  gg_assert_ok(ad.empty_cache(PoolId{}));
  assert_int_equal(g_fake.frees, 1);
}

/* The fraction covers the private pools' own arenas too (PyTorch's memory_reserved() counts them,
 * and a fraction is set over it): memory a graph's pool maps is no room for the default pool; once
 * that pool is gone, an allocation out of memory counts again and gets the room back. */
static void test_fraction_counts_private_pools(void **state) {
  (void)state;
  Adapter ad(runtime(), host(256 * MiB));
  void *held = nullptr;
  PoolId id;
  gg_assert_ok(ad.alloc(6 * MiB, 0, nullptr, nullptr, &held, &id));
  ad.create_or_incref(0, kPoolA, nullptr); /* a graph's pool: an arena of its own */
  void *g = in_pool(ad, kPoolA, 30 * MiB);
  size_t limit = size_t(reserved(ad)) + 20 * MiB;
  gg_assert_ok(ad.set_limit(0, limit));
  void *p = nullptr;
  assert_int_equal(ad.alloc(30 * MiB, 0, nullptr, nullptr, &p, &id), GG_ENOMEM);
  gg_assert_ok(ad.alloc(16 * MiB, 0, nullptr, nullptr, &p, &id));
  assert_true(size_t(reserved(ad)) <= limit);
  release(ad, g);
  ad.release_pool(0, kPoolA); /* the graph is gone: its pool is freeable */
  void *q = nullptr;
  gg_assert_ok(
      ad.alloc(30 * MiB, 0, nullptr, nullptr, &q, &id)); /* its room is the arena's again */
  assert_true(size_t(reserved(ad)) <= limit);
  release(ad, q);
  release(ad, p);
  release(ad, held);
  gg_assert_ok(ad.check());
}

/* Bad input is an error, never a crash: a block freed twice, an address inside a segment that is
 * no block, an address of nobody's; an allocator that fails leaves nothing counted. */
static void test_bad_frees_and_failed_allocators(void **state) {
  (void)state;
  Adapter ad(runtime(), host(64 * MiB));
  gg_assert_ok(ad.set_limit(0, 64 * MiB));
  ad.create_or_incref(0, kPoolA, fake());
  void *p = in_pool(ad, kPoolA, 4 * MiB);
  gg_torch::Freed f;
  assert_int_equal(ad.free(static_cast<char *>(p) + 512, &f), GG_ENOTFOUND);
  int local = 0;
  assert_int_equal(ad.free(&local, &f), GG_ENOTFOUND);
  release(ad, p);
  assert_int_equal(ad.free(p, &f), GG_ENOTFOUND);
  gg_assert_ok(ad.check());
  g_fake.fail = true;
  void *q = nullptr;
  assert_int_equal(in_pool(ad, kPoolA, 22 * MiB, &q), GG_ENOMEM); /* asked: it fails */
  assert_null(q);
  assert_int_equal(in_pool(ad, kPoolA, 50 * MiB, &q), GG_ENOMEM); /* over the limit: not asked */
  assert_int_equal(g_fake.asked.size(), 2);
  assert_int_equal(reserved(ad), 20 * MiB);
  gg_assert_ok(ad.check());
}

/* An allocator's free that throws (a c10::Error out of PyTorch) neither stops the other segments
 * going back nor leaves them counted: the error comes out of empty_cache once the figures and the
 * arena's limit are right again. */
static void test_a_throwing_free_leaves_nothing_counted(void **state) {
  (void)state;
  Adapter ad(runtime(), host(64 * MiB));
  size_t limit = 40 * MiB;
  gg_assert_ok(ad.set_limit(0, limit));
  void *held = nullptr;
  PoolId id;
  gg_assert_ok(ad.alloc(2 * MiB, 0, nullptr, nullptr, &held, &id)); /* the arena is made */
  ad.create_or_incref(0, kPoolA, fake());
  release(ad, in_pool(ad, kPoolA, 4 * MiB));
  release(ad, in_pool(ad, kPoolA, 4096));
  assert_int_equal(reserved(ad), 2 * MiB + 22 * MiB);
  g_fake.throw_frees = 1;
  bool threw = false;
  try {
    ad.empty_cache(kPoolA);
  } catch (const std::runtime_error &) {
    threw = true;
  }
  assert_true(threw);
  assert_int_equal(g_fake.frees, 2); /* the second segment went back too */
  assert_true(g_fake.live.empty());
  assert_int_equal(reserved(ad), 2 * MiB);
  gg_assert_ok(ad.check());
  size_t arena_limit = 0;
  gg_assert_ok(gg_arena_get_limit(ad.device_arena_if_any(0), &arena_limit));
  assert_int_equal(arena_limit, limit); /* the room back: no segment is held any more */
  release(ad, held);
  gg_assert_ok(ad.check());
}

/* A segment goes back to the allocator that gave it, even when the pool got another allocator
 * while that call was under way (it had no segment then, so create_or_incref took the new one). */
static void test_a_segment_goes_back_to_its_allocator(void **state) {
  (void)state;
  Adapter ad(runtime(), host(64 * MiB));
  int other_frees = 0;
  std::shared_ptr<gg_torch::Custom> other = fake();
  other->free = [&other_frees](void *) { other_frees++; };
  std::shared_ptr<gg_torch::Custom> mine = fake();
  auto inner = mine->alloc;
  mine->alloc = [&ad, inner, other](size_t n, Stream s) {
    ad.create_or_incref(0, kPoolA, other); /* another MemPool of the same id, meanwhile */
    return inner(n, s);
  };
  ad.create_or_incref(0, kPoolA, mine);
  mine.reset();
  release(ad, in_pool(ad, kPoolA, 4096));
  ad.release_pool(0, kPoolA);
  ad.release_pool(0, kPoolA);
  gg_assert_ok(ad.empty_cache(kPoolA));
  assert_int_equal(other_frees, 0);
  assert_int_equal(g_fake.frees, 1);
  assert_true(g_fake.live.empty());
  gg_assert_ok(ad.check());
}

int main(void) {
  setenv("GPUGUARD_HOST_POPULATE", "0", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_segments_take_pytorchs_sizes, reset),
      cmocka_unit_test_setup(test_freed_blocks_are_cached_and_coalesce, reset),
      cmocka_unit_test_setup(test_empty_cache_gives_back_only_free_segments, reset),
      cmocka_unit_test_setup(test_released_pool_frees_its_segments, reset),
      cmocka_unit_test_setup(test_fraction_bounds_the_segments, reset),
      cmocka_unit_test_setup(test_fraction_counts_private_pools, reset),
      cmocka_unit_test_setup(test_oom_fallback_custom_block_has_no_arena, reset),
      cmocka_unit_test_setup(test_bad_frees_and_failed_allocators, reset),
      cmocka_unit_test_setup(test_a_throwing_free_leaves_nothing_counted, reset),
      cmocka_unit_test_setup(test_a_segment_goes_back_to_its_allocator, reset),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
