/* exporter.c — `gpuguard watch`'s Prometheus side: the textfile for node_exporter, written so
 * nothing planted at its temporary name is followed, and /metrics over plain HTTP: many clients at
 * once (one poll loop, no thread), each bounded in request size and time, so idle or slow clients
 * cannot delay a scrape. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli_internal.h"

#define REQUEST_MAX    8192 /* a scrape's request is a few hundred bytes */
#define READ_LIMIT_MS  2000 /* a client that has not sent its request by then is dropped */
#define WRITE_LIMIT_MS 5000 /* one that does not take its answer by then, too */
#define MAX_CLIENTS    64 /* connections served at once; a new one beyond evicts the oldest idle */
#define ACCEPT_BURST   8  /* connections taken per turn of the poll loop */

typedef struct client {
  int fd;          /* -1: a free slot */
  double since;    /* monotonic ms when accepted: the oldest idle one is evicted first */
  double deadline; /* monotonic ms: reading, then writing, must be done by then */
  char *req;       /* REQUEST_MAX bytes while reading */
  size_t got;
  char *out; /* the whole answer while writing */
  size_t out_len, out_off;
  bool metrics; /* the answer is a /metrics scrape */
} client_t;

struct exporter {
  int lfd;
  unsigned what, top;
  int gpu;     /* -i: one GPU's series only; -1 every GPU */
  int pending; /* /metrics answers sent whole and not yet returned as 'c' */
  client_t c[MAX_CLIENTS];
};

/* The report, rendered into memory once per answer: what a scrape reads is one consistent
 * reading. */
static char *render(unsigned what, unsigned top, int gpu, size_t *len) {
  char *buf = NULL;
  FILE *f = open_memstream(&buf, len);
  if (!f) return NULL;
  int rc = gg_report_ex(f, GG_FORMAT_PROMETHEUS, what, gpu, top);
  if (fclose(f) != 0 || rc < 0) {
    fprintf(stderr, "gpuguard watch: the report failed: %s\n",
            rc < 0 ? gg_last_error() : strerror(errno));
    free(buf);
    return NULL;
  }
  return buf;
}

/* ---- textfile -------------------------------------------------------------------------------- */

/* Whether name is base followed by ".tmp." and mkostemp's six letters or digits. */
static bool is_our_temp(const char *name, const char *base, size_t blen) {
  if (strncmp(name, base, blen) != 0 || strncmp(name + blen, ".tmp.", 5) != 0) return false;
  const char *x = name + blen + 5;
  size_t n = 0;
  while (n < 7 && ((x[n] >= 'a' && x[n] <= 'z') || (x[n] >= 'A' && x[n] <= 'Z') ||
                   (x[n] >= '0' && x[n] <= '9')))
    n++;
  return n == 6 && x[6] == '\0';
}

/* A write cut short by SIGKILL (the exporter stopped, an OOM kill) leaves its PATH.tmp.XXXXXX
 * behind, one per kill, forever. Ours (same user), regular and untouched for STALE_S are removed:
 * a write under way, ours or a second exporter's, is younger than that. Returns whether one of our
 * names was kept for being too young: a kill just before this exporter started, judged later. */
#define STALE_S 60
static bool sweep_stale_temps(const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[4096];
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
  const char *base = slash ? slash + 1 : path;
  size_t blen = strlen(base);
  DIR *d = opendir(dir);
  if (!d) return false;
  time_t now = time(NULL);
  bool young = false;
  for (struct dirent *e; (e = readdir(d));) {
    struct stat st;
    if (!is_our_temp(e->d_name, base, blen) ||
        fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
      continue;
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) continue;
    if (now - st.st_mtime > STALE_S)
      unlinkat(dirfd(d), e->d_name, 0);
    else
      young = true;
  }
  closedir(d);
  return young;
}

/* Stale names appear only when an exporter is killed, so the directory is read at the first write
 * and then rarely, not at every write (a textfile directory holds node_exporter's other files, and
 * writes come every interval): again just after a kept name turns stale, else every
 * SWEEP_EVERY_S, which catches a second exporter on the same path killed while this one runs. */
#define SWEEP_EVERY_S 600
static void sweep_when_due(prom_file_t *pf) {
  double now = gg__now_ms();
  if (pf->swept && now < pf->next_sweep_ms) return;
  bool young = sweep_stale_temps(pf->path);
  pf->swept = true;
  pf->next_sweep_ms = now + (young ? STALE_S + 1 : SWEEP_EVERY_S) * 1e3;
}

