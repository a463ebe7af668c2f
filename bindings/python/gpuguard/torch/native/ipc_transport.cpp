/* ipc_transport.cpp (gpuguard.torch) — the transport of ipc_transport.h: an abstract Unix socket
 * per sending process, descriptors in SCM_RIGHTS batches. */
#include "ipc_transport.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

namespace gg_torch {
namespace ipc {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kWireVersion = 2; /* 2: a capability per block */
constexpr uint32_t kMaxPieces = 1u << 20;
constexpr int kRequestMs = 2000;   /* a receiver asks as soon as it connects */
constexpr int kTransferMs = 20000; /* the whole answer, however many batches */
constexpr int kMaxConns = 16;      /* receivers served at once, one thread each */

/* strerror, naming EMFILE and ENFILE too: they say the process or the system ran out of
 * descriptors, which "Too many open files" hides from most readers. */
std::string errno_text(int e) {
  char buf[128];
  std::string s = strerror_r(e, buf, sizeof buf);
  if (e == EMFILE || e == ENFILE) {
    s += e == EMFILE ? " (EMFILE: the process's descriptor limit)" : " (ENFILE: the system's)";
  }
  return s;
}

/* A descriptor held back for accept when the process runs out: see serve_loop. */
int open_reserve() { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

bool same_user(int fd) {
  struct ucred cred {};
  socklen_t len = sizeof cred;
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == geteuid();
}

void set_timeouts(int fd, int ms) {
  struct timeval tv {};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* Both timeouts to what is left until the deadline: false once it has passed. */
bool arm(int fd, Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) {
    return false;
  }
  set_timeouts(fd, int(left.count()));
  return true;
}

/* Compares two capabilities in time that does not depend on where they differ. */
bool same_cap(const uint8_t *a, const uint8_t *b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < 16; i++) {
    diff = uint8_t(diff | (a[i] ^ b[i]));
  }
  return diff == 0;
}

sockaddr_un address_of(const std::string &name, socklen_t *len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  size_t n = std::min(name.size(), sizeof a.sun_path - 2);
  memcpy(a.sun_path + 1, name.data(), n); /* abstract: a leading NUL, no file */
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

void close_fds(const int *fds, size_t n) {
  for (size_t i = 0; i < n; i++) {
    close(fds[i]);
  }
}

/* One batch: the header (the pieces' sizes, or why there are none) in the message, the
 * descriptors beside it (SCM_RIGHTS). */
bool send_batch(int conn, const Batch &b, const gg_share_piece_t *pieces) {
  int fds[kBatch];
  for (uint32_t i = 0; i < b.k; i++) {
    fds[i] = pieces[i].fd;
  }
  char ctrl[CMSG_SPACE(sizeof(int) * kBatch)];
  memset(ctrl, 0, sizeof ctrl);
  iovec iov{const_cast<Batch *>(&b), sizeof b};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (b.k > 0) {
    m.msg_control = ctrl;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * b.k);
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * b.k);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * b.k);
  }
  return sendmsg(conn, &m, MSG_NOSIGNAL) == ssize_t(sizeof b);
}

/* One batch: the header into *b, the descriptors into fds (room for kBatch); how many came, or -1
 * (any that came closed, errno EPIPE when the sender hung up) when the message is no batch. *cut:
 * descriptors were dropped on the way in. */
ssize_t recv_batch(int conn, Batch *b, int *fds, bool *cut) {
  char ctrl[CMSG_SPACE(sizeof(int) * kBatch)];
  iovec iov{b, sizeof *b};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl;
  m.msg_controllen = sizeof ctrl;
  ssize_t got = recvmsg(conn, &m, MSG_CMSG_CLOEXEC);
  size_t n = 0;
  for (cmsghdr *c = got >= 0 ? CMSG_FIRSTHDR(&m) : nullptr; c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t k = std::min((c->cmsg_len - CMSG_LEN(0)) / sizeof(int), kBatch - n);
      memcpy(fds + n, CMSG_DATA(c), k * sizeof(int));
      n += k;
    }
  }
  *cut = got >= 0 && (m.msg_flags & MSG_CTRUNC);
  if (got != ssize_t(sizeof *b)) {
    int e = got < 0 ? errno : got == 0 ? EPIPE : EPROTO;
    close_fds(fds, n);
    errno = e;
    return -1;
  }
  return ssize_t(n);
}

