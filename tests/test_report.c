/* test_report.c — gg_report: this process's arenas with their statistics, devices, JSON that parses and
 * Prometheus text that prometheus_client's parser accepts (checked with python3 when it is there). */
#include <string.h>
#include <unistd.h>

#include "gg_test.h"

static char path[64];

static int setup(void **state) {
  (void)state;
  setenv("GPUGUARD_BACKEND", "host", 1);
  setenv("GPUGUARD_HOST_CAPACITY", "256M", 1);
  snprintf(path, sizeof path, "/tmp/gg_report_%d.txt", (int)getpid());
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(path);
  return 0;
}

static char *render(gg_format_t fmt, unsigned what) {
  FILE *f = fopen(path, "w+");
  assert_non_null(f);
  gg_assert_ok(gg_report(f, fmt, what));
  long n = ftell(f);
  char *text = calloc(1, (size_t)n + 1);
  rewind(f);
  assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  return text;
}

/* Runs a python3 check on the rendered file; returns false (and says why) when python3 or the parser
 * is missing, so the C assertions still stand on their own. */
static bool python_check(const char *code) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "python3 -c 'import sys; %s' %s", code, path);
  if (system("python3 -c 'import prometheus_client' 2>/dev/null") != 0) {
    printf("note: python3 with prometheus_client missing; parse check skipped\n");
    return false;
  }
  assert_int_equal(system(cmd), 0);
  return true;
}

static void test_arenas_in_reports(void **state) {
  (void)state;
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 64 << 20, o.chunk_size = 4 << 20, o.name = "weights \"fp32\"";
  gg_arena_t *a = NULL, *b = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  o.name = "activations";
  gg_assert_ok(gg_arena_create(&b, &o));
  void *p;
  gg_assert_ok(gg_alloc(a, 3 << 20, &p));
  gg_assert_ok(gg_alloc(b, 1000, &p));

  char *json = render(GG_FORMAT_JSON, GG_REPORT_ALL);
  assert_non_null(strstr(json, "\"arenas\":["));
  assert_non_null(strstr(json, "\"name\":\"weights \\\"fp32\\\"\""));
  assert_non_null(strstr(json, "\"bytes_in_use\":3145728"));
  assert_non_null(strstr(json, "\"name\":\"activations\""));
  assert_non_null(strstr(json, "\"bytes_in_use\":1024"));
  free(json);
  python_check("import json; d = json.load(open(sys.argv[1])); "
               "a = {x[\"name\"]: x for x in d[\"arenas\"]}; "
               "assert a[\"activations\"][\"n_live\"] == 1 and a[\"weights \\\"fp32\\\"\"][\"bytes_mapped\"] == 4 << 20, a");

  char *prom = render(GG_FORMAT_PROMETHEUS, GG_REPORT_DEVICES | GG_REPORT_ARENAS);
  char want[256];
  gg_device_info_t dev;
  gg_assert_ok(gg_device_info(0, &dev));
  /* A host arena keeps gpuguard's ordinal and the host device's UUID; the device itself is no GPU and
   * is not exported (no NVML here). */
  snprintf(want, sizeof want, "gpuguard_arena_in_use_bytes{gpu=\"0\",UUID=\"%s\",", dev.uuid);
  assert_non_null(strstr(prom, want));
  snprintf(want, sizeof want, ",pid=\"%d\",arena=\"activations\",arena_id=\"", (int)getpid());
  assert_non_null(strstr(prom, want));
  assert_non_null(strstr(prom, "arena=\"weights \\\"fp32\\\"\""));
  assert_null(strstr(prom, "gpuguard_device_memory_total_bytes"));
  assert_non_null(strstr(prom, "gpuguard_devices{source=\"none\"} 0\n"));
  free(prom);
  python_check("from prometheus_client.parser import text_string_to_metric_families as p; "
               "f = {m.name: m for m in p(open(sys.argv[1]).read())}; "
               "s = [x for x in f[\"gpuguard_arena_mapped_bytes\"].samples]; "
               "assert sorted(x.value for x in s) == [4194304.0, 4194304.0], s");

  /* Destroyed arenas leave the reports. */
  gg_assert_ok(gg_arena_destroy(b));
  json = render(GG_FORMAT_JSON, GG_REPORT_ARENAS);
  assert_null(strstr(json, "activations"));
  assert_non_null(strstr(json, "weights"));
  free(json);
  gg_assert_ok(gg_arena_destroy(a));
  json = render(GG_FORMAT_JSON, GG_REPORT_ARENAS);
  assert_non_null(strstr(json, "\"arenas\":[]"));
  free(json);
}

/* Without arenas no gpuguard_arena_* family is written; label values stay valid UTF-8 and cannot break
 * a line, whatever bytes an arena name holds; the parser reads the name back. */
static void test_prometheus_families_and_labels(void **state) {
  (void)state;
  char *prom = render(GG_FORMAT_PROMETHEUS, GG_REPORT_ALL);
  assert_null(strstr(prom, "gpuguard_arena_"));
  assert_null(strstr(prom, "gpuguard_device_memory_total_bytes{"));
  free(prom);
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 8 << 20, o.name = "bad\xff\x1b[31m\"q\"\nx\xc3\xa9";
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  prom = render(GG_FORMAT_PROMETHEUS, GG_REPORT_ARENAS);
  assert_non_null(strstr(prom, "arena=\"bad\xef\xbf\xbd\xef\xbf\xbd[31m\\\"q\\\"\\nx\xc3\xa9\""));
  for (const unsigned char *p = (const unsigned char *)prom; *p; p++) assert_true(*p >= 0x20 || *p == '\n');
  free(prom);
  python_check("from prometheus_client.parser import text_string_to_metric_families as p; "
               "f = {m.name: m for m in p(open(sys.argv[1], encoding=\"utf-8\", errors=\"strict\").read())}; "
               "s = f[\"gpuguard_arena_live_blocks\"].samples; "
               "assert s[0].labels[\"arena\"] == \"bad\\ufffd\\ufffd[31m\\\"q\\\"\\nx\\u00e9\", s; "
               "assert s[0].labels[\"gpu\"] == \"0\" and s[0].labels[\"UUID\"], s");
  gg_assert_ok(gg_arena_destroy(a));
}

