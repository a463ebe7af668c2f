/* exporter.c — `gpuguard watch`'s Prometheus side: the textfile for node_exporter, written so nothing
 * planted at its temporary name is followed, and /metrics over plain HTTP, one client at a time with
 * bounded request size and time. */
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

#include "cli.h"

#define REQUEST_MAX    8192 /* a scrape's request is a few hundred bytes */
#define READ_LIMIT_MS  2000 /* a client that has not sent its request by then is dropped */
#define WRITE_LIMIT_MS 5000

/* The report, rendered into memory once per answer: what a scrape reads is one consistent reading. */
static char *render(size_t *len) {
  char *buf = NULL;
  FILE *f = open_memstream(&buf, len);
  if (!f) return NULL;
  int rc = gg_report(f, GG_FORMAT_PROMETHEUS, GG_REPORT_ALL | GG_REPORT_NOT_SELF);
  if (fclose(f) != 0 || rc < 0) {
    fprintf(stderr, "gpuguard watch: the report failed: %s\n", rc < 0 ? gg_last_error() : strerror(errno));
    free(buf);
    return NULL;
  }
  return buf;
}

/* ---- textfile ----------------------------------------------------------------------------------------- */

int exporter_write_file(const char *path) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp)
    return fprintf(stderr, "gpuguard watch: --prom-file path too long\n"), 1;
  /* mkostemp: a fresh random name, O_CREAT|O_EXCL, so a symlink (or anything) planted there is never
   * written through; the name ends in the random part, which a textfile collector (*.prom) skips. */
  int fd = mkostemp(tmp, O_CLOEXEC);
  if (fd < 0) return fprintf(stderr, "gpuguard watch: cannot write %s: %s\n", tmp, strerror(errno)), 1;
  size_t len = 0;
  char *text = render(&len);
  bool ok = text != NULL && fchmod(fd, 0644) == 0; /* node_exporter runs as another user */
  for (size_t off = 0; ok && off < len;) {
    ssize_t w = write(fd, text + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    ok = w > 0, off += w > 0 ? (size_t)w : 0;
  }
  int err = ok ? 0 : errno;
  free(text);
  if (close(fd) != 0 && ok) ok = false, err = errno;
  if (ok && rename(tmp, path) != 0) ok = false, err = errno;
  if (!ok) {
    fprintf(stderr, "gpuguard watch: writing %s failed%s%s\n", path, err ? ": " : "",
            err ? strerror(err) : "");
    unlink(tmp);
    return 1;
  }
  return 0;
}

/* ---- HTTP --------------------------------------------------------------------------------------------- */

int exporter_listen(const char *spec) {
  char host[256];
  const char *colon = strrchr(spec, ':');
  if (!colon || !colon[1] || (size_t)(colon - spec) >= sizeof host) {
    fprintf(stderr,
            "gpuguard watch: --listen '%s': ADDR:PORT expected (e.g. 127.0.0.1:9400, [::1]:9400, :9400)\n",
            spec);
    return -1;
  }
  memcpy(host, spec, (size_t)(colon - spec));
  host[colon - spec] = '\0';
  char *h = host;
  size_t hl = strlen(h);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') h[hl - 1] = '\0', h++; /* [::1] */
  struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  int rc = getaddrinfo(*h ? h : NULL, colon + 1, &hints, &ai);
  if (rc != 0) {
    fprintf(stderr, "gpuguard watch: --listen '%s': %s\n", spec, gai_strerror(rc));
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
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 16) != 0) err = errno, close(fd), fd = -1;
  }
  freeaddrinfo(ai);
  if (fd < 0) {
    fprintf(stderr, "gpuguard watch: --listen '%s': %s\n", spec, strerror(err));
    return -1;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char shown[NI_MAXHOST], port[NI_MAXSERV];
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
      getnameinfo((struct sockaddr *)&ss, sl, shown, sizeof shown, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0)
    fprintf(stderr, "gpuguard watch: serving http://%s%s%s:%s/metrics\n", ss.ss_family == AF_INET6 ? "[" : "",
            shown, ss.ss_family == AF_INET6 ? "]" : "", port);
  return fd;
}

/* Waits for fd to be ready for events until deadline; false when the time is up. */
static bool wait_fd(int fd, short events, double deadline) {
  for (;;) {
    double left = deadline - gg__now_ms();
    if (left <= 0) return false;
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, (int)left + 1);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

static void send_all(int fd, const char *p, size_t n, double deadline) {
  while (n > 0 && wait_fd(fd, POLLOUT, deadline)) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT); /* a client that went away is no SIGPIPE */
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) return;
    p += w, n -= (size_t)w;
  }
}

static void respond(int fd, const char *status, const char *type, const char *extra, const char *body,
                    size_t len, bool head_only) {
  char head[512];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n",
                   status, type, len, extra);
  double deadline = gg__now_ms() + WRITE_LIMIT_MS;
  send_all(fd, head, (size_t)n, deadline);
  if (!head_only) send_all(fd, body, len, deadline);
}

/* Reads the request head (up to the blank line), bounded in size and time. Its length, or -1. */
static ssize_t read_request(int fd, char *buf, size_t cap) {
  double deadline = gg__now_ms() + READ_LIMIT_MS;
  size_t got = 0;
  while (got < cap - 1) {
    if (!wait_fd(fd, POLLIN, deadline)) return -1;
    ssize_t r = recv(fd, buf + got, cap - 1 - got, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return -1;
    got += (size_t)r;
    buf[got] = '\0';
    if (strstr(buf, "\r\n\r\n") || strstr(buf, "\n\n")) return (ssize_t)got;
  }
  return -2; /* too large */
}

int exporter_serve_one(int listen_fd) {
  int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0) return 0;
  char req[REQUEST_MAX];
  ssize_t n = read_request(fd, req, sizeof req);
  int served = 0;
  if (n == -2) {
    static const char msg[] = "request too large\n";
    respond(fd, "431 Request Header Fields Too Large", "text/plain", "", msg, sizeof msg - 1, false);
  } else if (n > 0) {
    char method[16] = "", target[1024] = "";
    if (sscanf(req, "%15s %1023s", method, target) != 2) {
      static const char msg[] = "bad request\n";
      respond(fd, "400 Bad Request", "text/plain", "", msg, sizeof msg - 1, false);
    } else if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
      static const char msg[] = "only GET and HEAD\n";
      respond(fd, "405 Method Not Allowed", "text/plain", "Allow: GET, HEAD\r\n", msg, sizeof msg - 1, false);
    } else {
      bool head = strcmp(method, "HEAD") == 0;
      target[strcspn(target, "?#")] = '\0';
      if (strcmp(target, "/metrics") != 0) {
        static const char msg[] = "not found: gpuguard serves /metrics\n";
        respond(fd, "404 Not Found", "text/plain", "", msg, sizeof msg - 1, head);
      } else {
        size_t len = 0;
        char *body = render(&len);
        if (body)
          respond(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", "", body, len, head), served = 1;
        else
          respond(fd, "500 Internal Server Error", "text/plain", "", "report failed\n", 14, head);
        free(body);
      }
    }
  }
  shutdown(fd, SHUT_WR);
  close(fd);
  return served;
}
