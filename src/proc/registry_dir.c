/* registry_dir.c — where the session registry lives: GPUGUARD_REGISTRY_DIR (a relative one fixed at
 * first use), $XDG_RUNTIME_DIR/gpuguard, /dev/shm/gpuguard-UID, and a private fallback when another
 * user has taken the last; opened only when private (ours, 0700, not a symlink). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <pwd.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "gpuguard/proc.h"
#include "proc/registry_dir_internal.h"

static pthread_mutex_t gg__reg_rel_lock = PTHREAD_MUTEX_INITIALIZER; /* gg__reg_absolute's */
/* A relative GPUGUARD_REGISTRY_DIR is resolved against the working directory of its first use,
 * once: after a chdir the same value must still name the directory the record was written to (else
 * the record stays behind, and reap takes the session's live helpers for a dead leader's orphans).
 */
static char gg__reg_rel[PATH_MAX];
static char gg__reg_abs[PATH_MAX];

static int gg__reg_absolute(const char *env, size_t len, char *buf, size_t cap) {
  pthread_mutex_lock(&gg__reg_rel_lock);
  bool known = strlen(gg__reg_rel) == len && strncmp(gg__reg_rel, env, len) == 0;
  if (!known) {
    char cwd[PATH_MAX];
    int n = -1;
    if (getcwd(cwd, sizeof cwd) && len < sizeof gg__reg_rel)
      n = snprintf(gg__reg_abs, sizeof gg__reg_abs, "%s/%.*s", strcmp(cwd, "/") ? cwd : "",
                   (int)len, env);
    known = n > 0 && (size_t)n < sizeof gg__reg_abs;
    if (known) {
      memcpy(gg__reg_rel, env, len);
      gg__reg_rel[len] = '\0';
    }
  }
  int n = known ? snprintf(buf, cap, "%s", gg__reg_abs) : -1;
  pthread_mutex_unlock(&gg__reg_rel_lock);
  return n;
}

/* Where the directory is; mkdir'ed when missing. *shared: it is the default one in a world-writable
 * root (/dev/shm, /tmp), where another user can create it first. */
static int gg__reg_path_of(char *buf, size_t cap, bool *shared) {
  const char *env = gg__env("GPUGUARD_REGISTRY_DIR");
  const char *xdg = gg__env("XDG_RUNTIME_DIR");
  struct stat st;
  int n;
  *shared = false;
  if (env) {
    /* "dir/" would make open(O_NOFOLLOW) follow a symlink at dir: the slash names what it points
     * to. */
    size_t len = strlen(env);
    while (len > 1 && env[len - 1] == '/') len--;
    if (env[0] == '/')
      n = snprintf(buf, cap, "%.*s", (int)len, env);
    else
      n = gg__reg_absolute(env, len, buf, cap);
  } else if (xdg)
    n = snprintf(buf, cap, "%s/gpuguard", xdg);
  else if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)) {
    n = snprintf(buf, cap, "/dev/shm/gpuguard-%u", (unsigned)geteuid());
    *shared = true;
  } else {
    n = snprintf(buf, cap, "/tmp/gpuguard-%u", (unsigned)geteuid());
    *shared = true;
  }
  if (n < 0 || (size_t)n >= cap)
    return gg__err(GG_EINVAL, "gg_registry_dir: path does not fit in %zu bytes", cap);
  return 0;
}

/* Opens the directory at path, refusing anything another user could have planted or can write
 * into. */
static int gg__reg_open_at(const char *path, int *dfd) {
  if (mkdir(path, 0700) != 0 && errno != EEXIST)
    return gg__err(GG_EIO, "gg_registry_dir: cannot create '%s': %s", path, strerror(errno));
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (fd < 0) {
    int e = errno;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
      return gg__err(
          GG_EPERM, "gg_registry_dir: '%s' is a symlink; refusing it (someone may have planted it)",
          path);
    if (e == ENOTDIR) return gg__err(GG_EPERM, "gg_registry_dir: '%s' is not a directory", path);
    return gg__err(GG_EIO, "gg_registry_dir: cannot open '%s': %s", path, strerror(e));
  }
  if (fstat(fd, &st) != 0) {
    close(fd);
    return gg__err(GG_EIO, "gg_registry_dir: cannot stat '%s': %s", path, strerror(errno));
  }
  if (st.st_uid != geteuid()) {
    close(fd);
    return gg__err(GG_EPERM,
                   "gg_registry_dir: '%s' is owned by uid %u, not by us (%u); refusing it", path,
                   (unsigned)st.st_uid, (unsigned)geteuid());
  }
  if (st.st_mode & 077) {
    close(fd);
    return gg__err(
        GG_EPERM,
        "gg_registry_dir: '%s' has mode %04o: group or others can reach it; it must be 0700", path,
        (unsigned)(st.st_mode & 07777));
  }
  *dfd = fd;
  return 0;
}

