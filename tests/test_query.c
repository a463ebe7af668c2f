/* test_query.c — who holds a device: NVML's process records in all three layouts, unknown memory,
 * the /proc join and classification, descriptor scanning, the fallback without NVML. */
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "core/internal.h"
#include "backend/cuda/nvml_internal.h"
#include "proc/procfs_internal.h"

static char log_path[64];

static int setup(void **state) {
  (void)state;
  setenv("GPUGUARD_NVML_LIBRARY", GG_FAKE_NVML, 1);
  setenv("GPUGUARD_TEST_PIDNS", "initial", 1); /* the stand-in NVML lists pids of our /proc */
  snprintf(log_path, sizeof log_path, "/tmp/gg_fake_nvml_%d.log", (int)getpid());
  unlink(log_path);
  setenv("FAKE_NVML_LOG", log_path, 1);
  unsetenv("FAKE_NVML_FAIL_INIT");
  unsetenv("FAKE_NVML_GRAPHICS");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(log_path);
  return 0;
}

static void test_stride_probe(void **state) {
  (void)state;
  unsigned char buf[10 * 32];
  for (size_t stride = 16; stride <= 32; stride += 8) {
    memset(buf, GG__NVML_SENTINEL, sizeof buf);
    for (unsigned i = 0; i < 3; i++) {
      unsigned pid = 100 + i;
      unsigned long long mem = (i + 1) << 20;
      memset(buf + i * stride, 0, stride);
      memcpy(buf + i * stride, &pid, 4);
      memcpy(buf + i * stride + 8, &mem, 8);
    }
    assert_int_equal(gg__nvml_stride(buf, sizeof buf, 3), stride);
    gg__gpu_proc_t out[3];
    gg__nvml_decode(buf, stride, 3, out);
    for (unsigned i = 0; i < 3; i++) {
      assert_int_equal(out[i].pid, 100 + i);
      assert_int_equal(out[i].used, (long long)(i + 1) << 20);
    }
  }
  /* A last record whose final bytes happen to equal the sentinel still resolves to its layout. */
  memset(buf, GG__NVML_SENTINEL, sizeof buf);
  memset(buf, 0, 24 + 20);
  assert_int_equal(gg__nvml_stride(buf, sizeof buf, 2), 24);
  assert_int_equal(gg__nvml_stride(buf, sizeof buf, 0), 0);
  /* Nothing written where records were promised: unknown, never guessed. */
  memset(buf, GG__NVML_SENTINEL, sizeof buf);
  assert_int_equal(gg__nvml_stride(buf, sizeof buf, 2), 0);
  /* Not-available memory reads as unknown (-1). */
  unsigned long long na = ~0ull;
  memcpy(buf + 8, &na, 8);
  gg__gpu_proc_t one;
  gg__nvml_decode(buf, 24, 1, &one);
  assert_int_equal(one.used, -1);
}

static int count_lines(const char *path, const char *word) {
  FILE *f = fopen(path, "r");
  char line[64];
  int n = 0;
  while (f && fgets(line, sizeof line, f)) n += strncmp(line, word, strlen(word)) == 0;
  if (f) fclose(f);
  return n;
}

/* The row of pid, or fail. On a machine with a GPU the list also holds real processes (this test
 * among them once it has loaded the driver), so rows are found by pid, never by position. */
static const gg_process_t *find_row(const gg_process_t *rows, size_t n, pid_t pid) {
  for (size_t i = 0; i < n; i++)
    if (rows[i].pid == pid) return &rows[i];
  fail_msg("pid %d is not in the list of %zu", (int)pid, n);
  return NULL;
}

/* A child that dies with this test even when an assertion cuts the test short. */
static pid_t idle_child(void) {
  pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    pause();
    _exit(0);
  }
  return child;
}

