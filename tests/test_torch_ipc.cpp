/* test_torch_ipc.cpp — the transport of the PyTorch backend's CUDA IPC
 * (bindings/python/gpuguard/torch/native/ipc_transport.cpp), built alone: no PyTorch, no GPU. The
 * device's steps are fakes that hand out real descriptors (memfds, one per piece, each carrying its
 * block's tag and its index), so what a receiver maps can be checked piece by piece. Hostile peers
 * (idle, wrong capability, stopped senders) and descriptor exhaustion are played in-process. */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <dirent.h>
#include <functional>
#include <string>
#include <stdexcept>
#include <thread>
#include <vector>

#include "torch/native/ipc_transport.h"
#include "gg_test.hpp"

using gg_torch::ipc::Cache;
using gg_torch::ipc::Ops;
using gg_torch::ipc::Reply;
using gg_torch::ipc::Server;
using gg_torch::ipc::Shared;
using gg_torch::ipc::Wire;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kPiece = 4096;
constexpr int kTimeoutMs = 5000;

/* ---- the fake device: a block is a tag and a number of pieces */

struct FakeBlock {
  char tag;
  size_t pieces;
  size_t emfile_at = SIZE_MAX; /* the piece whose export finds no descriptor left */
};

thread_local std::string g_error;
std::atomic<int> g_imports_open{0};

const char *fake_last_error() { return g_error.c_str(); }

int fake_measure(const Shared &s, size_t *total, size_t *span, size_t *offset) {
  const FakeBlock *b = static_cast<const FakeBlock *>(s.ptr);
  *total = b->pieces;
  *span = b->pieces * kPiece;
  *offset = 0;
  return 0;
}

/* One memfd per piece, the tag and the index written at its start. */
int fake_export(const Shared &s, size_t first, gg_share_piece_t *pieces, size_t cap, size_t *total,
                size_t *offset) {
  const FakeBlock *b = static_cast<const FakeBlock *>(s.ptr);
  *total = b->pieces;
  if (offset) {
    *offset = 0;
  }
  size_t n = first < b->pieces ? std::min(cap, b->pieces - first) : 0;
  for (size_t i = 0; i < n; i++) {
    int fd = first + i == b->emfile_at ? -1 : memfd_create("gg-piece", MFD_CLOEXEC);
    if (fd < 0) {
      int e = first + i == b->emfile_at ? EMFILE : errno;
      for (size_t j = 0; j < i; j++) {
        close(pieces[j].fd);
      }
      g_error =
          e == EMFILE ? "export: the process has no file descriptor left (EMFILE)" : strerror(e);
      return GG_EIO;
    }
    std::string mark = std::string(1, b->tag) + std::to_string(first + i);
    if (pwrite(fd, mark.data(), mark.size(), 0) != ssize_t(mark.size())) {
      abort();
    }
    pieces[i] = gg_share_piece_t{fd, kPiece};
  }
  return 0;
}

struct FakeImport {
  size_t size = 0;
  size_t mapped = 0;
  std::vector<std::string> marks;
  std::vector<char> bytes;
};

int fake_import_open(void **imp, size_t size) {
  auto *f = new FakeImport;
  f->size = size;
  *imp = f;
  g_imports_open++;
  return 0;
}

/* Reads the piece's mark through its descriptor: a wrong or closed one fails here. */
int fake_import_map(void *imp, const gg_share_piece_t *piece) {
  auto *f = static_cast<FakeImport *>(imp);
  char buf[32] = {};
  ssize_t n = pread(piece->fd, buf, sizeof buf - 1, 0);
  if (n <= 0 || f->mapped + piece->size > f->size) {
    g_error = "bad piece";
    return GG_EINVAL;
  }
  f->marks.push_back(buf);
  f->mapped += piece->size;
  if (f->mapped == f->size) {
    f->bytes.resize(f->size);
  }
  return 0;
}