int exporter_write_file(prom_file_t *pf, unsigned what, unsigned top, int gpu) {
  const char *path = pf->path;
  /* Before the write: freeing what a killed exporter left can only help a write short of space. */
  sweep_when_due(pf);
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp) {
    fprintf(stderr, "gpuguard watch: --prom-file path too long\n");
    return 1;
  }
  /* mkostemp: a fresh random name, O_CREAT|O_EXCL, so a symlink (or anything) planted there is
   * never written through; the name ends in the random part, which a textfile collector (*.prom)
   * skips. */
  /* The text first: the temporary file then lives for a write and a rename, not for the report
   * too, and a kill leaves one behind more rarely. */
  size_t len = 0;
  char *text = render(what, top, gpu, &len);
  int fd = text ? mkostemp(tmp, O_CLOEXEC) : -1;
  if (text && fd < 0) {
    fprintf(stderr, "gpuguard watch: cannot write %s: %s\n", tmp, strerror(errno));
    free(text);
    return 1;
  }
  if (!text) return 1;             /* render said why */
  bool ok = fchmod(fd, 0644) == 0; /* node_exporter runs as another user */
  for (size_t off = 0; ok && off < len;) {
    ssize_t w = write(fd, text + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    ok = w > 0;
    off += w > 0 ? (size_t)w : 0;
  }
  int err = ok ? 0 : errno;
  free(text);
  if (close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && rename(tmp, path) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    fprintf(stderr, "gpuguard watch: writing %s failed%s%s\n", path, err ? ": " : "",
            err ? strerror(err) : "");
    unlink(tmp);
    return 1;
  }
  return 0;
}

/* ---- where to listen ------------------------------------------------------------------------- */

/* "PORT", ":PORT", "ADDR:PORT", "[V6]:PORT", "ADDR", "[V6]" or a bare IPv6 address: host (empty:
 * the loopback address) and port (EXPORTER_DEFAULT_PORT when left out). A port must be a number
 * from 0 to 65535: getaddrinfo would take 74937 as 74937 % 65536. 0 on success, else 1 after a
 * message. */
int exporter_parse_listen(const char *spec, char *host, size_t hcap, unsigned *port) {
  const char *h = spec, *p = NULL;
  size_t hl;
  if (spec[0] == '[') {
    const char *close = strchr(spec, ']');
    if (!close || (close[1] && close[1] != ':')) {
      fprintf(stderr,
              "gpuguard watch: --listen '%s': an IPv6 address goes in brackets: [::1]:PORT\n",
              spec);
      return 1;
    }
    h = spec + 1;
    hl = (size_t)(close - h);
    p = close[1] ? close + 2 : NULL;
  } else if (strspn(spec, "0123456789") == strlen(spec)) {
    hl = 0;
    p = spec;
  } else {
    const char *colon = strchr(spec, ':');
    if (colon && strchr(colon + 1, ':')) /* two colons: a bare IPv6 address, no port */
      hl = strlen(spec);
    else {
      hl = colon ? (size_t)(colon - spec) : strlen(spec);
      p = colon ? colon + 1 : NULL;
    }
  }
  if (hl >= hcap) {
    fprintf(stderr, "gpuguard watch: --listen '%s': the address is too long\n", spec);
    return 1;
  }
  memcpy(host, h, hl);
  host[hl] = '\0';
  *port = EXPORTER_DEFAULT_PORT;
  if (p && *p) {
    size_t digits = strspn(p, "0123456789");
    unsigned long v = digits && digits == strlen(p) && digits <= 5 ? strtoul(p, NULL, 10) : 70000;
    if (v > 65535) {
      fprintf(stderr,
              "gpuguard watch: --listen '%s': the port '%s' is not a number from 0 to 65535\n",
              spec, p);
      return 1;
    }
    *port = (unsigned)v;
  }
  return 0;
}

