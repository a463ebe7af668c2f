/* test_arena_sites.c — allocation sites (GG_ARENA_BACKTRACE, GPUGUARD_BACKTRACE=1): each live block
 * carries where it was allocated, starting at the caller of gg_alloc; the guard's leak report names
 * the calling functions under each tag; nothing of it when off. Built with -rdynamic, so the
 * functions here have names dladdr() can find. */
#include <dlfcn.h>
#include <unistd.h>

#include "gg_test.h"
#include "core/internal.h"
#include "core/symbol_internal.h"

#define MiB ((size_t)1 << 20)

static int setup(void **state) {
  (void)state;
  gg_test_use_host("256M", NULL);
  unsetenv("GPUGUARD_BACKTRACE");
  unsetenv("GPUGUARD_LEAK_REPORT");
  return 0;
}

static gg_arena_t *arena(unsigned flags) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.name = "sites", o.capacity = 64 * MiB, o.chunk_size = 4 * MiB, o.flags = flags;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return a;
}

/* Two allocating functions, exported (the build hides symbols by default; -rdynamic puts exported
 * ones in the dynamic table dladdr reads), noinline so each is a frame of its own. */
#define GG_TEST_SITE __attribute__((noinline, visibility("default")))
GG_TEST_SITE void *gg_test_site_weights(gg_arena_t *a, size_t n);
GG_TEST_SITE void *gg_test_site_weights(gg_arena_t *a, size_t n) {
  void *p = NULL;
  gg_assert_ok(gg_alloc_ex(a, n, 0, "weights", &p));
  __asm__ volatile("" ::: "memory"); /* keeps the call from becoming a tail call */
  return p;
}

GG_TEST_SITE void *gg_test_site_grads(gg_arena_t *a, size_t n);
GG_TEST_SITE void *gg_test_site_grads(gg_arena_t *a, size_t n) {
  void *p = NULL;
  gg_assert_ok(gg_alloc(a, n, &p));
  __asm__ volatile("" ::: "memory");
  return p;
}

/* A function's address as data (memcpy: the conversion ISO C allows). */
static const void *fn_addr(void *(*fn)(gg_arena_t *, size_t)) {
  const void *p;
  memcpy(&p, &fn, sizeof p);
  return p;
}

typedef struct seen {
  int blocks, with_frames;
  char first[8][512]; /* the name of frames[0] of the first blocks */
  const void *fn[8];  /* the function frames[0] lies in */
} seen_t;

static int visit(const gg_block_info_t *b, void *user) {
  seen_t *s = user;
  if (b->n_frames) {
    assert_non_null(b->frames);
    assert_true(b->n_frames <= 8);
    s->with_frames++;
  } else {
    assert_null(b->frames);
  }
  if (s->blocks < 8 && b->n_frames) {
    gg__site_name(b->frames[0], s->first[s->blocks], sizeof s->first[0]);
    Dl_info info;
    if (dladdr((const char *)b->frames[0] - 1, &info)) s->fn[s->blocks] = info.dli_saddr;
  }
  s->blocks++;
  return 0;
}

