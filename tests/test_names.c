/* test_names.c — names cut to fit a fixed buffer stay valid UTF-8 (Python decodes them): registry
 * fields, arena names, tags, error details and command lines are cut at a character boundary, never
 * inside one (a cut 'é' made every Python reader of the registry raise UnicodeDecodeError). */
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "core/internal.h"
#include "proc/procfs_internal.h"

/* Whole, well-formed UTF-8 sequences only (overlongs and surrogates are not made by a cut). */
static bool utf8_valid(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    size_t n = *p < 0x80             ? 1
               : (*p & 0xE0) == 0xC0 ? 2
               : (*p & 0xF0) == 0xE0 ? 3
               : (*p & 0xF8) == 0xF0 ? 4
                                     : 0;
    if (!n) return false;
    for (size_t i = 1; i < n; i++)
      if ((p[i] & 0xC0) != 0x80) return false;
    p += n;
  }
  return true;
}

static char *repeat(const char *unit, size_t times) {
  size_t u = strlen(unit);
  char *s = malloc(u * times + 1);
  assert_non_null(s);
  for (size_t i = 0; i < times; i++) memcpy(s + i * u, unit, u);
  s[u * times] = '\0';
  return s;
}

static void test_strlcpy_cuts_between_characters(void **state) {
  (void)state;
  const char *units[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                         "a\xc3\xa9"}; /* é € 😀 aé */
  for (size_t u = 0; u < 4; u++) {
    char *src = repeat(units[u], 50);
    for (size_t cap = 1; cap < 40; cap++) {
      char dst[40];
      gg__strlcpy(dst, src, cap);
      assert_true(utf8_valid(dst));
      assert_true(strlen(dst) + 4 > cap - 1 ||
                  strlen(dst) == strlen(src)); /* at most one character lost */
      assert_memory_equal(dst, src, strlen(dst));
    }
    free(src);
  }
  /* Bytes that are not UTF-8 are copied as they are, cut where asked. */
  char dst[4];
  gg__strlcpy(dst, "\xff\xfe\xfd\xfc\xfb", sizeof dst);
  assert_string_equal(dst, "\xff\xfe\xfd");
  gg__strlcpy(dst, "ab\xc3\xa9", sizeof dst);
  assert_string_equal(dst, "ab");
}

static int tag_of(const gg_block_info_t *b, void *user) {
  gg__strlcpy(user, b->tag, 128);
  return 1;
}

static void test_arena_name_tag_and_error_detail(void **state) {
  (void)state;
  char *long_name = repeat("\xc3\xa9", 100);
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host", o.capacity = 16u << 20, o.name = long_name;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  assert_true(utf8_valid(gg_arena_name(a)));
  assert_true(strlen(gg_arena_name(a)) >= 60);
  void *p = NULL;
  gg_assert_ok(gg_alloc_ex(a, 256, 0, long_name, &p));
  char tag[128];
  gg_assert_ok(gg_arena_foreach_block(a, tag_of, tag));
  assert_true(utf8_valid(tag));
  assert_true(strlen(tag) >= 60);
  gg_assert_ok(gg_free(a, p));
  gg_assert_ok(gg_arena_destroy(a));
  /* A detail message holding a long name is cut too: keep whole characters. */
  for (int pad = 0; pad < 4; pad++) {
    char *big = repeat("\xe2\x82\xac", 400);
    gg__err(GG_EINVAL, "%.*sname %s", pad, "xxx", big);
    assert_true(utf8_valid(gg_last_error()));
    free(big);
  }
  free(long_name);
}

static void test_registry_devices_and_command(void **state) {
  (void)state;
  char dir[] = "/tmp/gg_names_XXXXXX";
  assert_non_null(mkdtemp(dir));
  setenv("GPUGUARD_REGISTRY_DIR", dir, 1);
  unsetenv("GPUGUARD_SESSION");
  char *devices = repeat("\xc3\xa9", 40); /* 80 bytes for a 64-byte field */
  gg_assert_ok(gg_registry_register(devices));
  gg_session_record_t rows[8];
  size_t n = 0;
  gg_assert_ok(gg_registry_list(rows, 8, &n));
  assert_int_equal(n, 1);
  assert_true(utf8_valid(rows[0].devices));
  assert_true(strlen(rows[0].devices) >= 60);
  assert_true(utf8_valid(rows[0].command));
  gg_assert_ok(gg_registry_unregister());
  free(devices);
  /* A command line longer than the buffer, in 3-byte characters, at every alignment. */
  for (int shift = 0; shift < 3; shift++) {
    char *arg = repeat("\xe2\x82\xac", 200);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      const char *pre[] = {"a", "ab", "abc"}; /* moves where the cut falls inside a character */
      execlp("sh", "sh", "-c", "sleep 5; :", pre[shift], arg, (char *)NULL);
      _exit(127);
    }
    char cmd[256] = "";
    for (int tries = 0; tries < 200 && !strstr(cmd, "\xe2\x82\xac"); tries++) {
      usleep(10000);
      gg__proc_cmdline(pid, cmd, sizeof cmd);
    }
    assert_true(strlen(cmd) > 200);
    assert_true(utf8_valid(cmd));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    free(arg);
  }
  char rm[64];
  snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
  assert_int_equal(system(rm), 0);
  unsetenv("GPUGUARD_REGISTRY_DIR");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_strlcpy_cuts_between_characters),
      cmocka_unit_test(test_arena_name_tag_and_error_detail),
      cmocka_unit_test(test_registry_devices_and_command),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