void refuse(int conn, int status, const std::string &why) {
  Reply r{};
  r.status = status;
  snprintf(r.msg, sizeof r.msg, "%s", why.c_str());
  send(conn, &r, sizeof r, MSG_NOSIGNAL);
}

/* The errno value of a failed export: the library names EMFILE in its message (GG_EIO), and it is
 * worth saying as such: the sender is out of descriptors, not its memory unshareable. */
int export_errno(int rc, const char *why) {
  return rc == GG_EIO && strstr(why, "EMFILE") ? EMFILE : rc == GG_ENOTSUP ? ENOTSUP : EIO;
}

/* The kernel drops descriptors that do not fit (MSG_CTRUNC): a sender that sent more than a batch
 * holds, or this process out of them. Which one: try to take one; EMFILE, ENFILE or 0. */
int fd_shortage() {
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return errno == EMFILE || errno == ENFILE ? errno : 0;
  }
  close(fd);
  return 0;
}

/* A batch that ends the answer: no pieces, the reason. */
void end_batch(Batch *b, int status, const std::string &why) {
  b->k = 0;
  b->status = status;
  snprintf(b->msg, sizeof b->msg, "%s", why.c_str());
}

/* Receives the batches and maps each piece as it comes, closing its descriptor at once: this
 * process holds one batch of descriptors at most, however many pieces the block has. */
int receive_pieces(const Ops &ops, int conn, const Reply &r, void *imp, const std::string &pid,
                   std::string *why) {
  uint64_t got = 0;
  uint64_t bytes = 0;
  while (got < r.n) {
    Batch b{};
    int fds[kBatch];
    bool cut = false;
    ssize_t n = recv_batch(conn, &b, fds, &cut);
    if (n < 0) {
      int e = errno;
      *why = "the CUDA memory of " + pid + " did not arrive whole: " +
             (e == EAGAIN  ? "no answer in time"
              : e == EPIPE ? "it hung up"
                           : errno_text(e));
      return EPROTO;
    }
    bool ok = !cut && b.status == 0 && size_t(n) == b.k && b.k >= 1 && got + b.k <= r.n;
    int rc = 0;
    for (ssize_t i = 0; i < n; i++) {
      gg_share_piece_t p{fds[i], size_t(b.sizes[i])};
      rc = ok && rc == 0 ? ops.import_map(imp, &p) : rc;
      bytes += p.size;
      close(fds[i]); /* the mapping holds the memory now */
    }
    b.msg[sizeof b.msg - 1] = '\0';
    if (b.status != 0) {
      *why = pid + " could not send the CUDA memory: " + b.msg;
      return b.status;
    }
    int shortage = cut ? fd_shortage() : 0;
    if (shortage != 0) {
      *why = "the CUDA memory of " + pid + " did not arrive: " + errno_text(shortage);
      return shortage;
    }
    if (!ok) {
      *why = "a malformed CUDA IPC answer from " + pid;
      return EPROTO;
    }
    if (rc != 0) {
      *why = "cannot map the CUDA memory " + pid + " shared: " + ops.last_error();
      return EIO;
    }
    got += b.k;
  }
  if (bytes != r.span) {
    *why = "a malformed CUDA IPC answer from " + pid;
    return EPROTO;
  }
  return 0;
}

} // namespace

const Shared *Server::find_locked(const Request &q) const {
  auto it = live_.find(q.id);
  return it == live_.end() || !same_cap(it->second.cap, q.cap) ? nullptr : &it->second.s;
}

int Server::share(uint64_t *id, const Shared &s, std::string *wire, std::string *why) {
  int rc = start(why);
  if (rc != 0) {
    return rc;
  }
  Wire w{};
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = live_.find(*id);
    if (it == live_.end()) {
      Entry e{s, {}};
      if (getrandom(e.cap, sizeof e.cap, 0) != ssize_t(sizeof e.cap)) {
        *why = "getrandom: " + errno_text(errno);
        return EIO;
      }
      *id = *id ? *id : next_id_++;
      it = live_.emplace(*id, e).first;
    }
    it->second.s = s;
    memcpy(w.magic, "gpuguard", 8);
    w.version = kWireVersion;
    w.device = s.device;
    memcpy(w.cap, it->second.cap, sizeof w.cap);
    w.id = *id;
    w.size = s.size;
    w.pid = int32_t(getpid());
    snprintf(w.name, sizeof w.name, "%s", name_.c_str());
  }
  wire->assign(reinterpret_cast<const char *>(&w), sizeof w);
  return 0;
}