void *fake_import_ptr(void *imp) {
  auto *f = static_cast<FakeImport *>(imp);
  return f->mapped == f->size ? f->bytes.data() : nullptr;
}

void fake_import_close(void *imp) {
  if (imp) {
    g_imports_open--;
  }
  delete static_cast<FakeImport *>(imp);
}

const Ops kFake = {fake_measure,    fake_export,       fake_import_open, fake_import_map,
                   fake_import_ptr, fake_import_close, fake_last_error};

/* ---- helpers */

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/* Servers live as long as the process, as the backend's does. */
Server *new_server() { return new Server(kFake); }

std::string share(Server *srv, FakeBlock *b, uint64_t *id) {
  std::string wire;
  std::string why;
  int rc = srv->share(id, Shared{b, b->pieces * kPiece, 0, nullptr}, &wire, &why);
  if (rc != 0) {
    fail_msg("share: %s", why.c_str());
  }
  return wire;
}

/* Fetches a handle's block: 0 and its marks, or the error with *why. */
int fetch_marks(const std::string &wire, std::vector<std::string> *marks, std::string *why,
                int timeout_ms = kTimeoutMs) {
  void *imp = nullptr;
  void *ptr = nullptr;
  int rc = gg_torch::ipc::fetch(kFake, wire, timeout_ms, &imp, &ptr, why);
  if (rc == 0) {
    *marks = static_cast<FakeImport *>(imp)->marks;
    fake_import_close(imp);
  }
  return rc;
}

std::vector<std::string> expected_marks(const FakeBlock &b) {
  std::vector<std::string> m;
  for (size_t i = 0; i < b.pieces; i++) {
    m.push_back(std::string(1, b.tag) + std::to_string(i));
  }
  return m;
}

int open_fds() {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  while (readdir(d)) {
    n++;
  }
  closedir(d);
  return n - 3; /* ".", ".." and the directory's own */
}

/* Connects fd to a server's socket, as any process of the user could. */
void connect_to(int fd, const std::string &wire) {
  Wire w{};
  memcpy(&w, wire.data(), sizeof w);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  size_t n = strnlen(w.name, sizeof w.name);
  memcpy(a.sun_path + 1, w.name, n);
  socklen_t len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n);
  assert_int_equal(connect(fd, reinterpret_cast<sockaddr *>(&a), len), 0);
}

int connect_raw(const std::string &wire) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  connect_to(fd, wire);
  return fd;
}

/* Lowers the soft descriptor limit to `headroom` above what is open now; restores it when done. */
struct FdLimit {
  rlimit old{};
  explicit FdLimit(int headroom) {
    getrlimit(RLIMIT_NOFILE, &old);
    rlimit now = old;
    now.rlim_cur = rlim_t(open_fds() + headroom);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &now), 0);
  }
  ~FdLimit() { setrlimit(RLIMIT_NOFILE, &old); }
};

/* Takes every descriptor left under the limit. */
std::vector<int> exhaust_fds() {
  std::vector<int> held;
  for (;;) {
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return held;
    }
    held.push_back(fd);
  }
}

void close_fds(const std::vector<int> &fds) {
  for (int fd : fds) {
    close(fd);
  }
}

} // namespace

/* A block's pieces arrive whole and in order, and nothing is left open on either side. */
static void test_round_trip_maps_every_piece(void **state) {
  (void)state;
  Server *srv = new_server();
  FakeBlock b{'a', 200};
  uint64_t id = 0;
  std::string wire = share(srv, &b, &id);
  int fds = open_fds();
  std::vector<std::string> marks;
  std::string why;
  assert_int_equal(fetch_marks(wire, &marks, &why), 0);
  assert_true(marks == expected_marks(b));
  usleep(100 * 1000); /* the server's side closes after the last send */
  assert_int_equal(open_fds(), fds);
  srv->forget(id);
  assert_int_equal(fetch_marks(wire, &marks, &why), ENOENT);
}

/* Issue 42 item 7: a handle opens its own block only. Block 1's handle with block 2's id (the rest
 * kept: the socket, the process, block 1's capability) gets nothing; nor does a wrong capability.
 */
