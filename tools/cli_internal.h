/* cli_internal.h — what the `gpuguard` command's files share: cli.c's usage errors, option values,
 * text made safe for a terminal and the process table's rows; each command's entry point (cmd_*.c,
 * dispatched from gpuguard.c's table); and the pieces of `watch` (the Prometheus exporter). */
#ifndef GG_CLI_INTERNAL_H
#define GG_CLI_INTERNAL_H

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
/* getopt_long for every command: returns -1 when done, the option, '?' for an unknown one, ':' for
 * one whose value is missing (also `--grace --`, where "--" would be taken as the value). */
int next_opt(int argc, char **argv, const struct option *longs);
/* The usage error for '?' or ':' from next_opt. */
int cli_opt_error(int opt, char **argv);

const char *human(double bytes, char *buf, size_t cap);

/* Copies s into out (cap bytes) so that a terminal shows it as text and nothing else: printable
 * ASCII and well-formed UTF-8 above U+009F pass; control characters (ESC, CR, LF, C1 controls such
 * as CSI) and bytes that are not UTF-8 become \xHH. A row printed from it cannot move the cursor or
 * forge a line. Cut at a character boundary when out is too small. */
void cli_safe_text(const char *s, char *out, size_t cap);

/* The longest prefix of s (safe text) that fits in cols terminal columns (cols < 0: no limit): its
 * length in bytes; *used receives its width. Wide characters count two. */
size_t cli_fit(const char *s, int cols, int *used);

/* The devices a table shows: the GPUs as nvidia-smi numbers them (*gpus true: NVML's, whether CUDA
 * here sees them or not); on a machine without any, gpuguard's own (the simulated host device).
 * 0, or the error of counting them. */
int cli_devices(bool *gpus, int *n);
/* gg_gpu_info() or gg_device_info(), as cli_devices() chose. */
int cli_device_info(bool gpus, int i, gg_device_info_t *d);
/* gg_gpu_telemetry() or gg_device_telemetry(), as cli_devices() chose. */
int cli_device_telemetry(bool gpus, int i, gg_device_telemetry_t *t);
/* Every process holding any device (only >= 0: device `only` alone, none when it does not exist),
 * except this one (the CLI's own device descriptors are not news). Returns 0, or 1 after a message
 * to errs (NULL: none); *no_gpu is set when there is no NVIDIA GPU. */
int cli_gather_processes(gg_process_t **out, size_t *nout, bool *no_gpu, FILE *errs, int only);
/* Whether `gpuguard reap` (as this user; with --all-users as root) ends what this row is. */
bool cli_reapable(const gg_process_t *p);
/* Whether the session registry can be read; says why on stderr, naming cmd, when not. */
bool cli_registry_usable(const char *cmd);

/* ---- the commands, one file each (cmd_NAME.c) ------------------------------------------------ */
int cmd_ps(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_reap(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_watch(int argc, char **argv);

/* exporter.c: Prometheus text for node_exporter's textfile collector, and over HTTP. */
/* The exporter's port when --listen gives none: DCGM's exporter has 9400 on the same GPU nodes, and
 * Prometheus' list of exporter ports is full; 9402 keeps the GPU exporters side by side in firewall
 * rules without taking DCGM's (or node_exporter's 9100, or nvidia_gpu_exporter's 9835). */
#define EXPORTER_DEFAULT_PORT 9402
typedef struct exporter exporter_t;
/* --prom-file's textfile and what its writes keep between them: when its directory is next swept
 * for the temporary files of killed exporters. Zero-initialise all but path. */
typedef struct prom_file {
  const char *path;
  bool swept;           /* the first write has swept */
  double next_sweep_ms; /* CLOCK_MONOTONIC: the next write at or after this sweeps again */
} prom_file_t;
/* Writes the report (gg_report bits `what`, per-process series bounded by top as gg_report_ex
 * bounds them; gpu: one GPU's series, -1 every GPU) to a new temporary file in pf->path's directory
 * (O_EXCL: nothing planted there is followed) and renames it over the path; the first write, and
 * then one now and again, first removes stale temporary files killed exporters left. 0, or 1 after
 * a message. */
int exporter_write_file(prom_file_t *pf, unsigned what, unsigned top, int gpu);
/* Splits --listen's value into host ("" for loopback) and port; 0, or 1 after a message. */
int exporter_parse_listen(const char *spec, char *host, size_t hcap, unsigned *port);
/* Listens on --listen's value: "ADDR:PORT", "[V6ADDR]:PORT", ":PORT" or "PORT" (loopback), "ADDR"
 * (the default port); port 0 picks one. Says where on stderr, and warns when the address is not a
 * loopback one. NULL after a message. */
exporter_t *exporter_open(const char *spec, unsigned what, unsigned top, int gpu);
/* Serves clients (/metrics, / linking it, else 404), many at once, each bounded in request size and
 * time, until deadline_ms (CLOCK_MONOTONIC milliseconds) or a byte arrives on wake_fd. Returns that
 * byte, 'c' after a /metrics answer was sent whole, 0 when the time is up. */
int exporter_serve(exporter_t *ex, double deadline_ms, int wake_fd);
void exporter_close(exporter_t *ex);

/* ---- option values every command reads the same way (cli.c) ---------------------------------- */
/* A duration: a number with a unit (ms, s, m) or a bare number in default_unit_ms; between min_ms
 * and max_ms. false after a usage message naming opt. */
bool cli_duration(const char *opt, const char *text, double default_unit_ms, double min_ms,
                  double max_ms, double *out_ms);
/* --color=auto|always|never: 0 never, 1 always, 2 auto; -1 after a usage message. */
int cli_color_mode(const char *text);
/* Whether to colour output to fd: always, never, or auto (a terminal, NO_COLOR unset, TERM not
 * dumb). */
bool cli_color_on(int mode, int fd);
/* -i/--id N|UUID: a GPU number, or the number of the GPU with that UUID (nvidia-smi's numbering);
 * false after a usage message. */
bool cli_device_arg(const char *text, int *device);
/* Whether device `gpu` (-1: none asked for) exists among cli_devices(): 0; EXIT_USAGE after a line
 * saying it does not; 1 after the error when the devices cannot be counted. */
int cli_gpu_exists(const char *cmd, int gpu);
/* --grace TIME for run and reap, in milliseconds: 500ms, 2s, 1m or a bare number of seconds; at
 * most the library's GG_PROC_GRACE_MAX_MS; a bare number above 600 is refused with a hint to write
 * Nms. false after a usage message. */
bool cli_grace(const char *text, long *out);
/* No NVIDIA GPU here: the library runs on its simulated host device and NVML is not there
 * either. */
bool cli_no_gpu(void);

#endif