void Server::forget(uint64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  live_.erase(id);
}

int Server::start(std::string *why) {
  std::lock_guard<std::mutex> g(start_mu_);
  if (listen_fd_ >= 0) {
    return 0;
  }
  uint64_t rnd = 0;
  if (getrandom(&rnd, sizeof rnd, 0) != ssize_t(sizeof rnd)) {
    int e = errno;
    *why = "getrandom: " + errno_text(e);
    return e;
  }
  char name[44];
  snprintf(name, sizeof name, "gpuguard-ipc-%d-%016llx", int(getpid()), (unsigned long long)rnd);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  socklen_t len = 0;
  sockaddr_un a = address_of(name, &len);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr *>(&a), len) != 0 || listen(fd, 64) != 0) {
    int e = errno;
    *why = "a Unix socket for CUDA IPC: " + errno_text(e);
    if (fd >= 0) {
      close(fd);
    }
    return e; /* EMFILE now need not be EMFILE at the next share: that one tries again */
  }
  int reserve = open_reserve(); /* -1 is no reason not to serve: see serve_loop */
  try {
    std::thread([this, fd, reserve] { serve_loop(fd, reserve); }).detach(); /* process-long */
  } catch (const std::system_error &e) {
    close(fd);
    close(reserve);
    *why = std::string("a thread to serve CUDA IPC: ") + e.what();
    return EAGAIN;
  }
  name_ = name;
  listen_fd_ = fd;
  return 0;
}

void Server::serve_loop(int listen_fd, int reserve) {
  for (;;) {
    int conn = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      int e = errno;
      if (e == EINTR || e == ECONNABORTED) {
        continue;
      }
      /* accept fails at once, again and again, while the process has no descriptor left: give up
       * the reserve so that the next accept waits for a connection; without one (or on any other
       * error: ENOBUFS, ENOMEM), back off rather than spin, and never stop serving. */
      if ((e == EMFILE || e == ENFILE) && reserve >= 0) {
        close(reserve);
        reserve = -1;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        reserve = reserve >= 0 ? reserve : open_reserve();
      }
      continue;
    }
    if (reserve < 0) {
      reserve = open_reserve();
    }
    if (reserve < 0) {
      int e = errno;
      refuse(conn, e, "the sending process has no file descriptor left: " + errno_text(e));
      close(conn);
      continue;
    }
    /* One thread per receiver, so that one that stalls holds up no other; a cap on them, so that
     * a flood of connections costs a refusal each, not a thread. */
    if (active_.fetch_add(1) >= kMaxConns) {
      refuse(conn, EBUSY, "too many receivers at once; try again");
      close(conn);
      active_--;
      continue;
    }
    try {
      std::thread([this, conn] {
        serve(conn);
        close(conn);
        active_--;
      }).detach();
    } catch (const std::system_error &) {
      refuse(conn, EAGAIN, "no thread to serve the request; try again");
      close(conn);
      active_--;
    }
  }
}

void Server::serve(int conn) {
  if (!same_user(conn)) {
    refuse(conn, EPERM, "the requesting process belongs to another user");
    return;
  }
  Clock::time_point start = Clock::now();
  Request q{};
  if (!arm(conn, start + std::chrono::milliseconds(kRequestMs)) ||
      recv(conn, &q, sizeof q, 0) != ssize_t(sizeof q)) {
    return; /* silent, slow or garbled: another receiver may be waiting */
  }
  Reply r{};
  std::string why;
  int status = measure(q, &r, &why);
  if (status != 0) {
    refuse(conn, status, why);
    return;
  }
  Clock::time_point deadline = start + std::chrono::milliseconds(kTransferMs);
  if (!arm(conn, deadline) || send(conn, &r, sizeof r, MSG_NOSIGNAL) != ssize_t(sizeof r)) {
    return;
  }
  for (size_t first = 0; first < r.n; first += kBatch) {
    Batch b{};
    b.k = uint32_t(std::min<size_t>(kBatch, r.n - first));
    gg_share_piece_t pieces[kBatch];
    export_batch(q, first, r.n, &b, pieces);
    bool sent = arm(conn, deadline) && send_batch(conn, b, pieces);
    for (uint32_t i = 0; i < b.k; i++) {
      close(pieces[i].fd); /* sent or not: the receiver has its own */
    }
    if (!sent || b.status != 0) {
      return;
    }
  }
}