static void test_handle_opens_its_own_block_only(void **state) {
  (void)state;
  Server *srv = new_server();
  FakeBlock one{'p', 3};
  FakeBlock two{'q', 3};
  uint64_t id1 = 0;
  uint64_t id2 = 0;
  std::string wire1 = share(srv, &one, &id1);
  share(srv, &two, &id2);
  Wire w{};
  memcpy(&w, wire1.data(), sizeof w);
  w.id = id2;
  std::string forged(reinterpret_cast<const char *>(&w), sizeof w);
  int imports = g_imports_open;
  std::vector<std::string> marks;
  std::string why;
  int rc = fetch_marks(forged, &marks, &why);
  printf("block 1's handle naming block 2: rc %d, %s\n", rc, rc ? why.c_str() : marks[0].c_str());
  assert_int_equal(rc, ENOENT);
  assert_int_equal(int(g_imports_open), imports);
  Wire bad{};
  memcpy(&bad, wire1.data(), sizeof bad);
  bad.cap[15] ^= 1;
  std::string wrong_cap(reinterpret_cast<const char *>(&bad), sizeof bad);
  assert_int_equal(fetch_marks(wrong_cap, &marks, &why), ENOENT);
  assert_int_equal(int(g_imports_open), imports);
  assert_int_equal(fetch_marks(wire1, &marks, &why), 0);
  assert_true(marks == expected_marks(one));
}

/* Issue 42 item 24: a share that fails for want of a descriptor does not disable sharing for good.
 */
static void test_share_retries_after_emfile(void **state) {
  (void)state;
  Server *srv = new_server();
  FakeBlock b{'r', 2};
  uint64_t id = 0;
  std::string wire;
  std::string why;
  int rc = 0;
  {
    FdLimit lim(16);
    std::vector<int> held = exhaust_fds();
    rc = srv->share(&id, Shared{&b, b.pieces * kPiece, 0, nullptr}, &wire, &why);
    close_fds(held);
  }
  printf("first share without a descriptor: rc %d: %s\n", rc, why.c_str());
  assert_int_not_equal(rc, 0);
  rc = srv->share(&id, Shared{&b, b.pieces * kPiece, 0, nullptr}, &wire, &why);
  printf("second share: rc %d%s%s\n", rc, rc ? ": " : "", rc ? why.c_str() : "");
  assert_int_equal(rc, 0);
  std::vector<std::string> marks;
  assert_int_equal(fetch_marks(wire, &marks, &why), 0);
  assert_true(marks == expected_marks(b));
}

/* Issue 42 item 8: receivers that connect and say nothing hold up no other, and are dropped after
 * the request's deadline. */
static void test_idle_connections_do_not_stall_others(void **state) {
  (void)state;
  Server *srv = new_server();
  FakeBlock b{'i', 4};
  uint64_t id = 0;
  std::string wire = share(srv, &b, &id);
  std::vector<int> idle;
  for (int i = 0; i < 3; i++) {
    idle.push_back(connect_raw(wire));
  }
  Clock::time_point t0 = Clock::now();
  std::vector<std::string> marks;
  std::string why;
  int rc = fetch_marks(wire, &marks, &why);
  double took = seconds_since(t0);
  printf("fetch beside 3 idle connections: rc %d after %.2f s%s%s\n", rc, took, rc ? ": " : "",
         rc ? why.c_str() : "");
  assert_int_equal(rc, 0);
  assert_true(took < 1.0);
  char c = 0;
  assert_int_equal(recv(idle[0], &c, 1, 0), 0); /* the server hung up on it */
  assert_true(seconds_since(t0) < 4.0);
  close_fds(idle);
}

/* Issue 42, also worth a look: a connection the server cannot accept for want of a descriptor does
 * not make it spin; the receiver hears EMFILE. One silent receiver holds a descriptor of the
 * server's, so that the next accept finds none. */