static void test_sites_name_the_caller(void **state) {
  (void)state;
  gg_arena_t *a = arena(GG_ARENA_BACKTRACE);
  void *w = gg_test_site_weights(a, 1000);
  void *g = gg_test_site_grads(a, 2000);
  assert_true(w < g); /* foreach goes in address order */
  seen_t s = {0};
  gg_assert_ok(gg_arena_foreach_block(a, visit, &s));
  assert_int_equal(s.blocks, 2);
  assert_int_equal(s.with_frames, 2);
  /* The first frame is the return address into the function that called gg_alloc_ex / gg_alloc. */
  assert_ptr_equal(s.fn[0], fn_addr(gg_test_site_weights));
  assert_ptr_equal(s.fn[1], fn_addr(gg_test_site_grads));
  assert_non_null(strstr(s.first[0], "gg_test_site_weights+0x"));
  assert_non_null(strstr(s.first[1], "gg_test_site_grads+0x"));
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_sites_off(void **state) {
  (void)state;
  gg_arena_t *a = arena(0);
  gg_test_site_weights(a, 1000);
  seen_t s = {0};
  gg_assert_ok(gg_arena_foreach_block(a, visit, &s));
  assert_int_equal(s.blocks, 1);
  assert_int_equal(s.with_frames, 0);
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_sites_from_environment(void **state) {
  (void)state;
  setenv("GPUGUARD_BACKTRACE", "1", 1);
  gg_arena_t *a = arena(0);
  gg_test_site_grads(a, 1000);
  seen_t s = {0};
  gg_assert_ok(gg_arena_foreach_block(a, visit, &s));
  assert_int_equal(s.with_frames, 1);
  assert_ptr_equal(s.fn[0], fn_addr(gg_test_site_grads));
  gg_assert_ok(gg_arena_destroy(a));
  setenv("GPUGUARD_BACKTRACE", "maybe", 1);
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  gg_arena_t *b = NULL;
  gg_assert_fails(gg_arena_create(&b, &o), GG_EINVAL, "GPUGUARD_BACKTRACE='maybe'");
  assert_null(b);
  setenv("GPUGUARD_BACKTRACE", "0", 1);
  a = arena(0);
  gg_test_site_grads(a, 1000);
  memset(&s, 0, sizeof s);
  gg_assert_ok(gg_arena_foreach_block(a, visit, &s));
  assert_int_equal(s.with_frames, 0);
  gg_assert_ok(gg_arena_destroy(a));
  unsetenv("GPUGUARD_BACKTRACE");
}

/* A freed block's site goes with it: a new block at the same address has its own. Many blocks come
 * and go (scopes included) and only the live ones keep sites. */
static void test_sites_follow_live_blocks(void **state) {
  (void)state;
  gg_arena_t *a = arena(GG_ARENA_BACKTRACE | GG_ARENA_NO_STREAM);
  void *w = gg_test_site_weights(a, 4096);
  gg_assert_ok(gg_free(a, w));
  void *g = gg_test_site_grads(a, 4096);
  assert_ptr_equal(g, w); /* the same address again */
  seen_t s = {0};
  gg_assert_ok(gg_arena_foreach_block(a, visit, &s));
  assert_int_equal(s.blocks, 1);
  assert_ptr_equal(s.fn[0], fn_addr(gg_test_site_grads));
  for (int round = 0; round < 200; round++) {
    gg_scope_t sc;
    gg_assert_ok(gg_scope_begin(a, &sc));
    for (int i = 0; i < 50; i++) gg_test_site_weights(a, (size_t)(i + 1) * 512);
    gg_assert_ok(gg_scope_end(&sc));
    void *p = gg_test_site_weights(a, 700);
    gg_assert_ok(gg_free(a, p));
  }
  memset(&s, 0, sizeof s);
  gg_assert_ok(gg_arena_foreach_block(a, visit, &s));
  assert_int_equal(s.blocks, 1);
  assert_int_equal(s.with_frames, 1);
  assert_ptr_equal(s.fn[0], fn_addr(gg_test_site_grads));
  gg_assert_ok(gg_arena_destroy(a));
}

/* The guard's leak report, text and JSON: the calling functions under their tag; nothing when off.
 * */
static void leak_report(unsigned flags, const char *format, char *buf, size_t cap) {
  char dir[] = "/tmp/gg_sites_XXXXXX", path[64], spec[96];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/report", dir);
  snprintf(spec, sizeof spec, "%s:%s", format, path);
  gg_guard_options_t go;
  gg_guard_options_init(&go);
  go.signals = 0, go.run_at_exit = false, go.leak_report = spec, go.name = "sites";
  gg_guard_t *g = NULL;
  gg_assert_ok(gg_guard_create(&g, &go));
  gg_arena_t *a = arena(flags);
  volatile int three =
      3; /* a loop the compiler cannot unroll: one call site, one allocation site */
  for (int i = 0; i < three; i++) gg_test_site_weights(a, 1000);
  gg_test_site_grads(a, 5000);
  gg_assert_ok(gg_guard_destroy(g));
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
  printf("%s", buf);
  gg_assert_ok(gg_arena_destroy(a));
  unlink(path);
  rmdir(dir);
}

static void test_leak_report_sites(void **state) {
  (void)state;
  char buf[8192];
  leak_report(GG_ARENA_BACKTRACE, "text", buf, sizeof buf);
  const char *w = strstr(buf, "tag 'weights': 3 blocks, 3000 bytes");
  assert_non_null(w);
  const char *at = strstr(w, "3 blocks, 3000 bytes allocated at:");
  assert_non_null(at);
  assert_non_null(strstr(at, "#0 gg_test_site_weights+0x"));
  assert_non_null(strstr(at, "#1 ")); /* the caller's caller: the report goes up the stack */
  const char *gr = strstr(buf, "tag '(none)': 1 block, 5000 bytes");
  assert_non_null(gr);
  assert_non_null(strstr(gr, "#0 gg_test_site_grads+0x"));
  leak_report(GG_ARENA_BACKTRACE, "json", buf, sizeof buf);
  assert_non_null(strstr(
      buf, "{\"tag\":\"weights\",\"count\":3,\"bytes\":3000,\"sites\":[{\"count\":3,\"bytes\":3000,"
           "\"frames\":[\"gg_test_site_weights+0x"));
  leak_report(0, "text", buf, sizeof buf);
  assert_non_null(strstr(buf, "tag 'weights': 3 blocks, 3000 bytes"));
  assert_null(strstr(buf, "allocated at"));
  assert_null(strstr(buf, "gg_test_site"));
  leak_report(0, "json", buf, sizeof buf);
  assert_non_null(strstr(buf, "{\"tag\":\"weights\",\"count\":3,\"bytes\":3000}"));
  assert_null(strstr(buf, "\"sites\":["));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_sites_name_the_caller, setup),
      cmocka_unit_test_setup(test_sites_off, setup),
      cmocka_unit_test_setup(test_sites_from_environment, setup),
      cmocka_unit_test_setup(test_sites_follow_live_blocks, setup),
      cmocka_unit_test_setup(test_leak_report_sites, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