int Server::measure(const Request &q, Reply *r, std::string *why) {
  std::lock_guard<std::mutex> g(mu_);
  const Shared *s = find_locked(q);
  if (!s) {
    *why = "no such shared block (freed by the sender, or a stale or forged handle)";
    return ENOENT;
  }
  size_t total = 0;
  size_t span = 0;
  size_t offset = 0;
  int rc = ops_.measure(*s, &total, &span, &offset);
  if (rc != 0) {
    *why = std::string("the block's memory cannot be exported: ") + ops_.last_error();
    return export_errno(rc, ops_.last_error());
  }
  if (total < 1 || total > kMaxPieces) {
    *why = "a block of " + std::to_string(total) + " pieces cannot be sent";
    return E2BIG;
  }
  r->n = uint32_t(total);
  r->span = span;
  r->delta = offset;
  return 0;
}

/* Under the lock, batch by batch: the block cannot be freed (and its memory handed to another
 * block) while its pieces are exported; a block freed between two batches ends the answer. */
void Server::export_batch(const Request &q, size_t first, size_t total, Batch *b,
                          gg_share_piece_t *pieces) {
  std::lock_guard<std::mutex> g(mu_);
  const Shared *s = find_locked(q);
  if (!s) {
    end_batch(b, ENOENT, "the block was freed while being sent");
    return;
  }
  size_t now = 0;
  int rc = ops_.export_pieces(*s, first, pieces, b->k, &now, nullptr);
  if (rc != 0) {
    end_batch(b, export_errno(rc, ops_.last_error()),
              std::string("the block's memory cannot be exported: ") + ops_.last_error());
    return;
  }
  if (now != total) {
    for (size_t i = 0; first + i < now && i < b->k; i++) {
      close(pieces[i].fd);
    }
    end_batch(b, EPROTO, "the block changed while being sent");
    return;
  }
  for (uint32_t i = 0; i < b->k; i++) {
    b->sizes[i] = pieces[i].size;
  }
}

int fetch(const Ops &ops, const std::string &wire, int timeout_ms, void **imp, void **ptr,
          std::string *why) {
  Wire w{};
  if (wire.size() != sizeof w) {
    *why = "a CUDA IPC handle of " + std::to_string(wire.size() + 2) +
           " bytes is not one gpuguard writes";
    return EINVAL;
  }
  memcpy(&w, wire.data(), sizeof w);
  if (memcmp(w.magic, "gpuguard", 8) != 0 || w.version != kWireVersion) {
    *why = "not a gpuguard CUDA IPC handle, or one of another version";
    return EINVAL;
  }
  std::string name(w.name, strnlen(w.name, sizeof w.name));
  std::string pid = "pid " + std::to_string(w.pid);
  int conn = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (conn < 0) {
    *why = "socket: " + errno_text(errno);
    return errno;
  }
  std::unique_ptr<int, void (*)(int *)> closer(&conn, [](int *fd) { close(*fd); });
  set_timeouts(conn, timeout_ms);
  socklen_t len = 0;
  sockaddr_un a = address_of(name, &len);
  if (connect(conn, reinterpret_cast<sockaddr *>(&a), len) != 0) {
    int e = errno;
    *why = "cannot reach the process that shared this CUDA tensor (" + pid + "): " + errno_text(e) +
           " (it has exited, or runs in another network namespace)";
    return e;
  }
  if (!same_user(conn)) {
    *why = "the process that shared this CUDA tensor belongs to another user";
    return EPERM;
  }
  Request q{w.id, {}};
  memcpy(q.cap, w.cap, sizeof q.cap);
  if (send(conn, &q, sizeof q, MSG_NOSIGNAL) != ssize_t(sizeof q)) {
    *why = "CUDA IPC request: " + errno_text(errno);
    return EIO;
  }
  Reply r{};
  if (recv(conn, &r, sizeof r, 0) != ssize_t(sizeof r)) {
    *why = "CUDA IPC: no answer from " + pid + ": " + errno_text(errno);
    return ETIMEDOUT;
  }
  r.msg[sizeof r.msg - 1] = '\0';
  if (r.status != 0) {
    *why = pid + " refused to share the CUDA tensor: " + r.msg;
    return r.status;
  }
  if (r.n < 1 || r.n > kMaxPieces || r.delta >= r.span || w.size > r.span - r.delta) {
    *why = "a malformed CUDA IPC answer from " + pid;
    return EPROTO;
  }
  if (ops.import_open(imp, size_t(r.span)) != 0) {
    *why = "cannot map the CUDA memory " + pid + " shared: " + ops.last_error();
    ops.import_close(*imp);
    return EIO;
  }
  int e = receive_pieces(ops, conn, r, *imp, pid, why);
  if (e == 0 && !ops.import_ptr(*imp)) {
    *why = "the CUDA memory of " + pid + " is not mapped whole: " + ops.last_error();
    e = EIO;
  }
  if (e != 0) {
    ops.import_close(*imp);
    *imp = nullptr;
    return e;
  }
  *ptr = static_cast<char *>(ops.import_ptr(*imp)) + r.delta;
  return 0;
}

