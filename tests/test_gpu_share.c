/* test_gpu_share.c — share.h on a real device: a block of several chunks exported in batches, its
 * descriptors sent over a socketpair (SCM_RIGHTS) to a freshly exec'd process, which maps them and
 * reads the parent's bytes back; and EMFILE, which closes what the call exported. Skips without a
 * CUDA device (or without shareable memory). */
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "gg_test.h"

#define MiB ((size_t)1 << 20)

/* What the importer is told before the pieces come. */
typedef struct header {
  size_t total, offset, block, sum;
} header_t;

static void send_piece(int sock, const gg_share_piece_t *p) {
  char ctl[CMSG_SPACE(sizeof(int))];
  memset(ctl, 0, sizeof ctl);
  size_t size = p->size;
  struct iovec iov = {&size, sizeof size};
  struct msghdr msg = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &p->fd, sizeof(int));
  assert_int_equal(sendmsg(sock, &msg, 0), (ssize_t)sizeof size);
}

static int recv_piece(int sock, gg_share_piece_t *p) {
  char ctl[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {&p->size, sizeof p->size};
  struct msghdr msg = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
  if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != (ssize_t)sizeof p->size) return -1;
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
  memcpy(&p->fd, CMSG_DATA(c), sizeof(int));
  return 0;
}

static unsigned char pattern(size_t i) { return (unsigned char)(i * 131u + 7u); }

/* The importing process: maps every piece, reads the block, checks each byte. Exit 0 when all
 * match. */
static int importer(int sock) {
  header_t h;
  if (read(sock, &h, sizeof h) != (ssize_t)sizeof h) return 10;
  gg_import_t *imp = NULL;
  if (gg_import_open(&imp, "cuda", 0, h.sum) != 0) {
    fprintf(stderr, "importer: %s\n", gg_last_error());
    return 11;
  }
  for (size_t i = 0; i < h.total; i++) {
    gg_share_piece_t p;
    if (recv_piece(sock, &p) != 0) return 12;
    int rc = gg_import_map(imp, &p);
    close(p.fd);
    if (rc != 0) {
      fprintf(stderr, "importer: piece %zu: %s\n", i, gg_last_error());
      return 13;
    }
    if ((i + 1 < h.total) != (gg_import_ptr(imp) == NULL)) return 14;
  }
  unsigned char *got = malloc(h.block);
  gg__dev_t *d = NULL;
  if (!got || gg__dev_open("cuda", 0, &d) != 0) return 15;
  uintptr_t at = (uintptr_t)gg_import_ptr(imp) + h.offset;
  if (d->ops->copy_from_dev(d, got, at, h.block) != 0) {
    fprintf(stderr, "importer: read back: %s\n", gg_last_error());
    return 16;
  }
  size_t bad = 0;
  for (size_t i = 0; i < h.block; i++) bad += got[i] != pattern(i);
  gg__dev_close(d);
  free(got);
  if (gg_import_close(imp) != 0) return 17;
  printf("importer: %zu bytes in %zu pieces read back, %zu wrong\n", h.block, h.total, bad);
  return bad ? 18 : 0;
}

static gg_arena_t *cuda_arena(void) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "cuda";
  o.capacity = 256 * MiB;
  o.chunk_size = 2 * MiB;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return a;
}

/* Grows the arena chunk by chunk so one block spans several physical allocations. */
static void *spanning_block(gg_arena_t *a, size_t *size) {
  void *small[3];
  for (int i = 0; i < 3; i++) gg_assert_ok(gg_alloc(a, 2 * MiB - 4096, &small[i]));
  for (int i = 0; i < 3; i++) gg_assert_ok(gg_free(a, small[i]));
  *size = 5 * MiB;
  void *p = NULL;
  gg_assert_ok(gg_alloc(a, *size, &p));
  return p;
}

