/* test_json.c — the one JSON string writer (gg_json_write_string, used by the leak report, the
 * reports, the receipt and the CLI): UTF-8 passes as is, what JSON needs is escaped, bytes that are
 * not text become U+FFFD, so the output is always valid JSON and valid UTF-8. */
#include "gg_test.h"

/* The literal gg_json_write_string writes for s. */
static const char *quote(const char *s) {
  static char out[512];
  FILE *f = fmemopen(out, sizeof out, "w");
  assert_non_null(f);
  gg_assert_ok(gg_json_write_string(f, s));
  fclose(f);
  return out;
}

static void test_utf8_passes_through(void **state) {
  (void)state;
  assert_string_equal(quote("naïve-café"), "\"naïve-café\"");
  assert_string_equal(quote("日本語 \xF0\x9F\x98\x80"),
                      "\"日本語 \xF0\x9F\x98\x80\""); /* 3- and 4-byte forms */
  assert_string_equal(quote("\xEF\xBF\xBF\xF4\x8F\xBF\xBF"),
                      "\"\xEF\xBF\xBF\xF4\x8F\xBF\xBF\""); /* U+FFFF, U+10FFFF */
  assert_string_equal(quote(""), "\"\"");
  assert_string_equal(quote(NULL), "\"\"");
}

static void test_escapes(void **state) {
  (void)state;
  assert_string_equal(quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  assert_string_equal(quote("l1\nl2\r\t"), "\"l1\\nl2\\r\\t\"");
  assert_string_equal(quote("\x01\x1b[31m\x7f"), "\"\\u0001\\u001b[31m\\u007f\"");
}

static void test_invalid_bytes_become_replacement(void **state) {
  (void)state;
  assert_string_equal(quote("a\xFF"
                            "b"),
                      "\"a\\ufffdb\"");                                    /* never valid */
  assert_string_equal(quote("\x80x"), "\"\\ufffdx\"");                     /* stray continuation */
  assert_string_equal(quote("\xE2\x82"), "\"\\ufffd\\ufffd\"");            /* truncated */
  assert_string_equal(quote("\xC0\xAF"), "\"\\ufffd\\ufffd\"");            /* overlong '/' */
  assert_string_equal(quote("\xE0\x80\xAF"), "\"\\ufffd\\ufffd\\ufffd\""); /* overlong, 3 bytes */
  assert_string_equal(quote("\xED\xA0\x80"), "\"\\ufffd\\ufffd\\ufffd\""); /* a surrogate */
  assert_string_equal(quote("\xF4\x90\x80\x80"),
                      "\"\\ufffd\\ufffd\\ufffd\\ufffd\""); /* > U+10FFFF */
  assert_string_equal(quote("caf\xE9"), "\"caf\\ufffd\""); /* Latin-1, not UTF-8 */
}

static void test_bad_stream(void **state) {
  (void)state;
  gg_assert_fails(gg_json_write_string(NULL, "x"), GG_EINVAL, "stream");
}

/* The receipt goes through the same writer: a command line in UTF-8 comes out unchanged. */
static void test_receipt_keeps_utf8(void **state) {
  (void)state;
  gg_proc_outcome_t o = {.pid = 42, .found = "tracked", .end = GG_PROC_EXITED};
  strcpy(o.command, "sleep naïve-café \xFF");
  gg_proc_receipt_t r = {.count = 1, .procs = &o};
  char buf[512];
  gg_assert_ok(gg_proc_receipt_json(&r, buf, sizeof buf, NULL));
  assert_non_null(strstr(buf, "\"command\":\"sleep naïve-café \\ufffd\""));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_utf8_passes_through),
      cmocka_unit_test(test_escapes),
      cmocka_unit_test(test_invalid_bytes_become_replacement),
      cmocka_unit_test(test_bad_stream),
      cmocka_unit_test(test_receipt_keeps_utf8),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
