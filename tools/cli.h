/* cli.h — what the `gpuguard` command's files share: usage errors, the process table's rows, text made
 * safe for a terminal, and the pieces of `watch` (the terminal view and the Prometheus exporter). */
#ifndef GG_CLI_H
#define GG_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/clock_internal.h" /* the one clock reading: no library state */
#include "gpuguard/gpuguard.h"

#define EXIT_USAGE  2
#define EXIT_NO_GPU 3 /* ps: no NVIDIA GPU on this machine (neither NVML nor the driver loads) */

typedef struct command {
  const char *name, *args, *summary;
  int (*run)(int argc, char **argv);
  const char *help; /* options, one per line */
} command_t;

/* The command being run, for its messages and usage. */
extern const command_t *current;

void usage(FILE *f, const command_t *c);
/* A bad flag: says what was wrong, prints the usage to stderr; returns EXIT_USAGE. */
int bad_usage(const char *fmt, const char *what);
/* getopt_long for every command: returns -1 when done, the option, '?' for an unknown one, ':' for one
 * whose value is missing (also `--grace --`, where "--" would be taken as the value). */
int next_opt(int argc, char **argv, const struct option *longs);
/* The usage error for '?' or ':' from next_opt. */
int cli_opt_error(int opt, char **argv);

const char *human(double bytes, char *buf, size_t cap);

/* Copies s into out (cap bytes) so that a terminal shows it as text and nothing else: printable ASCII
 * and well-formed UTF-8 above U+009F pass; control characters (ESC, CR, LF, C1 controls such as CSI)
 * and bytes that are not UTF-8 become \xHH. A row printed from it cannot move the cursor or forge a
 * line. Cut at a character boundary when out is too small. */
void cli_safe_text(const char *s, char *out, size_t cap);

/* The longest prefix of s (safe text) that fits in cols terminal columns (cols < 0: no limit): its
 * length in bytes; *used receives its width. Wide characters count two. */
size_t cli_fit(const char *s, int cols, int *used);

/* Every process holding any device, except this one (the CLI's own device descriptors are not news).
 * Returns 0, or 1 after a message to errs (NULL: none); *no_gpu is set when there is no NVIDIA GPU. */
int cli_gather_processes(gg_process_t **out, size_t *nout, bool *no_gpu, FILE *errs);

/* watch.c */
int cmd_watch(int argc, char **argv);

/* exporter.c: Prometheus text for node_exporter's textfile collector, and over HTTP. */
/* Writes the report to a new temporary file in path's directory (O_EXCL: nothing planted there is
 * followed) and renames it over path. 0, or 1 after a message. */
int exporter_write_file(const char *path);
/* Listens on "ADDR:PORT", "[V6ADDR]:PORT" or ":PORT" (every address); port 0 picks one. Says where on
 * stderr. Returns the socket, or -1 after a message. */
int exporter_listen(const char *spec);
/* Accepts one waiting client and answers it: /metrics, else 404; bounded in size and time. Returns 1
 * when a /metrics request was answered, else 0. */
int exporter_serve_one(int listen_fd);

#endif
