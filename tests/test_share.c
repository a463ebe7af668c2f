/* test_share.c — share.h on the host backend: every argument and state the export and import calls
 * refuse, the counting call (which needs no descriptor) and the host backend's GG_ENOTSUP. */
#include "gg_test.h"

#define MiB ((size_t)1 << 20)

static gg_arena_t *host_arena(size_t chunk) {
  gg_test_use_host("64M", "2M");
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 32 * MiB;
  o.chunk_size = chunk;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return a;
}

static void test_export_arguments(void **state) {
  (void)state;
  gg_arena_t *a = host_arena(2 * MiB);
  void *p = NULL;
  gg_assert_ok(gg_alloc(a, 4096, &p));
  gg_share_piece_t pieces[2];
  size_t total = 0;
  gg_assert_fails(gg_arena_export(NULL, p, 4096, 0, pieces, 2, &total, NULL), GG_EINVAL,
                  "gg_arena_export: arena is NULL");
  gg_assert_fails(gg_arena_export(a, NULL, 4096, 0, pieces, 2, &total, NULL), GG_EINVAL,
                  "ptr is NULL");
  gg_assert_fails(gg_arena_export(a, p, 0, 0, pieces, 2, &total, NULL), GG_EINVAL, "size is 0");
  gg_assert_fails(gg_arena_export(a, p, 4096, 0, pieces, 2, NULL, NULL), GG_EINVAL,
                  "total is NULL");
  gg_assert_fails(gg_arena_export(a, p, 4096, 0, NULL, 2, &total, NULL), GG_EINVAL,
                  "pieces is NULL but cap is 2");
  gg_assert_fails(gg_arena_export(a, p, SIZE_MAX, 0, NULL, 0, &total, NULL), GG_EINVAL,
                  "bad range");
  /* A pointer no chunk of this arena maps: the stack, and memory of another arena. */
  int local = 0;
  gg_assert_fails(gg_arena_export(a, &local, 4, 0, NULL, 0, &total, NULL), GG_ENOTFOUND,
                  "gg_arena_export: ");
  gg_arena_t *b = host_arena(2 * MiB);
  void *q = NULL;
  gg_assert_ok(gg_alloc(b, 4096, &q));
  gg_assert_fails(gg_arena_export(a, q, 4096, 0, NULL, 0, &total, NULL), GG_ENOTFOUND,
                  "not mapped by the arena");
  /* Past the mapped end of the block's chunk. */
  gg_assert_fails(gg_arena_export(a, p, 64 * MiB, 0, NULL, 0, &total, NULL), GG_ENOTFOUND,
                  "not mapped");
  gg_assert_ok(gg_arena_destroy(b));
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_fails(gg_arena_export(a, p, 4096, 0, NULL, 0, &total, NULL), GG_EINVAL,
                  "gg_arena_export: ");
}

static void test_export_counts_and_refuses(void **state) {
  (void)state;
  gg_arena_t *a = host_arena(2 * MiB);
  void *p = NULL;
  gg_assert_ok(gg_alloc(a, 5 * MiB, &p));
  size_t total = 0, offset = 99;
  gg_assert_ok(gg_arena_export(a, p, 5 * MiB, 0, NULL, 0, &total, &offset));
  assert_true(total >= 1);
  assert_true(offset < 2 * MiB);
  size_t one = 0;
  gg_assert_ok(gg_arena_export(a, (char *)p + 4096, 1, 0, NULL, 0, &one, &offset));
  assert_int_equal(one, 1);
  /* first beyond the last piece, whether or not anything would be written */
  gg_assert_fails(gg_arena_export(a, p, 5 * MiB, total, NULL, 0, &one, NULL), GG_EINVAL,
                  "beyond the last");
  gg_share_piece_t pieces[4] = {{-1, 0}, {-1, 0}, {-1, 0}, {-1, 0}};
  gg_assert_fails(gg_arena_export(a, p, 5 * MiB, total + 3, pieces, 4, &one, NULL), GG_EINVAL,
                  "beyond the last");
  /* The host backend's chunks are private memory: no descriptor, nothing written. */
  gg_assert_fails(gg_arena_export(a, p, 5 * MiB, 0, pieces, 4, &one, NULL), GG_ENOTSUP,
                  "the host backend cannot export memory");
  for (int i = 0; i < 4; i++) assert_int_equal(pieces[i].fd, -1);
  gg_assert_ok(gg_free(a, p));
  gg_assert_ok(gg_arena_destroy(a));
}