static void test_export_to_fresh_process(void **state) {
  (void)state;
  gg_arena_t *a = cuda_arena();
  size_t block = 0, total = 0, offset = 0;
  void *p = spanning_block(a, &block);
  unsigned char *src = malloc(block);
  assert_non_null(src);
  for (size_t i = 0; i < block; i++) src[i] = pattern(i);
  gg_assert_ok(gg_arena_copy_to_device(a, p, src, block));
  free(src);
  int rc = gg_arena_export(a, p, block, 0, NULL, 0, &total, &offset);
  gg_assert_ok(rc);
  printf("block of %zu bytes: %zu piece(s), offset %zu\n", block, total, offset);
  gg_share_piece_t probe[1];
  size_t t2 = 0;
  rc = gg_arena_export(a, p, block, 0, probe, 1, &t2, NULL);
  if (rc == GG_ENOTSUP) {
    printf("SKIP: this device's memory is not exportable: %s\n", gg_last_error());
    gg_arena_destroy(a);
    exit(GG_TEST_SKIP);
  }
  gg_assert_ok(rc);
  close(probe[0].fd);

  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  fcntl(sv[0], F_SETFD, FD_CLOEXEC);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) { /* a fresh process: exec before any CUDA call */
    char fd[16];
    snprintf(fd, sizeof fd, "%d", sv[1]);
    execl("/proc/self/exe", "test_gpu_share", "--import", fd, (char *)NULL);
    _exit(127);
  }
  close(sv[1]);
  header_t h = {.total = total, .offset = offset, .block = block, .sum = 0};
  /* In batches of two, as a sender short of descriptors would. */
  gg_share_piece_t batch[2];
  size_t sizes = 0;
  for (size_t first = 0; first < total; first += 2) {
    size_t n = 0;
    gg_assert_ok(gg_arena_export(a, p, block, first, batch, 2, &n, NULL));
    assert_int_equal(n, total);
    for (size_t k = 0; k < 2 && first + k < total; k++) {
      sizes += batch[k].size;
      close(batch[k].fd);
    }
  }
  h.sum = sizes;
  assert_int_equal(write(sv[0], &h, sizeof h), (ssize_t)sizeof h);
  for (size_t first = 0; first < total; first += 2) {
    size_t n = 0;
    gg_assert_ok(gg_arena_export(a, p, block, first, batch, 2, &n, NULL));
    for (size_t k = 0; k < 2 && first + k < total; k++) {
      send_piece(sv[0], &batch[k]);
      close(batch[k].fd);
    }
  }
  /* Freed and trimmed here: the importer's mapping keeps the memory. */
  gg_assert_ok(gg_free(a, p));
  gg_assert_ok(gg_arena_trim(a, 0));
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  close(sv[0]);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  gg_assert_ok(gg_arena_destroy(a));
}

static int open_fds(void) {
  int n = 0;
  for (int fd = 0; fd < 1024; fd++) n += fcntl(fd, F_GETFD) >= 0;
  return n;
}

static void test_emfile_closes_what_it_exported(void **state) {
  (void)state;
  gg_arena_t *a = cuda_arena();
  size_t block = 0, total = 0;
  void *p = spanning_block(a, &block);
  gg_assert_ok(gg_arena_export(a, p, block, 0, NULL, 0, &total, NULL));
  if (total < 2) {
    printf("one piece only: EMFILE after a first export cannot be shown\n");
    gg_arena_destroy(a);
    return;
  }
  struct rlimit old;
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
  int highest = 0;
  for (int fd = 0; fd < 1024; fd++)
    if (fcntl(fd, F_GETFD) >= 0) highest = fd;
  /* Holes below the highest descriptor filled, then room for exactly one more. */
  int fill[64], nfill = 0;
  while (nfill < 64) {
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fd > highest) {
      if (fd >= 0) close(fd);
      break;
    }
    fill[nfill++] = fd;
  }
  int before = open_fds();
  struct rlimit low = {(rlim_t)highest + 2, old.rlim_max};
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
  gg_share_piece_t pieces[8];
  size_t n = 0;
  int rc = gg_arena_export(a, p, block, 0, pieces, 8, &n, NULL);
  setrlimit(RLIMIT_NOFILE, &old);
  int after = open_fds();
  for (int i = 0; i < nfill; i++) close(fill[i]);
  printf("export with one descriptor free: %s\n", gg_last_error());
  assert_int_equal(rc, GG_EIO);
  assert_non_null(strstr(gg_last_error(), "EMFILE"));
  assert_int_equal(after, before);
  gg_assert_ok(gg_arena_destroy(a));
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--import") == 0) return importer(atoi(argv[2]));
  gg_test_require_cuda();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_export_to_fresh_process),
      cmocka_unit_test(test_emfile_closes_what_it_exported),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