static bool is_loopback(const struct sockaddr_storage *ss) {
  if (ss->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
  if (ss->ss_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return false;
}

static int listen_on(const char *spec) {
  char host[256], port[8];
  unsigned pnum;
  if (exporter_parse_listen(spec, host, sizeof host, &pnum) != 0) return -1;
  snprintf(port, sizeof port, "%u", pnum);
  struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM},
                  *ai = NULL;
  /* No address given: the loopback interface only; every interface is asked for by name. */
  int rc = getaddrinfo(*host ? host : "127.0.0.1", port, &hints, &ai);
  if (rc != 0) {
    fprintf(stderr, "gpuguard watch: --listen '%s': the address '%s': %s\n", spec, host,
            gai_strerror(rc));
    return -1;
  }
  int fd = -1, err = 0;
  for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* a restart binds at once */
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      err = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  if (fd < 0) {
    fprintf(stderr, "gpuguard watch: --listen '%s': %s\n", spec, strerror(err));
    return -1;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char shown[NI_MAXHOST], sport[NI_MAXSERV];
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
      getnameinfo((struct sockaddr *)&ss, sl, shown, sizeof shown, sport, sizeof sport,
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    bool v6 = ss.ss_family == AF_INET6;
    fprintf(stderr, "gpuguard watch: serving http://%s%s%s:%s/metrics\n", v6 ? "[" : "", shown,
            v6 ? "]" : "", sport);
    if (!is_loopback(&ss))
      fprintf(
          stderr,
          "gpuguard watch: warning: %s is not a loopback address: other machines can read /metrics "
          "(users and GPU memory of the processes on this machine's GPUs)\n",
          shown);
  }
  return fd;
}

exporter_t *exporter_open(const char *spec, unsigned what, unsigned top, int gpu) {
  exporter_t *ex = calloc(1, sizeof *ex);
  if (!ex) {
    fprintf(stderr, "gpuguard watch: out of memory\n");
    return NULL;
  }
  for (int i = 0; i < MAX_CLIENTS; i++) ex->c[i].fd = -1;
  ex->what = what;
  ex->top = top;
  ex->gpu = gpu;
  ex->lfd = listen_on(spec);
  if (ex->lfd < 0) {
    free(ex);
    return NULL;
  }
  return ex;
}

static void drop(client_t *c) {
  if (c->fd >= 0) {
    shutdown(c->fd, SHUT_WR);
    close(c->fd);
  }
  free(c->req);
  free(c->out);
  *c = (client_t){.fd = -1};
}

void exporter_close(exporter_t *ex) {
  if (!ex) return;
  for (int i = 0; i < MAX_CLIENTS; i++) drop(&ex->c[i]);
  close(ex->lfd);
  free(ex);
}

/* ---- HTTP ------------------------------------------------------------------------------------ */

/* The answer, whole, in c->out; then the client is only written to. */
static void respond(client_t *c, const char *status, const char *type, const char *extra,
                    const char *body, size_t len, bool head_only) {
  char head[512];
  int n = snprintf(
      head, sizeof head,
      "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n",
      status, type, len, extra);
  size_t blen = head_only ? 0 : len;
  free(c->req);
  c->req = NULL;
  c->out = malloc((size_t)n + blen);
  if (!c->out) {
    c->deadline = 0; /* dropped at the next look */
    return;
  }
  memcpy(c->out, head, (size_t)n);
  if (blen) memcpy(c->out + n, body, blen);
  c->out_len = (size_t)n + blen;
  c->out_off = 0;
  c->deadline = gg__now_ms() + WRITE_LIMIT_MS;
}

static const char index_page[] =
    "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>gpuguard exporter</title></head>\n"
    "<body><h1>gpuguard exporter</h1>\n"
    "<p>GPU memory, the processes holding it and gpuguard arenas, labelled as NVIDIA's DCGM "
    "exporter "
    "labels GPUs.</p>\n<p><a href=\"/metrics\">Metrics</a></p>\n</body></html>\n";

/* A whole request head is in c->req: answer it. */
static void answer(exporter_t *ex, client_t *c) {
  char method[16] = "", target[1024] = "";
  if (sscanf(c->req, "%15s %1023s", method, target) != 2) {
    static const char msg[] = "bad request\n";
    respond(c, "400 Bad Request", "text/plain", "", msg, sizeof msg - 1, false);
    return;
  }
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    static const char msg[] = "only GET and HEAD\n";
    respond(c, "405 Method Not Allowed", "text/plain", "Allow: GET, HEAD\r\n", msg, sizeof msg - 1,
            false);
    return;
  }
  bool head = strcmp(method, "HEAD") == 0;
  target[strcspn(target, "?#")] = '\0';
  if (strcmp(target, "/") == 0) {
    respond(c, "200 OK", "text/html; charset=utf-8", "", index_page, sizeof index_page - 1, head);
  } else if (strcmp(target, "/metrics") == 0) {
    size_t len = 0;
    char *body = render(ex->what, ex->top, ex->gpu, &len);
    if (body) {
      respond(c, "200 OK", "text/plain; version=0.0.4; charset=utf-8", "", body, len, head);
      c->metrics = true;
    } else
      respond(c, "500 Internal Server Error", "text/plain", "", "report failed\n", 14, head);
    free(body);
  } else {
    static const char msg[] = "not found: gpuguard serves /metrics (and / links to it)\n";
    respond(c, "404 Not Found", "text/plain", "", msg, sizeof msg - 1, head);
  }
}

/* Reads or writes what the client is ready for. Returns 1 when a /metrics answer was sent whole. */
static int step(exporter_t *ex, client_t *c) {
  if (c->req) {
    ssize_t r = recv(c->fd, c->req + c->got, REQUEST_MAX - 1 - c->got, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (r <= 0) {
      drop(c);
      return 0;
    }
    c->got += (size_t)r;
    c->req[c->got] = '\0';
    if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) {
      answer(ex, c);
    } else if (c->got >= REQUEST_MAX - 1) {
      static const char msg[] = "request too large\n";
      respond(c, "431 Request Header Fields Too Large", "text/plain", "", msg, sizeof msg - 1,
              false);
    }
    if (!c->out) return 0;
  }
  while (c->out_off < c->out_len) {
    ssize_t w =
        send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (w <= 0) {
      drop(c);
      return 0;
    }
    c->out_off += (size_t)w;
  }
  int done = c->metrics;
  drop(c);
  return done;
}

/* A slot for a new connection: a free one, else the one that has waited longest without sending
 * its whole request (an idle or slow client), else the oldest of all. Refusing the newcomer instead
 * let a crowd of idle connections, renewed as each timed out, keep every scrape out (0 of 10). A
 * scraper sends its request at once, so it is never the oldest idle one for long. */
static client_t *free_slot(exporter_t *ex) {
  client_t *idle = NULL, *oldest = NULL;
  for (int i = 0; i < MAX_CLIENTS; i++) {
    client_t *c = &ex->c[i];
    if (c->fd < 0) return c;
    if (c->req && (!idle || c->since < idle->since)) idle = c;
    if (!oldest || c->since < oldest->since) oldest = c;
  }
  client_t *victim = idle ? idle : oldest;
  drop(victim);
  return victim;
}

/* Takes waiting connections into slots, and reads at once what each has sent: a scraper's request
 * is usually there already, which makes it busy, not idle. At most ACCEPT_BURST a call, so that the
 * poll loop reads the clients in between: under a flood whose every evicted connection comes back
 * at once, a scraper whose request was a moment late would otherwise be evicted within one call.
 * Returns how many /metrics answers were sent whole. */
static int accept_all(exporter_t *ex) {
  int answered = 0;
  for (int burst = 0; burst < ACCEPT_BURST; burst++) {
    int fd = accept4(ex->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return answered;
    char *req = malloc(REQUEST_MAX);
    if (!req) {
      close(fd);
      continue;
    }
    client_t *slot = free_slot(ex);
    double now = gg__now_ms();
    *slot = (client_t){.fd = fd, .since = now, .deadline = now + READ_LIMIT_MS, .req = req};
    answered += step(ex, slot);
  }
  return answered;
}

int exporter_serve(exporter_t *ex, double deadline_ms, int wake_fd) {
  struct pollfd p[MAX_CLIENTS + 2];
  int idx[MAX_CLIENTS + 2];
  for (;;) {
    /* One 'c' per answer: two clients answered in one round are two scrapes (--count). */
    if (ex->pending > 0) {
      ex->pending--;
      return 'c';
    }
    double now = gg__now_ms(), until = deadline_ms;
    int n = 0;
    p[n++] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
    p[n++] = (struct pollfd){.fd = ex->lfd, .events = POLLIN};
    for (int i = 0; i < MAX_CLIENTS; i++) {
      client_t *c = &ex->c[i];
      if (c->fd < 0) continue;
      if (c->deadline <= now) { /* too slow: its limit is up */
        drop(c);
        continue;
      }
      if (c->deadline < until) until = c->deadline;
      idx[n] = i;
      p[n++] = (struct pollfd){.fd = c->fd, .events = c->req ? POLLIN : POLLOUT};
    }
    if (now >= deadline_ms) return 0;
    int r = poll(p, (nfds_t)n, (int)(until - now) + 1);
    if (r < 0 && errno != EINTR) return 0;
    if (r <= 0) continue;
    if (p[0].revents & POLLIN) {
      unsigned char b;
      if (read(wake_fd, &b, 1) == 1) return b;
    }
    int answered = 0;
    for (int k = 2; k < n; k++)
      if (p[k].revents) answered += step(ex, &ex->c[idx[k]]);
    if (p[1].revents & POLLIN) answered += accept_all(ex);
    ex->pending += answered;
  }
}