/* The walk under the range fails: its message is said once, whole, under the export's name, and
 * pinned word for word so the wording cannot drift between the walk and the export. */
static void test_export_walk_message(void **state) {
  (void)state;
  gg_arena_t *a = host_arena(2 * MiB);
  gg_arena_t *b = host_arena(2 * MiB);
  void *q = NULL;
  gg_assert_ok(gg_alloc(b, 4096, &q));
  size_t total = 0;
  char want[128];
  /* A block of another arena: a hole at its first byte. */
  assert_int_equal(gg_arena_export(a, q, 4096, 0, NULL, 0, &total, NULL), GG_ENOTFOUND);
  snprintf(want, sizeof want, "GG_ENOTFOUND: gg_arena_export: %p is not mapped by the arena", q);
  assert_string_equal(gg_last_error(), want);
  /* A range that wraps around the address space. */
  assert_int_equal(gg_arena_export(a, q, SIZE_MAX, 0, NULL, 0, &total, NULL), GG_EINVAL);
  snprintf(want, sizeof want, "GG_EINVAL: gg_arena_export: bad range %p + %zu", q,
           (size_t)SIZE_MAX);
  assert_string_equal(gg_last_error(), want);
  /* The walk's own name stays on its own calls. */
  assert_int_equal(gg_arena_foreach_mapping(a, q, 4096, NULL, NULL), GG_EINVAL);
  assert_string_equal(gg_last_error(), "GG_EINVAL: gg_arena_foreach_mapping: visit is NULL");
  gg_assert_ok(gg_free(b, q));
  gg_assert_ok(gg_arena_destroy(b));
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_import_refused(void **state) {
  (void)state;
  gg_test_use_host(NULL, NULL);
  gg_import_t *imp = (gg_import_t *)&imp;
  gg_assert_fails(gg_import_open(NULL, NULL, 0, 4096), GG_EINVAL, "imp is NULL");
  gg_assert_fails(gg_import_open(&imp, NULL, 0, 0), GG_EINVAL, "size is 0");
  assert_null(imp);
  gg_assert_fails(gg_import_open(&imp, NULL, 0, 2 * MiB), GG_ENOTSUP,
                  "the host backend cannot map memory of another process");
  assert_null(imp);
  gg_assert_fails(gg_import_open(&imp, NULL, 3, 2 * MiB), GG_ENODEV, "device 3 does not exist");
  /* Named, the backend is that one whatever GPUGUARD_BACKEND says (a receiver maps with the
   * exporter's family); a name no backend has is refused. */
  gg_assert_fails(gg_import_open(&imp, "host", 0, 2 * MiB), GG_ENOTSUP, "host backend cannot map");
  gg_assert_fails(gg_import_open(&imp, "bogus", 0, 2 * MiB), GG_EINVAL, "bogus");
  assert_null(imp);
  gg_share_piece_t piece = {0, 2 * MiB};
  gg_assert_fails(gg_import_map(NULL, &piece), GG_EINVAL, "imp is NULL");
  assert_null(gg_import_ptr(NULL));
  assert_int_equal(gg_import_close(NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_export_arguments),
      cmocka_unit_test(test_export_counts_and_refuses),
      cmocka_unit_test(test_export_walk_message),
      cmocka_unit_test(test_import_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