static void list_with_stride(const char *stride) {
  pid_t child = idle_child();
  char spec[128];
  snprintf(spec, sizeof spec, "%d:%llu,%d:na", (int)getpid(), 123ull << 20, (int)child);
  setenv("FAKE_NVML_PROCS", spec, 1);
  setenv("FAKE_NVML_STRIDE", stride, 1);
  gg_process_t rows[64];
  size_t n = 0;
  gg_assert_ok(gg_process_list(0, rows, 64, &n));
  assert_true(n >= 2 && n <= 64);
  const gg_process_t *me = find_row(rows, n, getpid()), *kid = find_row(rows, n, child);
  assert_int_equal(me->used_bytes, 123ll << 20);
  assert_int_equal(me->ppid, getppid());
  assert_int_equal(me->uid, getuid());
  assert_int_equal(me->cls, GG_PROCESS_UNKNOWN);
  assert_true(me->state == 'R' || me->state == 'S');
  assert_non_null(strstr(me->command, "test_query"));
  assert_int_equal(kid->used_bytes, -1);
  assert_int_equal(kid->ppid, getpid());
  gg__pinfo_t st;
  assert_int_equal(gg__proc_read_stat(child, &st), 0);
  assert_int_equal(kid->start_time, st.start);
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
}

static void test_list_stride_16(void **state) {
  (void)state;
  list_with_stride("16");
}
static void test_list_stride_24(void **state) {
  (void)state;
  list_with_stride("24");
}
static void test_list_stride_32(void **state) {
  (void)state;
  list_with_stride("32");
}

static void test_count_only_and_truncation(void **state) {
  (void)state;
  setenv("FAKE_NVML_STRIDE", "24", 1);
  setenv("FAKE_NVML_PROCS", "", 1);
  size_t base = 99, n = 99;
  gg_assert_ok(gg_process_list(0, NULL, 0, &base)); /* real descriptor holders, on a GPU machine */
  setenv("FAKE_NVML_PROCS", "1:10,1:20,1:30", 1);   /* duplicates collapse to one row */
  setenv("FAKE_NVML_GRAPHICS", "2:5", 1);
  gg_assert_ok(gg_process_list(0, NULL, 0, &n));
  assert_int_equal(n, base + 2);
  gg_process_t one;
  gg_assert_ok(gg_process_list(0, &one, 1, &n));
  assert_int_equal(n, base + 2);
  assert_int_equal(one.pid, 1); /* the driver's rows come first */
  assert_int_equal(one.used_bytes, 10);
  /* Every query opened NVML and shut it down again. */
  assert_int_equal(count_lines(log_path, "init"), 3);
  assert_int_equal(count_lines(log_path, "shutdown"), 3);
}

static void test_bad_arguments(void **state) {
  (void)state;
  gg_process_t rows[2];
  size_t n;
  gg_assert_fails(gg_process_list(0, rows, 2, NULL), GG_EINVAL, "count is NULL");
  gg_assert_fails(gg_process_list(0, NULL, 2, &n), GG_EINVAL, "rows is NULL");
  gg_assert_fails(gg_process_list(-1, rows, 2, &n), GG_ENODEV, "device -1");
  setenv("FAKE_NVML_PROCS", "", 1);
  gg_assert_fails(gg_process_list(3, rows, 2, &n), GG_ENODEV, "NVML has no device");
}

