/* test_classify.c — how gg_process_list classifies the processes holding a device, from the session
 * registry and /proc: guarded (live session), orphan (dead leader), stranded (a worker no session
 * knows whose parent is gone), detached (left running on purpose), unknown (no evidence). NVML is a
 * stand-in that lists whichever pids the test names. */
#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "core/internal.h"
#include "proc/procfs_internal.h"

static char regdir[64];

static int setup(void **state) {
  (void)state;
  snprintf(regdir, sizeof regdir, "/tmp/gg_classify_%d", (int)getpid());
  mkdir(regdir, 0700);
  setenv("GPUGUARD_REGISTRY_DIR", regdir, 1);
  setenv("GPUGUARD_NVML_LIBRARY", GG_FAKE_NVML, 1);
  setenv("GPUGUARD_TEST_PIDNS", "initial", 1); /* the stand-in NVML lists pids of our /proc */
  unsetenv("FAKE_NVML_LOG");
  unsetenv("GPUGUARD_SESSION");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", regdir);
  return system(cmd) == 0 ? 0 : -1;
}

/* Lists the pids given and returns the row of `pid`. */
static gg_process_t row_of(pid_t pid, const pid_t *pids, int n) {
  char spec[256] = "";
  for (int i = 0; i < n; i++)
    snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%s%d:1048576", i ? "," : "",
             (int)pids[i]);
  setenv("FAKE_NVML_PROCS", spec, 1);
  gg_process_t rows[8];
  size_t count = 0;
  gg_assert_ok(gg_process_list(0, rows, 8, &count));
  for (size_t i = 0; i < count; i++)
    if (rows[i].pid == pid) return rows[i];
  fail_msg("pid %d not listed", (int)pid);
  return rows[0];
}

/* Returns once the child has exec'd: before that its /proc environment is still this process's
 * initial one (a session set with setenv() since is not in it), and classifying it then was a race
 * the guarded-session test lost about once in 17 runs. */
static pid_t start_sleeper(void) {
  pid_t p = fork();
  if (p == 0) {
    execlp("sleep", "sleep", "30", (char *)NULL);
    _exit(127);
  }
  char path[64], comm[32];
  snprintf(path, sizeof path, "/proc/%d/comm", (int)p);
  for (int i = 0; i < 2500; i++) {
    FILE *f = fopen(path, "r");
    bool slept = f && fgets(comm, sizeof comm, f) && strcmp(comm, "sleep\n") == 0;
    if (f) fclose(f);
    if (slept) return p;
    usleep(2000);
  }
  fail_msg("child %d did not exec sleep", (int)p);
  return p;
}

/* A sleeper started by gg_proc_spawn, which gives it this process's session in its own environment
 * (the process environment is never written). No death signal: it must outlive a dying leader. */
static pid_t spawn_sleeper(void) {
  gg_spawn_options_t o;
  gg_spawn_options_init(&o);
  o.death_signal = 0;
  const char *argv[] = {"sleep", "30", NULL};
  pid_t p = -1;
  gg_assert_ok(gg_proc_spawn(NULL, argv, &o, &p)); /* returns once it has exec'd */
  return p;
}

/* Waits until pid's parent is no longer `was` (it was reparented), up to 5 s. */
static void wait_reparented(pid_t pid, pid_t was) {
  gg__pinfo_t info;
  for (int i = 0; i < 2500; i++) {
    if (gg__proc_read_stat(pid, &info) == 0 && info.ppid != was) return;
    usleep(2000);
  }
  fail_msg("process %d was not reparented", (int)pid);
}

