/* _native_ipc.h (gpuguard.torch) — CUDA IPC for gpuguard's PyTorch backend: a CUDA tensor sent through
 * a torch.multiprocessing queue arrives in the other process.
 *
 * Arena memory is made with cuMemCreate, which cudaIpcGetMemHandle cannot share. Its physical
 * allocations are exported instead as POSIX file descriptors (the arena asks for exportable memory),
 * and descriptors only travel between processes over a Unix socket (SCM_RIGHTS). So the first share
 * starts one thread in the sender that listens on an abstract socket of a random name; the handle
 * PyTorch pickles names that socket, a random secret and the block. The receiver connects, proves
 * the secret, and gets the block's mappings (sizes, and one descriptor each), which it imports and
 * maps into a reservation of its own. Both ends check that the peer is the same user.
 *
 * Descriptors are exported at the receiver's request and closed once sent, so a sender holds no
 * descriptor for what it shares. Once exported, a descriptor keeps its physical memory alive by
 * itself: a block freed and trimmed while a receiver still maps it stays valid in the receiver.
 * (PyTorch keeps the sender's block alive until every receiver dropped it: see CudaIPCSentData.)
 *
 * Memory that is not made by cuMemCreate (the cuMemAlloc fallback on devices without virtual memory
 * management) is shared the legacy way, with cudaIpcGetMemHandle, in the handle format PyTorch's own
 * allocator writes; handles of that format from a process on PyTorch's own allocator are opened
 * here too. */
#ifndef GPUGUARD_TORCH_NATIVE_IPC_H
#define GPUGUARD_TORCH_NATIVE_IPC_H

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gpuguard/arena.h"

#if __has_include(<cuda.h>)
#include <cuda.h>
#define GG_IPC_HAVE_DRIVER 1
#else
#define GG_IPC_HAVE_DRIVER 0
#endif

/* TORCH_CHECK's failure path (c10::detail::torchCheckFail, in libc10) took the process down when it ran
 * from this library on the H200 (torch 2.11: a segfault instead of the exception), while an exception
 * this library throws itself reaches PyTorch's handlers. So checks throw here, with the same type and
 * message. */
#define GG_CHECK(cond, ...)                                 \
  do {                                                      \
    if (C10_UNLIKELY(!(cond))) {                            \
      C10_THROW_ERROR(Error, ::c10::str(__VA_ARGS__));      \
    }                                                       \
  } while (0)

namespace gg_ipc {

constexpr char kVersion = 2;    /* the framing byte PyTorch's handles start with */
constexpr char kLegacy = 'c';   /* PyTorch's: a cudaIpcMemHandle_t follows */
constexpr char kGpuguard = 'g'; /* ours: a Wire follows */
constexpr size_t kLegacySize = 2 + sizeof(cudaIpcMemHandle_t);
constexpr uint32_t kBatch = 64;      /* descriptors per message (SCM_RIGHTS allows 253) */
constexpr uint32_t kMaxMappings = 1u << 20;
constexpr int kTimeoutSec = 20;

struct Wire {
  char magic[8];
  uint32_t version;
  int32_t device;
  uint64_t secret;
  uint64_t id;
  uint64_t size;
  int32_t pid;
  char name[44]; /* the abstract socket's name, NUL-terminated */
};

struct Request {
  uint64_t secret;
  uint64_t id;
};

struct Reply {
  int32_t status; /* 0, or an errno value with msg saying why */
  uint32_t n;     /* mappings that follow, in address order */
  uint64_t span;  /* their bytes together */
  uint64_t delta; /* the block's offset in the first one */
  char msg[200];
};

struct Batch {
  uint32_t k;
  uint64_t sizes[kBatch];
};

inline std::string errno_text(int e) {
  char buf[128];
  return std::string(strerror_r(e, buf, sizeof buf));
}

#if GG_IPC_HAVE_DRIVER

/* The driver calls IPC needs, from the libcuda the process loaded already. */
struct Driver {
  decltype(&cuMemExportToShareableHandle) exportFd = nullptr;
  decltype(&cuMemImportFromShareableHandle) importFd = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) unreserve = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemSetAccess) access = nullptr;
  decltype(&cuGetErrorName) errname = nullptr;
  std::string why;

  static Driver &get() {
    static Driver d = load();
    return d;
  }

  std::string text(CUresult r) const {
    const char *s = nullptr;
    if (errname && errname(r, &s) == CUDA_SUCCESS && s) {
      return s;
    }
    return "CUresult " + std::to_string(int(r));
  }

 private:
  template <typename F>
  static void sym(void *lib, const char *name, F &out, std::string &why) {
    out = reinterpret_cast<F>(dlsym(lib, name));
    if (!out && why.empty()) {
      why = std::string("the CUDA driver has no ") + name;
    }
  }

  static Driver load() {
    Driver d;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) {
      lib = dlopen("libcuda.so.1", RTLD_NOW);
    }
    if (!lib) {
      d.why = "libcuda.so.1 cannot be loaded";
      return d;
    }
    sym(lib, "cuMemExportToShareableHandle", d.exportFd, d.why);
    sym(lib, "cuMemImportFromShareableHandle", d.importFd, d.why);
    sym(lib, "cuMemAddressReserve", d.reserve, d.why);
    sym(lib, "cuMemAddressFree", d.unreserve, d.why);
    sym(lib, "cuMemMap", d.map, d.why);
    sym(lib, "cuMemUnmap", d.unmap, d.why);
    sym(lib, "cuMemRelease", d.release, d.why);
    sym(lib, "cuMemSetAccess", d.access, d.why);
    sym(lib, "cuGetErrorName", d.errname, d.why);
    return d;
  }
};