static void test_accept_does_not_spin_on_emfile(void **state) {
  (void)state;
  Server *srv = new_server();
  FakeBlock b{'s', 2};
  uint64_t id = 0;
  std::string wire = share(srv, &b, &id);
  std::vector<std::string> marks;
  std::string why;
  int fds = open_fds();
  assert_int_equal(fetch_marks(wire, &marks, &why), 0); /* the server is up and accepting */
  for (int i = 0; i < 100 && open_fds() != fds; i++) {
    usleep(10 * 1000); /* until the server's side of that connection is closed */
  }
  double cpu = 0;
  Reply r{};
  ssize_t got = 0;
  {
    FdLimit lim(16);
    int silent = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    int asking = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    std::vector<int> held = exhaust_fds();
    connect_to(silent, wire);
    usleep(100 * 1000);
    connect_to(asking, wire);
    timespec c0{};
    timespec c1{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    usleep(500 * 1000);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    cpu = double(c1.tv_sec - c0.tv_sec) + double(c1.tv_nsec - c0.tv_nsec) / 1e9;
    timeval tv{1, 0};
    setsockopt(asking, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    got = recv(asking, &r, sizeof r, 0);
    close(asking);
    close(silent);
    close_fds(held);
  }
  r.msg[sizeof r.msg - 1] = '\0';
  printf("CPU over 0.5 s with a connection pending at EMFILE: %.3f s; answer: %s\n", cpu,
         got == ssize_t(sizeof r) ? r.msg : "none");
  assert_true(cpu < 0.1);
  assert_int_equal(got, sizeof r);
  assert_int_equal(r.status, EMFILE);
  assert_int_equal(fetch_marks(wire, &marks, &why), 0);
}

/* Issue 42 item 15: a block with more pieces than the descriptor limit allows at once is shared in
 * batches; and a sender out of descriptors says EMFILE, not that the memory cannot be shared. */
static void test_more_pieces_than_descriptors(void **state) {
  (void)state;
  Server *srv = new_server();
  FakeBlock b{'m', 400};
  uint64_t id = 0;
  std::string wire = share(srv, &b, &id);
  std::vector<std::string> marks;
  std::string why;
  int rc = 0;
  {
    FdLimit lim(100);
    rc = fetch_marks(wire, &marks, &why);
  }
  printf("400 pieces under a limit of 100 more descriptors: rc %d%s%s\n", rc, rc ? ": " : "",
         rc ? why.c_str() : "");
  assert_int_equal(rc, 0);
  assert_true(marks == expected_marks(b));
  b.emfile_at = 150;
  rc = fetch_marks(wire, &marks, &why);
  printf("no descriptor left at piece 150: rc %d: %s\n", rc, why.c_str());
  assert_int_equal(rc, EMFILE);
  assert_non_null(strstr(why.c_str(), "EMFILE"));
}

/* Issue 42 item 9: an open stuck on a stopped sender does not hold up opens of other handles, and
 * concurrent opens of one handle share one result, mapping or failure. */
static void test_stalled_open_does_not_block_others(void **state) {
  (void)state;
  Cache cache;
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false;
  bool release = false;
  std::thread stalled([&] {
    cache.open("stalled", [&] {
      std::unique_lock<std::mutex> g(mu);
      entered = true;
      cv.notify_all();
      cv.wait_for(g, std::chrono::seconds(3), [&] { return release; });
      return std::make_shared<int>(1);
    });
  });
  {
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [&] { return entered; });
  }
  Clock::time_point t0 = Clock::now();
  std::shared_ptr<void> p = cache.open("healthy", [] { return std::make_shared<int>(2); });
  double took = seconds_since(t0);
  printf("open of a healthy handle beside a stalled one: %.2f s\n", took);
  {
    std::lock_guard<std::mutex> g(mu);
    release = true;
    cv.notify_all();
  }
  stalled.join();
  assert_true(took < 1.0);
  std::atomic<int> made{0};
  std::vector<std::shared_ptr<void>> got(4);
  std::vector<std::thread> t;
  for (int i = 0; i < 4; i++) {
    t.emplace_back([&, i] {
      got[i] = cache.open("same", [&] {
        made++;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        return std::make_shared<int>(3);
      });
    });
  }
  for (auto &x : t) {
    x.join();
  }
  assert_int_equal(int(made), 1);
  for (int i = 1; i < 4; i++) {
    assert_ptr_equal(got[i].get(), got[0].get());
  }
  made = 0;
  std::atomic<int> failed{0};
  t.clear();
  for (int i = 0; i < 4; i++) {
    t.emplace_back([&] {
      try {
        cache.open("refused", [&]() -> std::shared_ptr<void> {
          made++;
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          throw std::runtime_error("refused");
        });
      } catch (const std::runtime_error &) {
        failed++;
      }
    });
  }
  for (auto &x : t) {
    x.join();
  }
  assert_int_equal(int(made), 1); /* one attempt, its failure shared, then forgotten */
  assert_int_equal(int(failed), 4);
}

/* Issue 42 item 16: the cache forgets a handle once the last user of its mapping drops it. */
static void test_cache_shrinks_when_mappings_drop(void **state) {
  (void)state;
  Cache cache;
  std::atomic<int> live{0};
  for (int i = 0; i < 1000; i++) {
    std::shared_ptr<void> p = cache.open("handle " + std::to_string(i), [&] {
      live++;
      return std::shared_ptr<void>(new int(i), [&](void *q) {
        live--;
        delete static_cast<int *>(q);
      });
    });
  }
  printf("entries after 1000 handles opened and dropped: %zu\n", cache.size());
  assert_int_equal(int(live), 0);
  assert_int_equal(cache.size(), 0);
  int made = 0;
  auto make = [&made] { return std::make_shared<int>(++made); };
  std::shared_ptr<void> a = cache.open("again", make);
  std::shared_ptr<void> b = cache.open("again", make);
  assert_ptr_equal(a.get(), b.get()); /* held twice: one mapping */
  a.reset();
  assert_int_equal(cache.size(), 1);
  b.reset();
  assert_int_equal(cache.size(), 0);
  a = cache.open("again", make);
  assert_int_equal(made, 2); /* dropped, then opened afresh */
}

/* A sender that answers with what the test says: the receiver's side of hostile peers. */
struct FakeSender {
  int listen_fd = -1;
  std::string wire;
  std::thread thread;
  FakeSender(const char *name, const std::function<void(int)> &answer) {
    listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "%s-%d", name, int(getpid()));
    socklen_t len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + strlen(a.sun_path + 1));
    assert_int_equal(bind(listen_fd, reinterpret_cast<sockaddr *>(&a), len), 0);
    assert_int_equal(listen(listen_fd, 4), 0);
    Wire w{};
    memcpy(w.magic, "gpuguard", 8);
    w.version = 2;
    w.size = kPiece;
    w.pid = int32_t(getpid());
    snprintf(w.name, sizeof w.name, "%s", a.sun_path + 1);
    wire.assign(reinterpret_cast<const char *>(&w), sizeof w);
    thread = std::thread([this, answer] {
      int conn = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      gg_torch::ipc::Request q{};
      if (recv(conn, &q, sizeof q, 0) == ssize_t(sizeof q)) {
        answer(conn);
      }
      close(conn);
    });
  }
  ~FakeSender() {
    thread.join();
    close(listen_fd);
  }
};