/* NVML's readings become gauges and JSON fields; GG_REPORT_NOT_SELF leaves the caller out. */
static void test_telemetry_and_not_self(void **state) {
  (void)state;
  char procs[64];
  snprintf(procs, sizeof procs, "%d:4096", (int)getpid());
  setenv("GPUGUARD_NVML_LIBRARY", GG_FAKE_NVML, 1);
  setenv("GPUGUARD_TEST_PIDNS", "initial", 1); /* the stand-in NVML lists pids of our /proc */
  setenv("FAKE_NVML_PROCS", procs, 1);
  setenv("FAKE_NVML_TELEMETRY", "87,40,61,412500,700000", 1);
  char *prom = render(GG_FORMAT_PROMETHEUS, GG_REPORT_DEVICES | GG_REPORT_PROCESSES);
  assert_non_null(strstr(prom, "gpuguard_device_utilization_ratio{gpu=\"0\""));
  assert_non_null(strstr(prom, "} 0.87\n"));
  assert_non_null(strstr(prom, "} 412.5\n"));
  assert_non_null(strstr(prom, "gpuguard_device_temperature_celsius{gpu=\"0\""));
  char want[64];
  snprintf(want, sizeof want, ",pid=\"%d\",", (int)getpid());
  assert_non_null(strstr(prom, want));
  free(prom);
  prom = render(GG_FORMAT_PROMETHEUS, GG_REPORT_DEVICES | GG_REPORT_PROCESSES | GG_REPORT_NOT_SELF);
  assert_null(strstr(prom, want));
  assert_null(strstr(prom, "gpuguard_process_memory_used_bytes")); /* no sample: no family */
  free(prom);
  char *json = render(GG_FORMAT_JSON, GG_REPORT_DEVICES);
  assert_non_null(strstr(json, "\"utilization_gpu\":87,\"utilization_memory\":40,\"temperature_c\":61,"
                               "\"power_watts\":412.500,\"power_limit_watts\":700.000"));
  free(json);
  unsetenv("FAKE_NVML_TELEMETRY");
  prom = render(GG_FORMAT_PROMETHEUS, GG_REPORT_DEVICES);
  assert_null(strstr(prom, "utilization")); /* NVML does not say: no family */
  free(prom);
  json = render(GG_FORMAT_JSON, GG_REPORT_DEVICES);
  assert_non_null(strstr(json, "\"utilization_gpu\":null"));
  free(json);
  unsetenv("GPUGUARD_NVML_LIBRARY");
  unsetenv("FAKE_NVML_PROCS");
}

/* Two unnamed arenas are two series: before arena_id their label sets were identical and Prometheus
 * kept one of the two values. Counters carry _total. */
static void test_unnamed_arenas_are_distinct(void **state) {
  (void)state;
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 8 << 20;
  gg_arena_t *a = NULL, *b = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  gg_assert_ok(gg_arena_create(&b, &o));
  void *p;
  gg_assert_ok(gg_alloc(a, 4096, &p));
  char *prom = render(GG_FORMAT_PROMETHEUS, GG_REPORT_ARENAS);
  char *first = strstr(prom, "\ngpuguard_arena_in_use_bytes{");
  assert_non_null(first);
  char *second = strstr(first + 1, "\ngpuguard_arena_in_use_bytes{");
  assert_non_null(second);
  size_t l1 = strcspn(first + 1, "}"), l2 = strcspn(second + 1, "}");
  assert_false(l1 == l2 && memcmp(first + 1, second + 1, l1) == 0); /* label sets differ */
  assert_non_null(strstr(prom, "# TYPE gpuguard_arena_allocations_total counter\n"));
  free(prom);
  gg_assert_ok(gg_arena_destroy(b));
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_bad_arguments(void **state) {
  (void)state;
  FILE *f = fopen(path, "w");
  gg_assert_fails(gg_report(NULL, GG_FORMAT_JSON, GG_REPORT_ALL), GG_EINVAL, "out is NULL");
  gg_assert_fails(gg_report(f, (gg_format_t)7, GG_REPORT_ALL), GG_EINVAL, "unknown format 7");
  gg_assert_fails(gg_report(f, GG_FORMAT_JSON, 0x100), GG_EINVAL, "unknown report bits");
  gg_assert_ok(gg_report(f, GG_FORMAT_JSON, 0)); /* empty but valid */
  fclose(f);
  FILE *ro = fopen("/dev/full", "w");
  if (ro) {
    gg_assert_fails(gg_report(ro, GG_FORMAT_PROMETHEUS, GG_REPORT_DEVICES), GG_EIO, "writing");
    fclose(ro);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_arenas_in_reports, setup, teardown),
      cmocka_unit_test_setup_teardown(test_prometheus_families_and_labels, setup, teardown),
      cmocka_unit_test_setup_teardown(test_telemetry_and_not_self, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unnamed_arenas_are_distinct, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_arguments, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