/* ---- the sender -------------------------------------------------------------------------------- */

/* A block another process may map: it stays registered until the block is freed. */
struct Shared {
  void *ptr;
  size_t size;
  int device;
  gg_arena_t *arena;
};

struct Mapping {
  void *ptr;
  size_t size;
  uint64_t handle;
};

inline int collect_mapping(const gg_mapping_info_t *m, void *user) {
  static_cast<std::vector<Mapping> *>(user)->push_back(Mapping{m->ptr, m->size, m->handle});
  return 0;
}

inline std::vector<Mapping> mappings_of(gg_arena_t *a, void *ptr, size_t size) {
  std::vector<Mapping> out;
  int rc = gg_arena_foreach_mapping(a, ptr, size, collect_mapping, &out);
  GG_CHECK(rc == 0, "gpuguard: the memory of ", ptr, " cannot be shared: ", gg_last_error());
  return out;
}

inline bool same_user(int fd) {
  struct ucred cred {};
  socklen_t len = sizeof cred;
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == geteuid();
}

inline void set_timeouts(int fd) {
  struct timeval tv {};
  tv.tv_sec = kTimeoutSec;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

inline sockaddr_un address_of(const char *name, socklen_t *len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  size_t n = strnlen(name, sizeof a.sun_path - 2);
  memcpy(a.sun_path + 1, name, n); /* abstract: a leading NUL, no file */
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

/* Sends n descriptors in batches, each with the sizes of its mappings. */
inline bool send_fds(int conn, const std::vector<uint64_t> &sizes, const std::vector<int> &fds) {
  for (size_t at = 0; at < fds.size(); at += kBatch) {
    Batch b{};
    b.k = uint32_t(std::min<size_t>(kBatch, fds.size() - at));
    for (uint32_t i = 0; i < b.k; i++) {
      b.sizes[i] = sizes[at + i];
    }
    char ctrl[CMSG_SPACE(sizeof(int) * kBatch)];
    memset(ctrl, 0, sizeof ctrl);
    iovec iov{&b, sizeof b};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctrl;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * b.k);
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * b.k);
    memcpy(CMSG_DATA(c), fds.data() + at, sizeof(int) * b.k);
    if (sendmsg(conn, &m, MSG_NOSIGNAL) != ssize_t(sizeof b)) {
      return false;
    }
  }
  return true;
}

class Exporter {
 public:
  /* The handle for a block (registered under *id, which is kept for the block's next share). */
  std::string share(uint64_t *id, const Shared &s) {
    start();
    Wire w{};
    {
      std::lock_guard<std::mutex> g(mu_);
      if (*id == 0) {
        *id = next_id_++;
      }
      live_[*id] = s;
      memcpy(w.magic, "gpuguard", 8);
      w.version = 1;
      w.device = s.device;
      w.secret = secret_;
      w.id = *id;
      w.size = s.size;
      w.pid = int32_t(getpid());
      snprintf(w.name, sizeof w.name, "%s", name_.c_str());
    }
    std::string h(2, '\0');
    h[0] = kVersion;
    h[1] = kGpuguard;
    h.append(reinterpret_cast<const char *>(&w), sizeof w);
    return h;
  }