static void stop(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

static void test_unknown_without_evidence(void **state) {
  (void)state;
  pid_t s = start_sleeper();
  gg_process_t r = row_of(s, &s, 1);
  assert_int_equal(r.cls, GG_PROCESS_UNKNOWN);
  assert_string_equal(r.session, "");
  stop(s);
}

static void test_guarded_session(void **state) {
  (void)state;
  gg_assert_ok(gg_registry_register("0")); /* this process leads a new session... */
  char session[40];
  gg_assert_ok(gg_registry_session(session, sizeof session));
  pid_t s = spawn_sleeper(); /* ...which its spawned child gets in its environment */
  pid_t both[2] = {getpid(), s};
  gg_process_t me = row_of(getpid(), both, 2), child = row_of(s, both, 2);
  assert_int_equal(me.cls, GG_PROCESS_GUARDED);
  assert_string_equal(me.session, session);
  assert_int_equal(child.cls, GG_PROCESS_GUARDED);
  assert_string_equal(child.session, session);
  stop(s);
  gg_assert_ok(gg_registry_unregister());
  unsetenv("GPUGUARD_SESSION");
}

static void test_orphan_of_a_dead_leader(void **state) {
  (void)state;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t leader = fork();
  if (leader == 0) {
    /* A leader that starts a worker and dies without unregistering (as after SIGKILL). */
    if (gg_registry_register("0") != 0) _exit(1);
    pid_t w = spawn_sleeper();
    if (write(fds[1], &w, sizeof w) != sizeof w) _exit(1);
    _exit(0);
  }
  pid_t worker = 0;
  assert_int_equal(read(fds[0], &worker, sizeof worker), sizeof worker);
  waitpid(leader, NULL, 0);
  close(fds[0]), close(fds[1]);
  wait_reparented(worker, leader);
  gg_process_t r = row_of(worker, &worker, 1);
  assert_int_equal(r.cls, GG_PROCESS_ORPHAN);
  assert_true(strlen(r.session) == 32);
  kill(worker, SIGKILL);
}

/* Waits until pid has exec'd into a program whose thread name starts with comm. */
static void wait_comm(pid_t pid, const char *comm) {
  char path[64], got[64] = "";
  snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
  for (int i = 0; i < 5000 && strncmp(got, comm, strlen(comm)) != 0; i++) {
    FILE *f = fopen(path, "r");
    if (!f || !fgets(got, sizeof got, f)) got[0] = '\0';
    if (f) fclose(f);
    if (strncmp(got, comm, strlen(comm)) != 0) usleep(2000);
  }
  if (strncmp(got, comm, strlen(comm)) != 0) fail_msg("pid %d never ran %s", (int)pid, comm);
}

/* Starts argv (with env, NULL: ours) as the grandchild of a middle process that makes a new session
 * and exits: the grandchild is handed to this process, a subreaper of another session, as a worker
 * of a dead job is handed to systemd --user or a launcher's subreaper. Returns its pid once it has
 * exec'd into `comm` (its thread name). */
static const char *exec_path; /* the program to run, when not argv[0] (a forged command line) */

static pid_t start_stranded(const char *const *argv, const char *const *env, const char *comm) {
  assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t mid = fork();
  if (mid == 0) {
    setsid();
    pid_t w = fork();
    if (w == 0) {
      if (exec_path) execv(exec_path, (char *const *)argv);
      if (env)
        execvpe(argv[0], (char *const *)argv, (char *const *)env);
      else
        execvp(argv[0], (char *const *)argv);
      _exit(127);
    }
    _exit(write(fds[1], &w, sizeof w) == sizeof w ? 0 : 1);
  }
  pid_t w = 0;
  assert_int_equal(read(fds[0], &w, sizeof w), sizeof w);
  waitpid(mid, NULL, 0);
  close(fds[0]), close(fds[1]);
  wait_comm(w, comm);
  return w;
}

/* The two processes handed to us (the subreaper) whose command line has `marker`. */
static void two_left_to_us(const char *marker, pid_t kids[2]) {
  int nk = 0;
  DIR *d = opendir("/proc");
  for (struct dirent *e; d && (e = readdir(d)) && nk < 2;) {
    gg__pinfo_t info;
    pid_t p = (pid_t)atoi(e->d_name);
    char cmd[256];
    if (p <= 0 || gg__proc_read_stat(p, &info) != 0 || info.ppid != getpid()) continue;
    gg__proc_cmdline(p, cmd, sizeof cmd);
    if (strstr(cmd, marker)) kids[nk++] = p;
  }
  if (d) closedir(d);
  assert_int_equal(nk, 2);
}

/* The interpreter itself (python3 in PATH may be a pyenv shim, a shell script, for a while). */
static char python[512];
static bool have_python(void) {
  FILE *p = popen("python3 -c 'import sys; print(sys.executable)' 2>/dev/null", "r");
  bool ok = p && fgets(python, sizeof python, p) != NULL;
  if (p) pclose(p);
  python[strcspn(python, "\n")] = '\0';
  return ok && python[0] == '/';
}

static gg_process_t describe(pid_t pid) {
  gg_process_t r;
  gg_assert_ok(gg_process_describe(pid, &r));
  return r;
}

/* A process that rewrites its command line to look like a spawn worker: the program is not Python,
 * so the claim is not believed; its parent is gone, so it is a program left running (never reaped).
 */
static void test_forged_worker_is_not_stranded(void **state) {
  (void)state;
  /* The exact arguments of a spawn child, given to the shell (its `from` fails; it sleeps). */
  const char *argv[] = {
      python, "-c",
      "from multiprocessing.spawn import spawn_main 2>/dev/null; spawn_main 2>/dev/null; sleep 30",
      "--multiprocessing-fork", NULL};
  exec_path = "/bin/sh";
  pid_t w = start_stranded(argv, NULL, "sh");
  exec_path = NULL;
  gg_process_t r = row_of(w, &w, 1);
  assert_non_null(strstr(r.command, "multiprocessing.spawn"));
  assert_int_equal(r.cls, GG_PROCESS_DETACHED);
  assert_non_null(strstr(r.why, "not Python"));
  stop(w);
}

/* A real multiprocessing spawn child whose trainer was SIGKILLed: stranded, listed through the
 * driver's list; and the same kind of child whose trainer lives: not stranded. */
static void test_spawn_child_stranded(void **state) {
  (void)state;
  if (!have_python()) skip();
  char out[] = "/tmp/gg_classify_kid_XXXXXX";
  int fd = mkstemp(out);
  assert_true(fd >= 0);
  close(fd);
  char code[600];
  snprintf(code, sizeof code,
           "import multiprocessing as mp, time\n"
           "if __name__ == '__main__':\n"
           "    p = mp.get_context('spawn').Process(target=time.sleep, args=(30,)); p.start()\n"
           "    open('%s', 'w').write(str(p.pid)); time.sleep(30)\n",
           out);
  const char *argv[] = {python, "-c", code, NULL};
  pid_t trainer = start_stranded(argv, NULL, "python");
  pid_t kid = 0;
  for (int i = 0; i < 5000 && kid <= 0; i++) {
    FILE *f = fopen(out, "r");
    if (!f || fscanf(f, "%d", &kid) != 1) kid = 0;
    if (f) fclose(f);
    if (kid <= 0) usleep(2000);
  }
  assert_true(kid > 0);
  gg_process_t alive = describe(kid);
  assert_int_equal(alive.cls, GG_PROCESS_UNKNOWN); /* its trainer runs: nothing is stranded */
  kill(trainer, SIGKILL);
  waitpid(trainer, NULL, 0);
  wait_reparented(kid, trainer);
  gg_process_t r = row_of(kid, &kid, 1);
  assert_int_equal(r.cls, GG_PROCESS_STRANDED);
  assert_non_null(strstr(r.why, "spawn child"));
  assert_non_null(strstr(r.why, "subreaper"));
  assert_string_equal(gg_process_class_name(r.cls), "stranded");
  stop(kid);
  unlink(out);
}

/* DataLoader's thread name, a torchrun rank's environment, and fork siblings (a pool forked by a
 * parent that is gone) are each evidence of a worker. */
static void test_dataloader_rank_and_fork_siblings(void **state) {
  (void)state;
  if (!have_python()) skip();
  const char *dl[] = {
      python, "-c",
      "import ctypes, time; ctypes.CDLL(None).prctl(15, b'pt_data_worker'); time.sleep(30)", NULL};
  pid_t w = start_stranded(dl, NULL, "pt_data_worker");
  gg_process_t r = describe(w);
  assert_int_equal(r.cls, GG_PROCESS_STRANDED);
  assert_non_null(strstr(r.why, "DataLoader"));
  stop(w);

  const char *rank[] = {python, "-c", "import time; time.sleep(30)", NULL};
  const char *env[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "TORCHELASTIC_RUN_ID=none",
                       "LOCAL_RANK=3", NULL};
  char path[4096];
  snprintf(path, sizeof path, "PATH=%s", getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
  env[0] = path;
  w = start_stranded(rank, env, "python");
  r = describe(w);
  assert_int_equal(r.cls, GG_PROCESS_STRANDED);
  assert_non_null(strstr(r.why, "LOCAL_RANK=3"));
  stop(w);

  /* Without evidence a Python program whose parent is gone is taken for one left running. */
  w = start_stranded(rank, NULL, "python");
  r = describe(w);
  assert_int_equal(r.cls, GG_PROCESS_DETACHED);
  stop(w);

  const char *pool[] = {python, "-c",
                        "import os, time\n"
                        "for i in range(2):\n"
                        "    if os.fork() == 0:\n"
                        "        time.sleep(30); os._exit(0)\n"
                        "time.sleep(0.3)\n",
                        NULL};
  pid_t parent = start_stranded(pool, NULL, "python");
  waitpid(parent, NULL, 0); /* it exits, leaving its two forked children to us */
  pid_t kids[2];
  two_left_to_us("os.fork()", kids);
  r = describe(kids[0]);
  assert_int_equal(r.cls, GG_PROCESS_STRANDED);
  assert_non_null(strstr(r.why, "forked"));
  stop(kids[0]);
  stop(kids[1]);
}

/* nohup: ignoring SIGHUP says the program is meant to outlive its terminal. */
static void test_nohup_detached(void **state) {
  (void)state;
  pid_t p = fork();
  if (p == 0) {
    signal(SIGHUP, SIG_IGN);
    execlp("sleep", "sleep", "30", (char *)NULL);
    _exit(127);
  }
  char got[64] = "";
  for (int i = 0; i < 2500 && strcmp(got, "sleep\n") != 0; i++) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/comm", (int)p);
    FILE *f = fopen(path, "r");
    if (!f || !fgets(got, sizeof got, f)) got[0] = '\0';
    if (f) fclose(f);
    usleep(2000);
  }
  gg_process_t r = describe(p);
  assert_int_equal(r.cls, GG_PROCESS_DETACHED);
  assert_non_null(strstr(r.why, "nohup"));
  stop(p);
}

/* Reads a pid a child wrote into path, waiting up to 10 s. */
static pid_t read_pid(const char *path) {
  pid_t pid = 0;
  for (int i = 0; i < 5000 && pid <= 0; i++) {
    FILE *f = fopen(path, "r");
    if (!f || fscanf(f, "%d", &pid) != 1) pid = 0;
    if (f) fclose(f);
    if (pid <= 0) usleep(2000);
  }
  if (pid <= 0) fail_msg("no pid in %s", path);
  return pid;
}

/* A torchrun rank whose parent is not Python (a bash wrapper, `torchrun --no-python`) is the live
 * agent's while the agent lives: only a dead launcher strands it. The agent here is a Python
 * program named torchrun that starts the rank through sh, in a new session, as torchrun does. */
static void test_rank_under_wrapper_of_live_agent(void **state) {
  (void)state;
  if (!have_python()) skip();
  assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  char agent_py[96], out[96], code[1024];
  snprintf(agent_py, sizeof agent_py, "%s/torchrun", regdir);
  snprintf(out, sizeof out, "%s/rank.pid", regdir);
  snprintf(
      code, sizeof code,
      "import os, subprocess, sys, time\n"
      "env = dict(os.environ, TORCHELASTIC_RUN_ID='job1', LOCAL_RANK='0', WORLD_SIZE='1')\n"
      "rank = \"import os, time; open('%s', 'w').write(str(os.getpid())); time.sleep(30)\"\n"
      "subprocess.Popen(['sh', '-c', '\"$0\" -c \"$1\"; true', sys.executable, rank], env=env,\n"
      "                 start_new_session=True)\n"
      "time.sleep(30)\n",
      out);
  FILE *f = fopen(agent_py, "w");
  assert_non_null(f);
  fputs(code, f);
  fclose(f);
  pid_t agent = fork();
  if (agent == 0) {
    execl(python, python, agent_py, (char *)NULL);
    _exit(127);
  }
  pid_t rank = read_pid(out);
  wait_comm(rank, "python");
  gg_process_t r = describe(rank);
  if (r.cls != GG_PROCESS_UNKNOWN)
    fail_msg("a rank of a live agent is %s: %s", gg_process_class_name(r.cls), r.why);
  stop(agent); /* the agent dies: sh is handed to us (a subreaper, not Python), the rank stranded */
  gg__pinfo_t info;
  gg_assert_ok(gg__proc_read_stat(rank, &info));
  wait_reparented(info.ppid, agent);
  r = describe(rank);
  assert_int_equal(r.cls, GG_PROCESS_STRANDED);
  assert_non_null(strstr(r.why, "launcher is gone"));
  kill(rank, SIGKILL);
  kill(info.ppid, SIGKILL);
  waitpid(info.ppid, NULL, 0);
}

/* Explicit signs of a program left running on purpose win over what it inherited: a `nohup` server
 * whose environment has LOCAL_RANK and WORLD_SIZE, and two identical `nohup python` programs of one
 * group, each left by a shell that is gone, are detached (never reaped unless named), not stranded.
 * (A `setsid nohup` one is judged by its parent, PID 1 once its shell is gone, which a test cannot
 * arrange; nohup alone puts the evidence in the same order.) */
static void test_detach_beats_inherited_evidence(void **state) {
  (void)state;
  if (!have_python()) skip();
  char path[4096], cmd[1024];
  snprintf(path, sizeof path, "PATH=%s", getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
  const char *env[] = {path, "LOCAL_RANK=0", "WORLD_SIZE=2", NULL};
  snprintf(cmd, sizeof cmd, "exec nohup %s -c 'import time; time.sleep(30)' >/dev/null 2>&1",
           python);
  const char *server[] = {"sh", "-c", cmd, NULL};
  pid_t w = start_stranded(server, env, "python");
  gg_process_t r = describe(w);
  if (r.cls != GG_PROCESS_DETACHED)
    fail_msg("a nohup'd server with LOCAL_RANK is %s: %s", gg_process_class_name(r.cls), r.why);
  assert_non_null(strstr(r.why, "nohup"));
  stop(w);

  snprintf(cmd, sizeof cmd,
           "for i in 1 2; do nohup %s -c 'import time; time.sleep(30) # serve' >/dev/null 2>&1 & "
           "done; sleep 0.3",
           python);
  const char *twice[] = {"sh", "-c", cmd, NULL};
  pid_t sh = start_stranded(twice, NULL, "sh");
  waitpid(sh, NULL, 0); /* the shell exits, leaving both to us */
  pid_t kids[2];
  two_left_to_us("# serve", kids);
  wait_comm(kids[0], "python");
  wait_comm(kids[1], "python");
  r = describe(kids[0]);
  gg_process_class_t cls = r.cls;
  stop(kids[0]);
  stop(kids[1]);
  if (cls != GG_PROCESS_DETACHED)
    fail_msg("two nohup'd copies of one program are %s: %s", gg_process_class_name(cls), r.why);
}

static void test_describe_bad_input(void **state) {
  (void)state;
  gg_process_t r;
  assert_int_equal(gg_process_describe(0, &r), GG_EINVAL);
  assert_int_equal(gg_process_describe(-5, &r), GG_EINVAL);
  assert_int_equal(gg_process_describe(1, NULL), GG_EINVAL);
  assert_int_equal(gg_process_describe(0x7ffffff0, &r), GG_ENOTFOUND);
}

/* A pid reused between listing and signalling is never signalled: the process listed died and
 * another took its number (root: /proc/sys/kernel/ns_last_pid picks the pid of the next fork). */
static void test_reap_pid_reused(void **state) {
  (void)state;
  pid_t first = start_sleeper();
  gg__pinfo_t info;
  gg_assert_ok(gg__proc_read_stat(first, &info));
  unsigned long long listed = info.start;
  stop(first);
  usleep(30000); /* start times count clock ticks (10 ms): a process started in the same tick is the
                    same */
  pid_t again = -1;
  FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
  for (int attempt = 0; f && attempt < 20 && again != first; attempt++) {
    fprintf(f, "%d", (int)first - 1);
    fflush(f);
    again = fork();
    if (again == 0) {
      execlp("sleep", "sleep", "30", (char *)NULL);
      _exit(127);
    }
    if (again != first) stop(again);
  }
  if (f) fclose(f);
  if (again != first) { /* not root: the same check with a start time that is not the process's */
    again = start_sleeper();
    gg_assert_ok(gg__proc_read_stat(again, &info));
    listed = info.start + 1;
  }
  usleep(20000);
  int pid = again;
  gg_proc_outcome_t out;
  assert_int_equal(gg_reap(&pid, &listed, 1, 100, 0, &out), 0);
  if (out.end != GG_PROC_SKIPPED) fail_msg("pid %d (first %d): %s", pid, (int)first, out.found);
  assert_int_equal(out.sent, 0);
  assert_non_null(strstr(out.found, "another process"));
  assert_int_equal(waitpid(again, NULL, WNOHANG), 0); /* still running */
  /* The right start time: TERM, and KILL for one that ignores TERM. */
  pid_t stubborn = fork();
  if (stubborn == 0) {
    signal(SIGTERM, SIG_IGN);
    execlp("sleep", "sleep", "30", (char *)NULL);
    _exit(127);
  }
  usleep(50000);
  unsigned long long starts[2];
  int pids[2] = {again, stubborn};
  for (int i = 0; i < 2; i++) {
    gg_assert_ok(gg__proc_read_stat(pids[i], &info));
    starts[i] = info.start;
  }
  gg_proc_outcome_t outs[2];
  assert_int_equal(gg_reap(pids, starts, 2, 200, 0, outs), 0);
  assert_int_equal(outs[0].end, GG_PROC_ENDED);
  assert_int_equal(outs[0].sent, GG_PROC_SENT_TERM);
  assert_int_equal(outs[1].end, GG_PROC_ENDED);
  assert_int_equal(outs[1].sent, GG_PROC_SENT_TERM | GG_PROC_SENT_KILL);
  waitpid(again, NULL, 0);
  waitpid(stubborn, NULL, 0);
  /* Bad input: never a signal. */
  int self = getpid(), one = 1, zero = 0;
  unsigned long long any = 1;
  assert_int_equal(gg_reap(&self, &any, 1, 0, 0, &out), 0);
  assert_int_equal(out.end, GG_PROC_SKIPPED);
  assert_int_equal(gg_reap(&one, &any, 1, 0, 0, &out), 0);
  assert_int_equal(out.end, GG_PROC_SKIPPED);
  assert_int_equal(gg_reap(&zero, &any, 1, 0, 0, &out), 0);
  assert_int_equal(out.end, GG_PROC_SKIPPED);
  assert_int_equal(gg_reap(NULL, NULL, 1, 0, 0, NULL), GG_EINVAL);
  assert_int_equal(gg_reap(&self, &any, 1, -1, 0, &out), GG_EINVAL);
  assert_int_equal(gg_reap(&self, &any, 1, 0, 8, &out), GG_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_unknown_without_evidence, setup, teardown),
      cmocka_unit_test_setup_teardown(test_guarded_session, setup, teardown),
      cmocka_unit_test_setup_teardown(test_orphan_of_a_dead_leader, setup, teardown),
      cmocka_unit_test_setup_teardown(test_forged_worker_is_not_stranded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_spawn_child_stranded, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dataloader_rank_and_fork_siblings, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nohup_detached, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rank_under_wrapper_of_live_agent, setup, teardown),
      cmocka_unit_test_setup_teardown(test_detach_beats_inherited_evidence, setup, teardown),
      cmocka_unit_test_setup_teardown(test_describe_bad_input, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reap_pid_reused, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