static void test_without_nvml(void **state) {
  (void)state;
  size_t n = 99;
  gg_process_t rows[4];
  setenv("FAKE_NVML_FAIL_INIT", "1", 1);
  if (gg__cuda_probe() == 0) {
    /* A GPU without NVML: falls back to descriptor scanning, which is not an error. */
    gg_clear_error();
    gg_assert_ok(gg_process_list(0, rows, 4, &n));
    assert_string_equal(gg_last_error(), "");
  } else {
    /* No GPU at all: said clearly, with NVML's own reason. */
    gg_assert_fails(gg_process_list(0, rows, 4, &n), GG_ENODEV, "no NVIDIA GPU here");
    assert_non_null(strstr(gg_last_error(), "nvmlInit failed: Driver Not Loaded"));
    setenv("GPUGUARD_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
    gg_assert_fails(gg_process_list(0, rows, 4, &n), GG_ENODEV, "NVML could not be loaded");
  }
}

/* The machine's GPUs are NVML's, numbered as NVML numbers them, whatever CUDA here sees. */
static void test_gpus(void **state) {
  (void)state;
  setenv("FAKE_NVML_COUNT", "3", 1);
  setenv("FAKE_NVML_STRIDE", "24", 1);
  setenv("FAKE_NVML_PROCS", "", 1);
  setenv("FAKE_NVML_PROCS_2", "1:4096", 1);
  int n = 0, gpu = -1;
  gg_assert_ok(gg_gpu_count(&n));
  assert_int_equal(n, 3);
  gg_assert_ok(gg_gpu_find("2", &gpu));
  assert_int_equal(gpu, 2);
  gg_assert_ok(gg_gpu_find("gpu-FA4E0000-0000-4000-8000-000000000001", &gpu));
  assert_int_equal(gpu, 1);
  gg_assert_fails(gg_gpu_find("3", &gpu), GG_ENODEV, "GPU 3 does not exist (this machine has 3");
  gg_assert_fails(gg_gpu_find("GPU-nope", &gpu), GG_ENODEV, "GPU GPU-nope does not exist");
  gg_assert_fails(gg_gpu_find(NULL, &gpu), GG_EINVAL, "id is NULL");
  gg_assert_fails(gg_gpu_count(NULL), GG_EINVAL, "count is NULL");
  gg_device_info_t info;
  gg_assert_ok(gg_gpu_info(1, &info));
  assert_int_equal(info.index, 1);
  assert_string_equal(info.uuid, "GPU-fa4e0000-0000-4000-8000-000000000001");
  assert_string_equal(info.backend, gg__cuda_probe() == 0 ? info.backend : "nvml");
  assert_true(info.used_bytes == ((size_t)1 << 30) && !info.simulated);
  gg_assert_fails(gg_gpu_info(3, &info), GG_ENODEV, "does not exist");
  gg_assert_fails(gg_gpu_info(-1, &info), GG_ENODEV, "does not exist");
  gg_process_t rows[4];
  size_t k = 0;
  gg_assert_ok(gg_gpu_processes(2, rows, 4, &k));
  assert_int_equal(k, 1);
  assert_int_equal(rows[0].device, 2);
  assert_int_equal(rows[0].used_bytes, 4096);
  gg_assert_fails(gg_gpu_processes(0, NULL, 1, &k), GG_EINVAL, "rows is NULL but cap is 1");
  setenv("FAKE_NVML_FAIL_PROCS", "1", 1); /* fail closed: never "no processes" */
  gg_assert_fails(gg_gpu_processes(2, rows, 4, &k), GG_EDRIVER, "running-process query failed");
  unsetenv("FAKE_NVML_FAIL_PROCS");
  setenv("FAKE_NVML_TELEMETRY", "87,40,61,412500,700000", 1);
  gg_device_telemetry_t t;
  gg_assert_ok(gg_gpu_telemetry(2, &t));
  assert_true(t.index == 2 && t.utilization_gpu == 87 && t.power_watts == 412.5);
  unsetenv("FAKE_NVML_TELEMETRY");
  unsetenv("FAKE_NVML_PROCS_2");
  unsetenv("FAKE_NVML_COUNT");
  if (gg__cuda_probe() != 0) { /* neither NVML nor CUDA: no GPU at all */
    setenv("FAKE_NVML_FAIL_INIT", "1", 1);
    gg_assert_fails(gg_gpu_count(&n), GG_ENODEV, "no GPU here");
    gg_assert_fails(gg_gpu_find("0", &gpu), GG_ENODEV, "no GPU here");
  }
}

/* Utilisation, temperature and power come through as NVML gives them; a reading NVML does not offer
 * stays -1, and without NVML every reading is -1 with GG_ENOTSUP. */
static void test_telemetry(void **state) {
  (void)state;
  gg_device_telemetry_t t;
  setenv("FAKE_NVML_TELEMETRY", "87,40,61,412500,700000", 1);
  gg_assert_ok(gg_device_telemetry(0, &t));
  assert_int_equal(t.index, 0);
  assert_int_equal(t.utilization_gpu, 87);
  assert_int_equal(t.utilization_memory, 40);
  assert_int_equal(t.temperature_c, 61);
  assert_true(t.power_watts > 412.49 && t.power_watts < 412.51);
  assert_true(t.power_limit_watts > 699.99 && t.power_limit_watts < 700.01);
  setenv("FAKE_NVML_TELEMETRY", "5,6,,,", 1); /* no temperature or power sensor */
  gg_assert_ok(gg_device_telemetry(0, &t));
  assert_int_equal(t.utilization_gpu, 5);
  assert_int_equal(t.temperature_c, -1);
  assert_true(t.power_watts < 0 && t.power_limit_watts < 0);
  unsetenv("FAKE_NVML_TELEMETRY");
  gg_assert_fails(gg_device_telemetry(0, NULL), GG_EINVAL, "t is NULL");
  gg_assert_fails(gg_device_telemetry(-1, &t), GG_ENODEV, "device -1");
  if (gg__cuda_probe() != 0)
    gg_assert_fails(gg_device_telemetry(3, &t), GG_ENODEV, "NVML has no such device");
  setenv("FAKE_NVML_FAIL_INIT", "1", 1);
  gg_assert_fails(gg_device_telemetry(0, &t), GG_ENOTSUP, "nvmlInit failed");
  assert_int_equal(t.utilization_gpu, -1);
  assert_int_equal(t.temperature_c, -1);
}

static void test_foreign_process(void **state) {
  (void)state;
  if (getuid() != 0) {
    printf("note: not root, cannot start a process of another user\n");
    skip();
  }
  pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (setuid(65534) != 0) _exit(1);
    pause();
    _exit(0);
  }
  /* Wait until the child has changed its uid. */
  uid_t uid = 0;
  for (int i = 0; i < 500 && !(gg__proc_uid(child, &uid) == 0 && uid == 65534); i++) usleep(2000);
  char spec[64];
  snprintf(spec, sizeof spec, "%d:4096", (int)child);
  setenv("FAKE_NVML_PROCS", spec, 1);
  gg_process_t rows[64];
  size_t n;
  gg_assert_ok(gg_process_list(0, rows, 64, &n));
  const gg_process_t *row = find_row(rows, n < 64 ? n : 64, child);
  assert_int_equal(row->uid, 65534);
  assert_int_equal(row->cls, GG_PROCESS_FOREIGN);
  assert_string_equal(gg_process_class_name(row->cls), "foreign");
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
}