/* The mapping as its users hold it: when the last one drops it, it is unmapped and its entry goes
 * (an entry per tensor ever received was kept before: about 220 bytes each). The state outlives
 * the cache while mappings do. */
std::shared_ptr<void> Cache::track(const std::string &key, const std::shared_ptr<Slot> &slot,
                                   std::shared_ptr<void> mapping) {
  /* The deleter holds the cache's state and the slot weakly: a shared_ptr keeps its deleter until
   * its last weak_ptr goes, and the slot's weak_ptr to this very pointer made a cycle through any
   * strong capture (LeakSanitizer: every entry leaked). A cache gone first has nothing to forget.
   */
  std::weak_ptr<State> st = st_;
  std::weak_ptr<Slot> weak_slot = slot;
  void *p = mapping.get();
  return std::shared_ptr<void>(p, [st, key, weak_slot, mapping](void *) mutable {
    mapping.reset();
    std::shared_ptr<State> state = st.lock();
    if (!state) {
      return;
    }
    std::shared_ptr<Slot> mine = weak_slot.lock();
    std::lock_guard<std::mutex> g(state->mu);
    auto it = state->slots.find(key);
    if (it != state->slots.end() && it->second == mine) {
      state->slots.erase(it);
    }
    state->cv.notify_all();
  });
}

/* No lock is held while a handle is opened (a network round trip, up to a stopped sender's
 * timeout): opens of other handles go on meanwhile, and opens of the same one wait for its result,
 * mapping or exception. */
std::shared_ptr<void> Cache::open(const std::string &key, const Make &make) {
  std::unique_lock<std::mutex> g(st_->mu);
  for (;;) {
    auto it = st_->slots.find(key);
    if (it == st_->slots.end()) {
      break;
    }
    std::shared_ptr<Slot> slot = it->second;
    if (!slot->done) {
      st_->cv.wait(g, [&slot] { return slot->done; });
      if (slot->error) {
        std::rethrow_exception(slot->error);
      }
      continue;
    }
    if (std::shared_ptr<void> p = slot->ptr.lock()) {
      return p;
    }
    /* Its last user is dropping it: wait until it is unmapped and gone (the driver refuses a
     * second open of an allocation still open). */
    State *st = st_.get();
    st->cv.wait(g, [st, &key, &slot] {
      auto now = st->slots.find(key);
      return now == st->slots.end() || now->second != slot;
    });
  }
  auto slot = std::make_shared<Slot>();
  st_->slots[key] = slot;
  g.unlock();
  std::shared_ptr<void> p;
  std::exception_ptr error;
  try {
    p = track(key, slot, make());
  } catch (...) {
    error = std::current_exception();
  }
  g.lock();
  slot->done = true;
  slot->ptr = p;
  slot->error = error;
  if (error) {
    st_->slots.erase(key); /* a failure is shared with those who waited for it, not kept */
  }
  st_->cv.notify_all();
  g.unlock();
  if (error) {
    std::rethrow_exception(error);
  }
  return p;
}

size_t Cache::size() {
  std::lock_guard<std::mutex> g(st_->mu);
  return st_->slots.size();
}

} // namespace ipc
} // namespace gg_torch