  /* The block is freed: a later request for it is refused. */
  void forget(uint64_t id) {
    std::lock_guard<std::mutex> g(mu_);
    live_.erase(id);
  }

 private:
  void start() {
    std::call_once(started_, [this] { listen_now(); });
    GG_CHECK(listen_fd_ >= 0, "gpuguard: cannot share CUDA memory with other processes: ", why_);
  }

  void listen_now() {
    uint64_t rnd[2] = {0, 0};
    if (getrandom(rnd, sizeof rnd, 0) != ssize_t(sizeof rnd)) {
      why_ = "getrandom: " + errno_text(errno);
      return;
    }
    secret_ = rnd[0];
    char name[44];
    snprintf(name, sizeof name, "gpuguard-ipc-%d-%016llx", int(getpid()), (unsigned long long)rnd[1]);
    name_ = name;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    socklen_t len = 0;
    sockaddr_un a = address_of(name, &len);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr *>(&a), len) != 0 || listen(fd, 64) != 0) {
      why_ = std::string("a Unix socket for CUDA IPC: ") + errno_text(errno);
      if (fd >= 0) {
        close(fd);
      }
      return;
    }
    listen_fd_ = fd;
    std::thread([this] { serve_loop(); }).detach(); /* lives as long as the process */
  }

  void serve_loop() {
    for (;;) {
      int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
          continue;
        }
        return;
      }
      set_timeouts(conn);
      serve(conn);
      close(conn);
    }
  }

  static void refuse(int conn, int status, const std::string &why) {
    Reply r{};
    r.status = status;
    snprintf(r.msg, sizeof r.msg, "%s", why.c_str());
    send(conn, &r, sizeof r, MSG_NOSIGNAL);
  }

  void serve(int conn) {
    if (!same_user(conn)) {
      refuse(conn, EPERM, "the requesting process belongs to another user");
      return;
    }
    Request q{};
    if (recv(conn, &q, sizeof q, 0) != ssize_t(sizeof q)) {
      return;
    }
    Reply r{};
    std::vector<uint64_t> sizes;
    std::vector<int> fds;
    std::string why = export_block(q, &r, &sizes, &fds);
    if (!why.empty()) {
      refuse(conn, r.status ? r.status : EINVAL, why);
      return;
    }
    if (send(conn, &r, sizeof r, MSG_NOSIGNAL) == ssize_t(sizeof r)) {
      send_fds(conn, sizes, fds);
    }
    for (int fd : fds) {
      close(fd);
    }
  }

  /* Takes the lock, so the block cannot be freed while its memory is exported. "" or why not. */
  std::string export_block(const Request &q, Reply *r, std::vector<uint64_t> *sizes, std::vector<int> *fds) {
    Driver &d = Driver::get();
    if (!d.why.empty()) {
      return d.why;
    }
    std::lock_guard<std::mutex> g(mu_);
    auto it = live_.find(q.id);
    if (q.secret != secret_ || it == live_.end()) {
      r->status = ENOENT;
      return "no such shared block (freed by the sender, or a stale handle)";
    }
    const Shared &s = it->second;
    if (cudaSetDevice(s.device) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    std::vector<Mapping> ms;
    try {
      ms = mappings_of(s.arena, s.ptr, s.size);
    } catch (const std::exception &e) {
      return e.what();
    }
    r->n = uint32_t(ms.size());
    r->delta = uint64_t(static_cast<char *>(s.ptr) - static_cast<char *>(ms[0].ptr));
    for (const Mapping &m : ms) {
      int fd = -1;
      CUresult cr = d.exportFd(&fd, CUmemGenericAllocationHandle(m.handle),
                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      if (cr != CUDA_SUCCESS) {
        for (int x : *fds) {
          close(x);
        }
        fds->clear();
        return "cuMemExportToShareableHandle failed: " + d.text(cr) +
               " (the arena's memory was made without an exportable handle type)";
      }
      fds->push_back(fd);
      sizes->push_back(m.size);
      r->span += m.size;
    }
    return "";
  }

  std::mutex mu_;
  std::once_flag started_;
  std::unordered_map<uint64_t, Shared> live_;
  uint64_t next_id_ = 1;
  uint64_t secret_ = 0;
  std::string name_;
  std::string why_;
  int listen_fd_ = -1;
};

/* ---- the receiver ------------------------------------------------------------------------------ */

inline bool recv_batch(int conn, Batch *b, std::vector<int> *fds) {
  char ctrl[CMSG_SPACE(sizeof(int) * kBatch)];
  iovec iov{b, sizeof *b};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl;
  m.msg_controllen = sizeof ctrl;
  if (recvmsg(conn, &m, MSG_CMSG_CLOEXEC) != ssize_t(sizeof *b)) {
    return false;
  }
  size_t got = 0;
  for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int *p = reinterpret_cast<const int *>(CMSG_DATA(c));
      for (size_t i = 0; i < k; i++) {
        fds->push_back(p[i]);
      }
      got += k;
    }
  }
  return got == b->k && b->k <= kBatch && !(m.msg_flags & MSG_CTRUNC);
}

