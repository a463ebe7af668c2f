/* adapter_checkpoint.cpp (gpuguard.torch) — checkpoints of a private pool for CUDA-graph trees
 * (torch.compile mode="reduce-overhead"): the live blocks at one moment, and the pool put back to
 * them — the blocks live then at their addresses again (gg_alloc_at), all others freed. */
#include "adapter.h"

#include <algorithm>

namespace gg_torch {

namespace {

bool serves(const Pool &p, gg_arena_t *a) {
  if (p.given == a) {
    return true;
  }
  for (const auto &sa : p.arenas) {
    if (sa.second == a) {
      return true;
    }
  }
  return false;
}

} // namespace

Checkpoint Adapter::checkpoint(int device, PoolId id) {
  Checkpoint c;
  c.id = id;
  c.device = device;
  std::lock_guard<std::mutex> g(mu_);
  for (const auto &kv : blocks_) {
    const Block &b = kv.second;
    if (b.device == device && b.pool && b.pool->id == id) {
      c.live.push_back(Checkpoint::Live{kv.first, b.requested, b.size, b.stream, b.arena});
    }
  }
  std::sort(c.live.begin(), c.live.end(),
            [](const Checkpoint::Live &x, const Checkpoint::Live &y) { return x.ptr < y.ptr; });
  return c;
}

/* The pool's blocks, taken out of the table and given back to their arenas (counted as freed). */
std::vector<std::pair<void *, Block>> Adapter::free_pool_locked(Pool &p) {
  std::vector<std::pair<void *, Block>> out;
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    if (it->second.pool != &p) {
      ++it;
      continue;
    }
    account_locked(it->second, false);
    p.live--;
    out.emplace_back(it->first, std::move(it->second));
    it = blocks_.erase(it);
  }
  std::sort(out.begin(), out.end(),
            [](const std::pair<void *, Block> &x, const std::pair<void *, Block> &y) {
              return x.first < y.first;
            });
  for (auto &pb : out) {
    Block &b = pb.second;
    int rc = p.given ? gg_free_on(b.arena, pb.first, b.stream) : gg_free(b.arena, pb.first);
    GG_TORCH_ASSERT(rc == 0); /* a block of the table is live in its arena */
    (void)rc;
  }
  return out;
}

/* Block `b` at `ptr` again, exactly there: 0, or gg_alloc_at's error (nothing changed). */
int Adapter::place_locked(Pool &p, void *ptr, Block b) {
  int rc = gg_alloc_at(b.arena, ptr, b.size);
  if (rc < 0) {
    return rc;
  }
  account_locked(b, true);
  p.live++;
  bool fresh = insert_locked(ptr, std::move(b));
  GG_TORCH_ASSERT(fresh);
  (void)fresh;
  return 0;
}

/* Under the adapter's lock throughout: nothing else allocates from the pool meanwhile. On a
 * failure half-way the pool is put back as it was before the call. */
int Adapter::restore(const Checkpoint &c, std::vector<void *> *freed, std::vector<void *> *made) {
  freed->clear();
  made->clear();
  std::lock_guard<std::mutex> g(mu_);
  auto pit = pools_.find(c.id);
  if (pit == pools_.end() || pit->second->device != c.device) {
    return GG_ENOTFOUND;
  }
  Pool &p = *pit->second;
  if (p.custom) {
    return GG_ENOTSUP;
  }
  for (const Checkpoint::Live &l : c.live) {
    if (!l.arena || !serves(p, l.arena)) {
      return GG_ESTATE; /* its arena went with an empty_cache, or the pool was made anew */
    }
  }
  std::vector<std::pair<void *, Block>> was = free_pool_locked(p);
  int rc = 0;
  size_t k = 0;
  for (; k < c.live.size() && rc == 0; k++) {
    const Checkpoint::Live &l = c.live[k];
    Block b;
    b.requested = l.requested;
    b.size = l.size;
    b.stream = l.stream;
    b.pool = &p;
    b.arena = l.arena;
    b.device = c.device;
    rc = place_locked(p, l.ptr, std::move(b));
  }
  if (rc < 0) {
    free_pool_locked(p); /* what was placed so far, then the blocks live before, as they were */
    for (auto &pb : was) {
      if (place_locked(p, pb.first, std::move(pb.second)) < 0) {
        GG_TORCH_ASSERT(false); /* just freed: free */
      }
    }
    return GG_ESTATE;
  }
  for (const auto &pb : was) {
    freed->push_back(pb.first);
  }
  for (const Checkpoint::Live &l : c.live) {
    made->push_back(l.ptr);
  }
  return 0;
}

} // namespace gg_torch
