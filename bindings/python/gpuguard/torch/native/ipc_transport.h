/* ipc_transport.h (gpuguard.torch) — the transport of CUDA IPC (ipc.h), without CUDA or PyTorch:
 * the sender's socket server, the receiver's fetch, and the receiver's cache of open handles. The
 * steps that touch the device (export, import) come in as function pointers, so that a unit test
 * drives the transport with descriptors of its own (tests/test_torch_ipc.cpp). */
#ifndef GG_TORCH_IPC_TRANSPORT_H
#define GG_TORCH_IPC_TRANSPORT_H

#include <atomic>
#include <cstddef>
#include <pthread.h>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

/* gg_arena_stats is a function and a struct tag: g++ -Wshadow objects (see adapter.h). */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif
#include "gpuguard/error.h"
#include "gpuguard/share.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace gg_torch {
namespace ipc {

/* A block another process may map: registered until the block is freed. */
struct Shared {
  void *ptr;
  size_t size;
  int device;
  gg_arena_t *arena;
};

/* The device's side of a share: gg_arena_export and gg_import_* in the backend, fakes that hand out
 * memfds in the unit test. Each returns 0 or a GG_E* code with last_error() saying why. */
struct Ops {
  /* The pieces under the block: how many, their bytes together, the block's offset in the first. */
  int (*measure)(const Shared &s, size_t *total, size_t *span, size_t *offset);
  int (*export_pieces)(const Shared &s, size_t first, gg_share_piece_t *pieces, size_t cap,
                       size_t *total, size_t *offset);
  int (*import_open)(void **imp, size_t size);
  int (*import_map)(void *imp, const gg_share_piece_t *piece);
  void *(*import_ptr)(void *imp);
  void (*import_close)(void *imp);
  const char *(*last_error)();
};

/* The body of a handle (after PyTorch's two framing bytes). */
struct Wire {
  char magic[8];
  uint32_t version;
  int32_t device;
  uint8_t cap[16]; /* the block's capability: whoever holds it may map the block */
  uint64_t id;
  uint64_t size;
  int32_t pid;
  char name[44]; /* the abstract socket's name, NUL-terminated */
};

/* The protocol: a request, the reply, then batches of pieces with their descriptors. */
/* Descriptors per message (SCM_RIGHTS allows 253): each side holds one batch at most, so that a
 * block of any size passes under a small descriptor limit. */
constexpr uint32_t kBatch = 32;

struct Request {
  uint64_t id;
  uint8_t cap[16];
};

struct Reply {
  int32_t status; /* 0, or an errno value with msg saying why */
  uint32_t n;     /* pieces that follow, in address order */
  uint64_t span;  /* their bytes together */
  uint64_t delta; /* the block's offset in the first one */
  char msg[200];
};

struct Batch {
  uint32_t k;     /* pieces (and descriptors) in this batch */
  int32_t status; /* 0, or an errno value with msg saying why the answer ends here */
  uint64_t sizes[kBatch];
  char msg[160];
};

/* The sender's end: registers blocks and serves their descriptors to receivers. */
class Server {
public:
  explicit Server(const Ops &ops) : ops_(ops) {}
  /* 0 with the handle's body in *wire (the block registered under *id, kept for its next share),
   * or an errno value with *why. */
  int share(uint64_t *id, const Shared &s, std::string *wire, std::string *why);
  /* The block is freed: a later request for it is refused. */
  void forget(uint64_t id);

private:
  /* Listens, unless listening already: 0, or an errno value with *why (tried again next time). */
  int start(std::string *why);
  /* The block a request names, if live and the capability matches; under mu_. */
  const Shared *find_locked(const Request &q) const;
  /* The reply to a request: 0, or an errno value with *why. */
  int measure(const Request &q, Reply *r, std::string *why);
  /* The batch of pieces from first on (b->k of them), exported: b->status says why not. */
  void export_batch(const Request &q, size_t first, size_t total, Batch *b,
                    gg_share_piece_t *pieces);
  void serve_loop(int listen_fd, int reserve);
  void serve(int conn);

  Ops ops_;
  std::mutex start_mu_; /* over name_ and listen_fd_ */
  std::mutex mu_;
  /* A registered block and its capability: random per block, so that a handle opens its own block
   * and no other (ids are small counters, easily guessed). */
  struct Entry {
    Shared s;
    uint8_t cap[16];
  };
  std::unordered_map<uint64_t, Entry> live_;
  uint64_t next_id_ = 1;
  std::string name_;
  int listen_fd_ = -1;
  std::atomic<int> active_{0}; /* connections being served */
};

/* The receiver's end: maps the block a handle's body names, waiting at most timeout_ms for each
 * message. 0 with the mapping in *imp (for ops.import_close) and the block's address in *ptr, or an
 * errno value with *why. */
int fetch(const Ops &ops, const std::string &wire, int timeout_ms, void **imp, void **ptr,
          std::string *why);

/* The receiver's open handles: the same handle opened twice shares one mapping (the driver refuses
 * a second cudaIpcOpenMemHandle of one allocation in a process); a handle is forgotten once its
 * mapping's last user drops it. */
class Cache {
public:
  using Make = std::function<std::shared_ptr<void>()>;
  /* The mapping of key, made by make() unless one is open; make's exception passes through. */
  std::shared_ptr<void> open(const std::string &key, const Make &make);
  /* Entries held (for the unit test). */
  size_t size();

private:
  /* A handle being opened (done false) or open. */
  struct Slot {
    bool done = false;
    std::weak_ptr<void> ptr;
    std::exception_ptr error;
  };
  /* A condition variable over pthreads: std::condition_variable::wait binds GLIBCXX_3.4.30 when
   * built with GCC 12, newer than the libstdc++ the PyTorch wheels ask for (3.4.22), so a prebuilt
   * backend using it would not load where PyTorch does. */
  class Cond {
  public:
    Cond() { pthread_cond_init(&c_, nullptr); }
    ~Cond() { pthread_cond_destroy(&c_); }
    Cond(const Cond &) = delete;
    Cond &operator=(const Cond &) = delete;
    template <class Pred> void wait(std::unique_lock<std::mutex> &lock, Pred done) {
      while (!done()) {
        pthread_cond_wait(&c_, lock.mutex()->native_handle());
      }
    }
    void notify_all() { pthread_cond_broadcast(&c_); }

  private:
    pthread_cond_t c_;
  };
  struct State {
    std::mutex mu;
    Cond cv; /* a slot is done, or gone */
    std::map<std::string, std::shared_ptr<Slot>> slots;
  };
  std::shared_ptr<void> track(const std::string &key, const std::shared_ptr<Slot> &slot,
                              std::shared_ptr<void> mapping);
  std::shared_ptr<State> st_ = std::make_shared<State>();
};

} // namespace ipc
} // namespace gg_torch

#endif