/* What a received block holds: a reservation with the sender's mappings in it. */
struct Imported {
  CUdeviceptr va = 0;
  uint64_t span = 0;
  std::vector<uint64_t> sizes; /* mapped, in order from va */
  int device = 0;

  ~Imported() {
    Driver &d = Driver::get();
    if (!va || !d.why.empty()) {
      return;
    }
    int cur = -1;
    (void)cudaGetDevice(&cur);
    if (cudaSetDevice(device) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    uint64_t off = 0;
    for (uint64_t n : sizes) {
      d.unmap(va + off, n);
      off += n;
    }
    d.unreserve(va, span);
    if (cur >= 0) {
      (void)cudaSetDevice(cur);
    }
  }
};

inline std::shared_ptr<void> open_gpuguard(const std::string &handle) {
  Driver &d = Driver::get();
  GG_CHECK(d.why.empty(), "gpuguard: cannot open a CUDA IPC handle: ", d.why);
  GG_CHECK(handle.size() == 2 + sizeof(Wire), "gpuguard: a CUDA IPC handle of ", handle.size(),
              " bytes is not one gpuguard writes");
  Wire w{};
  memcpy(&w, handle.data() + 2, sizeof w);
  GG_CHECK(memcmp(w.magic, "gpuguard", 8) == 0 && w.version == 1,
              "gpuguard: not a gpuguard CUDA IPC handle, or one of another version");
  w.name[sizeof w.name - 1] = '\0';
  int conn = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  GG_CHECK(conn >= 0, "gpuguard: socket: ", errno_text(errno));
  std::unique_ptr<int, void (*)(int *)> closer(&conn, [](int *fd) { close(*fd); });
  set_timeouts(conn);
  socklen_t len = 0;
  sockaddr_un a = address_of(w.name, &len);
  GG_CHECK(connect(conn, reinterpret_cast<sockaddr *>(&a), len) == 0,
              "gpuguard: cannot reach the process that shared this CUDA tensor (pid ", w.pid,
              "): ", errno_text(errno), " (it has exited, or runs in another network namespace)");
  GG_CHECK(same_user(conn), "gpuguard: the process that shared this CUDA tensor belongs to another user");
  Request q{w.secret, w.id};
  GG_CHECK(send(conn, &q, sizeof q, MSG_NOSIGNAL) == ssize_t(sizeof q), "gpuguard: CUDA IPC request: ",
              errno_text(errno));
  Reply r{};
  GG_CHECK(recv(conn, &r, sizeof r, 0) == ssize_t(sizeof r), "gpuguard: CUDA IPC: no answer from pid ",
              w.pid, ": ", errno_text(errno));
  r.msg[sizeof r.msg - 1] = '\0';
  GG_CHECK(r.status == 0, "gpuguard: pid ", w.pid, " refused to share the CUDA tensor: ", r.msg);
  GG_CHECK(r.n >= 1 && r.n <= kMaxMappings && r.delta < r.span && w.size <= r.span - r.delta,
              "gpuguard: a malformed CUDA IPC answer from pid ", w.pid);
  std::vector<int> fds;
  std::vector<uint64_t> sizes;
  bool ok = true;
  while (ok && sizes.size() < r.n) {
    Batch b{};
    size_t before = fds.size();
    ok = recv_batch(conn, &b, &fds) && fds.size() - before == b.k && b.k >= 1;
    for (uint32_t i = 0; ok && i < b.k; i++) {
      sizes.push_back(b.sizes[i]);
    }
  }
  uint64_t total = 0;
  for (uint64_t n : sizes) {
    total += n;
  }
  if (!ok || sizes.size() != r.n || total != r.span) {
    for (int fd : fds) {
      close(fd);
    }
    GG_CHECK(false, "gpuguard: CUDA IPC: the memory of pid ", w.pid, " did not arrive whole");
  }
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  auto imp = std::make_shared<Imported>();
  imp->device = dev;
  CUresult cr = d.reserve(&imp->va, r.span, 0, 0, 0);
  std::string fail;
  if (cr != CUDA_SUCCESS) {
    imp->va = 0;
    fail = "cuMemAddressReserve: " + d.text(cr);
  } else {
    imp->span = r.span;
  }
  uint64_t off = 0;
  for (size_t i = 0; i < fds.size(); i++) {
    CUmemGenericAllocationHandle h = 0;
    if (fail.empty()) {
      cr = d.importFd(&h, reinterpret_cast<void *>(intptr_t(fds[i])), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      if (cr != CUDA_SUCCESS) {
        fail = "cuMemImportFromShareableHandle: " + d.text(cr);
      } else {
        cr = d.map(imp->va + off, sizes[i], 0, h, 0);
        d.release(h); /* the mapping holds the memory now */
        if (cr != CUDA_SUCCESS) {
          fail = "cuMemMap: " + d.text(cr);
        } else {
          imp->sizes.push_back(sizes[i]);
          off += sizes[i];
        }
      }
    }
    close(fds[i]);
  }
  if (fail.empty()) {
    CUmemAccessDesc acc{};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    cr = d.access(imp->va, r.span, &acc, 1);
    if (cr != CUDA_SUCCESS) {
      fail = "cuMemSetAccess: " + d.text(cr);
    }
  }
  GG_CHECK(fail.empty(), "gpuguard: cannot map the CUDA memory pid ", w.pid, " shared: ", fail);
  void *p = reinterpret_cast<void *>(imp->va + r.delta);
  return std::shared_ptr<void>(p, [imp](void *) mutable { imp.reset(); });
}

#endif /* GG_IPC_HAVE_DRIVER */

/* The legacy format: a cudaIpcMemHandle_t of cuMemAlloc'd memory (ours, or PyTorch's allocator's). */
inline std::string share_legacy(void *base) {
  cudaIpcMemHandle_t h;
  C10_CUDA_CHECK(cudaIpcGetMemHandle(&h, base));
  std::string s(2, '\0');
  s[0] = kVersion;
  s[1] = kLegacy;
  s.append(reinterpret_cast<const char *>(&h), sizeof h);
  return s;
}

/* Opens a handle of either format; the same handle opened twice shares one mapping (the driver
 * refuses a second cudaIpcOpenMemHandle of one allocation in a process). */
class Importer {
 public:
  std::shared_ptr<void> open(const std::string &handle) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = cache_.find(handle);
    if (it != cache_.end()) {
      if (auto p = it->second.lock()) {
        return p;
      }
      cache_.erase(it);
    }
    std::shared_ptr<void> p = open_uncached(handle);
    cache_[handle] = p;
    return p;
  }

 private:
  static std::shared_ptr<void> open_uncached(const std::string &handle) {
    GG_CHECK(handle.size() >= 2 && (handle[0] == 2 || handle[0] == 3),
                "gpuguard: not a CUDA IPC handle this PyTorch backend knows (", handle.size(), " bytes)");
    if (handle[1] == kLegacy && handle.size() == kLegacySize) {
      cudaIpcMemHandle_t h;
      memcpy(&h, handle.data() + 2, sizeof h);
      void *p = nullptr;
      C10_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
      int dev = 0;
      C10_CUDA_CHECK(cudaGetDevice(&dev));
      return std::shared_ptr<void>(p, [dev](void *q) {
        int cur = -1;
        (void)cudaGetDevice(&cur);
        (void)cudaSetDevice(dev);
        (void)cudaIpcCloseMemHandle(q);
        (void)cudaGetLastError();
        if (cur >= 0) {
          (void)cudaSetDevice(cur);
        }
      });
    }
#if GG_IPC_HAVE_DRIVER
    if (handle[1] == kGpuguard) {
      return open_gpuguard(handle);
    }
#endif
    GG_CHECK(handle[1] != 'e', "gpuguard: this CUDA tensor comes from a process on PyTorch's allocator with "
                                  "expandable segments, whose handles gpuguard's backend cannot open: run the "
                                  "sender with GPUGUARD_TORCH=1 too, or without expandable_segments");
    GG_CHECK(false, "gpuguard: a CUDA IPC handle of an unknown kind ('", handle[1], "', ", handle.size(),
                " bytes)");
  }

  std::mutex mu_;
  std::map<std::string, std::weak_ptr<void>> cache_;
};

} // namespace gg_ipc

#endif
