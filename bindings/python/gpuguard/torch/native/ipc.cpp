/* ipc.cpp (gpuguard.torch) — the transport of ipc.h: an abstract Unix socket per sending process,
 * descriptors in SCM_RIGHTS batches, mapped on the other side with gpuguard/share.h. */
#include "ipc.h"

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "check.h"
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow" /* see adapter.h */
#endif
#include "gpuguard/share.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace gg_torch {
namespace ipc {

namespace {

constexpr char kVersion = 2;    /* the framing byte PyTorch's handles start with */
constexpr char kLegacy = 'c';   /* PyTorch's: a cudaIpcMemHandle_t follows */
constexpr char kGpuguard = 'g'; /* ours: a Wire follows */
constexpr size_t kLegacySize = 2 + sizeof(cudaIpcMemHandle_t);
constexpr uint32_t kBatch = 64; /* descriptors per message (SCM_RIGHTS allows 253) */
constexpr uint32_t kMaxPieces = 1u << 20;
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
  uint32_t n;     /* pieces that follow, in address order */
  uint64_t span;  /* their bytes together */
  uint64_t delta; /* the block's offset in the first one */
  char msg[200];
};

struct Batch {
  uint32_t k;
  uint64_t sizes[kBatch];
};

std::string errno_text(int e) {
  char buf[128];
  return std::string(strerror_r(e, buf, sizeof buf));
}

bool same_user(int fd) {
  struct ucred cred {};
  socklen_t len = sizeof cred;
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == geteuid();
}

void set_timeouts(int fd) {
  struct timeval tv {};
  tv.tv_sec = kTimeoutSec;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

sockaddr_un address_of(const char *name, socklen_t *len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  size_t n = strnlen(name, sizeof a.sun_path - 2);
  memcpy(a.sun_path + 1, name, n); /* abstract: a leading NUL, no file */
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

void close_all(const std::vector<gg_share_piece_t> &pieces) {
  for (const gg_share_piece_t &p : pieces) {
    close(p.fd);
  }
}

/* Sends the pieces in batches, each message with their sizes and descriptors. */
bool send_pieces(int conn, const std::vector<gg_share_piece_t> &pieces) {
  for (size_t at = 0; at < pieces.size(); at += kBatch) {
    Batch b{};
    b.k = uint32_t(std::min<size_t>(kBatch, pieces.size() - at));
    int fds[kBatch];
    for (uint32_t i = 0; i < b.k; i++) {
      b.sizes[i] = pieces[at + i].size;
      fds[i] = pieces[at + i].fd;
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
    memcpy(CMSG_DATA(c), fds, sizeof(int) * b.k);
    if (sendmsg(conn, &m, MSG_NOSIGNAL) != ssize_t(sizeof b)) {
      return false;
    }
  }
  return true;
}

/* One batch: its sizes into *b, its descriptors appended to *pieces. */
bool recv_batch(int conn, Batch *b, std::vector<gg_share_piece_t> *pieces) {
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
  std::vector<int> fds;
  for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int *p = reinterpret_cast<const int *>(CMSG_DATA(c));
      fds.insert(fds.end(), p, p + k);
    }
  }
  bool ok = fds.size() == b->k && b->k >= 1 && b->k <= kBatch && !(m.msg_flags & MSG_CTRUNC);
  for (size_t i = 0; i < fds.size(); i++) {
    pieces->push_back(gg_share_piece_t{fds[i], ok ? size_t(b->sizes[i]) : 0});
  }
  return ok;
}

void refuse(int conn, int status, const std::string &why) {
  Reply r{};
  r.status = status;
  snprintf(r.msg, sizeof r.msg, "%s", why.c_str());
  send(conn, &r, sizeof r, MSG_NOSIGNAL);
}

/* Every piece under the block, exported in batches; "" or why not. */
std::string export_block(const Shared &s, Reply *r, std::vector<gg_share_piece_t> *pieces) {
  size_t total = 0;
  size_t offset = 0;
  for (size_t first = 0; first == 0 || first < total; first += kBatch) {
    gg_share_piece_t batch[kBatch];
    int rc = gg_arena_export(s.arena, s.ptr, s.size, first, batch, kBatch, &total, &offset);
    if (rc < 0) {
      close_all(*pieces);
      pieces->clear();
      return std::string("the block's memory cannot be exported: ") + gg_last_error();
    }
    pieces->insert(pieces->end(), batch, batch + std::min<size_t>(kBatch, total - first));
  }
  r->n = uint32_t(pieces->size());
  r->delta = offset;
  for (const gg_share_piece_t &p : *pieces) {
    r->span += p.size;
  }
  return "";
}

/* What a received block holds: the range the pieces are mapped into. */
struct Imported {
  gg_import_t *imp = nullptr;
  int device = 0;
  ~Imported() {
    int cur = -1;
    (void)cudaGetDevice(&cur);
    (void)cudaSetDevice(device);
    gg_import_close(imp);
    (void)cudaGetLastError();
    if (cur >= 0) {
      (void)cudaSetDevice(cur);
    }
  }
};

std::shared_ptr<void> open_gpuguard(const std::string &handle) {
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
  GG_CHECK(same_user(conn),
           "gpuguard: the process that shared this CUDA tensor belongs to another user");
  Request q{w.secret, w.id};
  GG_CHECK(send(conn, &q, sizeof q, MSG_NOSIGNAL) == ssize_t(sizeof q),
           "gpuguard: CUDA IPC request: ", errno_text(errno));
  Reply r{};
  GG_CHECK(recv(conn, &r, sizeof r, 0) == ssize_t(sizeof r),
           "gpuguard: CUDA IPC: no answer from pid ", w.pid, ": ", errno_text(errno));
  r.msg[sizeof r.msg - 1] = '\0';
  GG_CHECK(r.status == 0, "gpuguard: pid ", w.pid, " refused to share the CUDA tensor: ", r.msg);
  GG_CHECK(r.n >= 1 && r.n <= kMaxPieces && r.delta < r.span && w.size <= r.span - r.delta,
           "gpuguard: a malformed CUDA IPC answer from pid ", w.pid);
  std::vector<gg_share_piece_t> pieces;
  bool ok = true;
  uint64_t total = 0;
  while (ok && pieces.size() < r.n) {
    Batch b{};
    ok = recv_batch(conn, &b, &pieces);
  }
  for (const gg_share_piece_t &p : pieces) {
    total += p.size;
  }
  if (!ok || pieces.size() != r.n || total != r.span) {
    close_all(pieces);
    GG_CHECK(false, "gpuguard: CUDA IPC: the memory of pid ", w.pid, " did not arrive whole");
  }
  auto imp = std::make_shared<Imported>();
  C10_CUDA_CHECK(cudaGetDevice(&imp->device));
  int rc = gg_import_open(&imp->imp, imp->device, size_t(r.span));
  for (const gg_share_piece_t &p : pieces) {
    rc = rc < 0 ? rc : gg_import_map(imp->imp, &p);
    close(p.fd); /* the mapping holds the memory now */
  }
  GG_CHECK(rc == 0 && gg_import_ptr(imp->imp), "gpuguard: cannot map the CUDA memory pid ", w.pid,
           " shared: ", gg_last_error());
  void *p = static_cast<char *>(gg_import_ptr(imp->imp)) + r.delta;
  return std::shared_ptr<void>(p, [imp](void *) mutable { imp.reset(); });
}

std::shared_ptr<void> open_legacy(const std::string &handle) {
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

int first_mapping(const gg_mapping_info_t *m, void *user) {
  *static_cast<gg_mapping_info_t *>(user) = *m;
  return 1; /* the first is enough */
}

} // namespace

std::string share_legacy(gg_arena_t *arena, void *ptr, size_t size, int device,
                         ptrdiff_t *offset) {
  gg_mapping_info_t m{};
  gg_arena_foreach_mapping(arena, ptr, size, first_mapping, &m);
  GG_CHECK(m.ptr, "gpuguard: the memory of ", ptr, " cannot be shared: ", gg_last_error());
  if (m.handle != 0) {
    return ""; /* made with a shareable handle: exported as descriptors */
  }
  void *base = m.ptr;
  int cur = -1;
  C10_CUDA_CHECK(cudaGetDevice(&cur));
  C10_CUDA_CHECK(cudaSetDevice(device));
  cudaIpcMemHandle_t h;
  cudaError_t e = cudaIpcGetMemHandle(&h, base);
  (void)cudaSetDevice(cur);
  C10_CUDA_CHECK(e);
  std::string s(2, '\0');
  s[0] = kVersion;
  s[1] = kLegacy;
  s.append(reinterpret_cast<const char *>(&h), sizeof h);
  *offset = static_cast<char *>(ptr) - static_cast<char *>(base);
  return s;
}

std::string Exporter::share(uint64_t *id, const Shared &s) {
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

void Exporter::forget(uint64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  live_.erase(id);
}

void Exporter::start() {
  std::call_once(started_, [this] { listen_now(); });
  GG_CHECK(listen_fd_ >= 0, "gpuguard: cannot share CUDA memory with other processes: ", why_);
}

void Exporter::listen_now() {
  uint64_t rnd[2] = {0, 0};
  if (getrandom(rnd, sizeof rnd, 0) != ssize_t(sizeof rnd)) {
    why_ = "getrandom: " + errno_text(errno);
    return;
  }
  secret_ = rnd[0];
  char name[44];
  snprintf(name, sizeof name, "gpuguard-ipc-%d-%016llx", int(getpid()),
           (unsigned long long)rnd[1]);
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

void Exporter::serve_loop() {
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

void Exporter::serve(int conn) {
  if (!same_user(conn)) {
    refuse(conn, EPERM, "the requesting process belongs to another user");
    return;
  }
  Request q{};
  if (recv(conn, &q, sizeof q, 0) != ssize_t(sizeof q)) {
    return;
  }
  Reply r{};
  std::vector<gg_share_piece_t> pieces;
  std::string why;
  {
    /* Under the lock: the block cannot be freed while its memory is exported. */
    std::lock_guard<std::mutex> g(mu_);
    auto it = live_.find(q.id);
    if (q.secret != secret_ || it == live_.end()) {
      r.status = ENOENT;
      why = "no such shared block (freed by the sender, or a stale handle)";
    } else {
      why = export_block(it->second, &r, &pieces);
    }
  }
  if (!why.empty()) {
    refuse(conn, r.status ? r.status : EINVAL, why);
    return;
  }
  if (send(conn, &r, sizeof r, MSG_NOSIGNAL) == ssize_t(sizeof r)) {
    send_pieces(conn, pieces);
  }
  close_all(pieces);
}

std::shared_ptr<void> Importer::open(const std::string &handle) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = cache_.find(handle);
  if (it != cache_.end()) {
    if (auto p = it->second.lock()) {
      return p;
    }
    cache_.erase(it);
  }
  GG_CHECK(handle.size() >= 2 && (handle[0] == 2 || handle[0] == 3),
           "gpuguard: not a CUDA IPC handle this PyTorch backend knows (", handle.size(),
           " bytes)");
  std::shared_ptr<void> p;
  if (handle[1] == kLegacy && handle.size() == kLegacySize) {
    p = open_legacy(handle);
  } else if (handle[1] == kGpuguard) {
    p = open_gpuguard(handle);
  } else {
    GG_CHECK(handle[1] != 'e',
             "gpuguard: this CUDA tensor comes from a process on PyTorch's allocator with "
             "expandable segments, whose handles gpuguard's backend cannot open: run the sender "
             "with GPUGUARD_TORCH=1 too, or without expandable_segments");
    GG_CHECK(false, "gpuguard: a CUDA IPC handle of an unknown kind ('", handle[1], "', ",
             handle.size(), " bytes)");
  }
  cache_[handle] = p;
  return p;
}

} // namespace ipc
} // namespace gg_torch