/* Sends a batch of k pieces with n descriptors (memfds) beside it. */
void send_fds(int conn, uint32_t k, int n) {
  gg_torch::ipc::Batch b{};
  b.k = k;
  for (uint32_t i = 0; i < gg_torch::ipc::kBatch; i++) {
    b.sizes[i] = kPiece;
  }
  std::vector<int> fds;
  for (int i = 0; i < n; i++) {
    fds.push_back(memfd_create("gg-hostile", MFD_CLOEXEC));
  }
  char ctrl[CMSG_SPACE(sizeof(int) * 64)] = {};
  iovec iov{&b, sizeof b};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl;
  m.msg_controllen = CMSG_SPACE(sizeof(int) * n);
  cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * n);
  memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * n);
  sendmsg(conn, &m, MSG_NOSIGNAL);
  close_fds(fds);
}

/* Senders that lie get a clean error, and leave no descriptor or mapping behind. */
static void test_hostile_senders_leave_nothing(void **state) {
  (void)state;
  struct Case {
    const char *name;
    gg_torch::ipc::Reply reply;
    uint32_t k;
    int fds;
  };
  const Case cases[] = {
      {"gg-no-pieces", {0, 0, 0, 0, {}}, 0, 0},
      {"gg-short-span", {0, 2, kPiece, 0, {}}, 1, 1},
      {"gg-more-fds-than-said", {0, 2, 2 * kPiece, 0, {}}, 1, 40},
      {"gg-fewer-fds-than-said", {0, 2, 2 * kPiece, 0, {}}, 2, 1},
      {"gg-more-pieces-than-said", {0, 1, kPiece, 0, {}}, 2, 2},
      {"gg-no-batch", {0, 1, kPiece, 0, {}}, 0, 0},
  };
  int fds = open_fds();
  int imports = g_imports_open;
  for (const Case &c : cases) {
    std::string why;
    int rc = 0;
    {
      FakeSender liar(c.name, [&c](int conn) {
        send(conn, &c.reply, sizeof c.reply, MSG_NOSIGNAL);
        if (c.k > 0) {
          send_fds(conn, c.k, c.fds);
        }
      });
      std::vector<std::string> marks;
      rc = fetch_marks(liar.wire, &marks, &why, 1000);
    }
    printf("%s: rc %d: %s\n", c.name, rc, why.c_str());
    assert_int_not_equal(rc, 0);
    assert_int_equal(open_fds(), fds);
    assert_int_equal(int(g_imports_open), imports);
  }
}