/* Whether dir is a directory of ours that no one else can write into (a parent for ours). */
static bool gg__reg_private_parent(const char *dir) {
  struct stat st;
  return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() &&
         !(st.st_mode & 022);
}

/* A private directory outside the world-writable roots, the same for every process of the user:
 * /run/user/UID/gpuguard (logind's), as root /run/gpuguard-0, else the home directory's
 * .gpuguard-registry.HOST (the host in the name: a home shared over NFS holds other hosts' pids).
 */
static int gg__reg_fallback(char *buf, size_t cap) {
  unsigned uid = (unsigned)geteuid();
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "/run/user/%u", uid);
  if (gg__reg_private_parent(dir)) return snprintf(buf, cap, "%s/gpuguard", dir);
  if (uid == 0 && gg__reg_private_parent("/run")) return snprintf(buf, cap, "/run/gpuguard-0");
  struct passwd pw;
  struct passwd *found = NULL;
  char pwbuf[4096], host[256] = "localhost";
  if (getpwuid_r((uid_t)uid, &pw, pwbuf, sizeof pwbuf, &found) != 0 || !found ||
      !gg__reg_private_parent(pw.pw_dir))
    return -1;
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  return snprintf(buf, cap, "%s/.gpuguard-registry.%s", pw.pw_dir, host);
}

/* Opens the directory. The default one in /dev/shm or /tmp may have been created first by another
 * user (refused: a planted directory would let that user read and forge records); then the
 * private fallback is used, said once on stderr. */
int gg__reg_open(char *path, size_t cap, int *dfd) {
  bool shared = false;
  int rc = gg__reg_path_of(path, cap, &shared);
  if (rc != 0) return rc;
  rc = gg__reg_open_at(path, dfd);
  if (rc != GG_EPERM || !shared) return rc;
  char why[512], alt[PATH_MAX];
  gg__strlcpy(why, gg_last_error(), sizeof why);
  int n = gg__reg_fallback(alt, sizeof alt);
  if (n <= 0 || (size_t)n >= sizeof alt || (size_t)n >= cap)
    return gg__err(GG_EPERM,
                   "%s; and no private directory to fall back on (/run/user/%u, a home "
                   "directory of ours that others cannot write)",
                   why, (unsigned)geteuid());
  rc = gg__reg_open_at(alt, dfd);
  if (rc != 0) return gg__err(rc, "%s; the fallback: %s", why, gg_last_error());
  static atomic_bool said;
  if (!atomic_exchange(&said, true))
    fprintf(stderr, "gpuguard: registry: %s; using %s instead\n", why, alt);
  gg__strlcpy(path, alt, cap);
  return 0;
}

/* fork() while another thread resolves a relative directory must not leave its lock held in the
 * child (registry.c's fork handlers call this). */
void gg__registry_dir_lock(bool lock) {
  if (lock)
    pthread_mutex_lock(&gg__reg_rel_lock);
  else
    pthread_mutex_unlock(&gg__reg_rel_lock);
}

int gg_registry_dir(char *buf, size_t cap) {
  if (!buf || cap == 0) return gg__err(GG_EINVAL, "gg_registry_dir: NULL or empty buffer");
  char path[PATH_MAX];
  int dfd, rc = gg__reg_open(path, sizeof path, &dfd);
  if (rc != 0) return rc;
  close(dfd);
  if (strlen(path) >= cap)
    return gg__err(GG_EINVAL, "gg_registry_dir: '%s' does not fit in %zu bytes", path, cap);
  gg__strlcpy(buf, path, cap);
  return 0;
}