static void test_gone_process_keeps_driver_figures(void **state) {
  (void)state;
  /* A pid /proc does not show (another namespace, or just exited) still gets a row. */
  setenv("FAKE_NVML_PROCS", "2147483000:777", 1);
  gg_process_t rows[64];
  size_t n;
  gg_assert_ok(gg_process_list(0, rows, 64, &n));
  const gg_process_t *row = find_row(rows, n < 64 ? n : 64, 2147483000);
  assert_int_equal(row->used_bytes, 777);
  assert_int_equal(row->state, '?');
  assert_string_equal(row->user, "?");
}

static void test_fd_scan(void **state) {
  (void)state;
  char path[] = "/tmp/gg_fake_nvidiaXXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  int *pids = NULL;
  size_t n = 0;
  gg_assert_ok(gg__scan_fd_holders("/proc", path, &pids, &n));
  bool found = false;
  for (size_t i = 0; i < n; i++) found |= pids[i] == getpid();
  assert_true(found);
  free(pids);
  close(fd);
  gg_assert_ok(gg__scan_fd_holders("/proc", path, &pids, &n));
  for (size_t i = 0; i < n; i++) assert_int_not_equal(pids[i], getpid());
  free(pids);
  unlink(path);
  gg_assert_fails(gg__scan_fd_holders("/nonexistent-proc", path, &pids, &n), GG_EIO, "cannot open");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stride_probe),
      cmocka_unit_test_setup_teardown(test_list_stride_16, setup, teardown),
      cmocka_unit_test_setup_teardown(test_list_stride_24, setup, teardown),
      cmocka_unit_test_setup_teardown(test_list_stride_32, setup, teardown),
      cmocka_unit_test_setup_teardown(test_count_only_and_truncation, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_arguments, setup, teardown),
      cmocka_unit_test_setup_teardown(test_without_nvml, setup, teardown),
      cmocka_unit_test_setup_teardown(test_telemetry, setup, teardown),
      cmocka_unit_test_setup_teardown(test_gpus, setup, teardown),
      cmocka_unit_test_setup_teardown(test_foreign_process, setup, teardown),
      cmocka_unit_test_setup_teardown(test_gone_process_keeps_driver_figures, setup, teardown),
      cmocka_unit_test(test_fd_scan),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