/* Receivers that send garbage, half a request or nothing get nothing, and the next one is served.
 */
static void test_hostile_receivers_get_nothing(void **state) {
  (void)state;
  Server *srv = new_server();
  FakeBlock b{'h', 3};
  uint64_t id = 0;
  std::string wire = share(srv, &b, &id);
  const size_t sizes[] = {0, 3, sizeof(gg_torch::ipc::Request), 4096};
  for (size_t n : sizes) {
    int fd = connect_raw(wire);
    std::vector<char> junk(n, '\x5a');
    if (n > 0) {
      send(fd, junk.data(), n, MSG_NOSIGNAL);
    } else {
      shutdown(fd, SHUT_WR);
    }
    Reply r{};
    timeval tv{3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t got = recv(fd, &r, sizeof r, 0);
    close(fd);
    printf("a receiver sending %zu bytes: %s\n", n,
           got == ssize_t(sizeof r) ? strerror(r.status)
           : got == 0               ? "hung up"
                                    : "no answer");
    assert_true(got == 0 || (got == ssize_t(sizeof r) && r.status == ENOENT));
  }
  std::vector<std::string> marks;
  std::string why;
  assert_int_equal(fetch_marks(wire, &marks, &why), 0);
  assert_true(marks == expected_marks(b));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_maps_every_piece),
      cmocka_unit_test(test_handle_opens_its_own_block_only),
      cmocka_unit_test(test_share_retries_after_emfile),
      cmocka_unit_test(test_idle_connections_do_not_stall_others),
      cmocka_unit_test(test_accept_does_not_spin_on_emfile),
      cmocka_unit_test(test_more_pieces_than_descriptors),
      cmocka_unit_test(test_stalled_open_does_not_block_others),
      cmocka_unit_test(test_cache_shrinks_when_mappings_drop),
      cmocka_unit_test(test_hostile_senders_leave_nothing),
      cmocka_unit_test(test_hostile_receivers_get_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
