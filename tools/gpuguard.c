/* gpuguard.c — the `gpuguard` command line: who holds GPU memory (ps), devices (info, watch),
 * guarded jobs (run) and their orphans (reap), built on the public API only. This file holds the
 * commands' table, with each command's usage text, and main; each command lives in its own
 * cmd_*.c. */
#include <stdio.h>
#include <string.h>

#include "cli_internal.h"

/* ---- dispatch -------------------------------------------------------------------------------- */

static const command_t commands[] = {
    {"ps", "[--json] [--all-users] [--why] [-i N] [--color=WHEN]",
     "Lists the processes holding GPU memory; stranded ones stand out.", cmd_ps,
     "  --json        devices and processes as JSON (each with its class and \"why\")\n"
     "  --all-users   include processes of other users (hidden by default)\n"
     "  --why         the evidence for each class, on a line under its row\n"
     "  -i, --id N    only GPU N (as nvidia-smi numbers it; a UUID too), also with --json\n"
     "  --color=WHEN  auto (on a terminal, unless NO_COLOR is set), always or never\n"
     "  -h, --help    this help\n"
     "Classes: guarded (in a live gpuguard session), orphan (its session's leader died), stranded "
     "(a\n"
     "worker no session knows whose parent is gone: multiprocessing, DataLoader, "
     "torch.distributed,\n"
     "joblib, Ray), detached (a program left running on purpose: nohup, setsid, tmux, a service, "
     "a\n"
     "container's init; never reaped unless named), fd-holder (holds /dev/nvidia* but no "
     "context),\n"
     "foreign (another user), unknown. gpuguard itself is never listed. Control characters in "
     "commands\n"
     "are shown as \\xHH. The last line names the command that ends what it counts.\n"
     "Exit status (the same with --json): 0 listed (also when nothing holds a GPU), 1 the list "
     "could not\n"
     "be read, 2 usage error, 3 no NVIDIA GPU on this machine (neither NVML nor the CUDA driver "
     "loads).\n"},
    {"run",
     "[--grace TIME] [--receipt PATH] [--device N] [--pid-ns[=auto|on|off]] [--torch] -- CMD "
     "ARGS...",
     "Runs CMD as a guarded job; when it ends or the runner is signalled, nothing of it is left.",
     cmd_run,
     "  --grace TIME    how long the job has to end after its one SIGTERM before SIGKILL: 500ms, "
     "2s,\n"
     "                  1m or a bare number of seconds (default 2s, at most 600s; a bare number "
     "above\n"
     "                  600 is refused: write Nms for milliseconds)\n"
     "  --receipt PATH  write a JSON receipt: what was sent to whom, how each ended, device free "
     "memory\n"
     "                  before and after ('-' for stdout)\n"
     "  --device N      the device whose free memory the receipt records (default 0)\n"
     "  --pid-ns[=MODE] CMD in its own PID namespace, so that if the runner is SIGKILLed the "
     "kernel\n"
     "                  ends every process of the job at once. auto (MODE when left out): where "
     "the\n"
     "                  system allows one (root, or an unprivileged user namespace), otherwise\n"
     "                  without, saying so on one line (the default); on: or fail (exit 126); "
     "off.\n"
     "                  GPUGUARD_PID_NS=auto|on|off sets the default (a bad value is a usage "
     "error)\n"
     "  --torch         GPUGUARD_TORCH=1 for the job: its Python processes take gpuguard as "
     "PyTorch's\n"
     "                  CUDA allocator (the Python package's startup hook)\n"
     "  -h, --help      this help\n"
     "The runner is a child subreaper, records a session leader in the registry (children inherit\n"
     "GPUGUARD_SESSION), takes every signal that would otherwise end the runner (SIGINT, SIGTERM,\n"
     "SIGHUP, SIGQUIT, SIGUSR1/2, SIGALRM, SIGPIPE, SIGXCPU, ...) and sees that CMD gets it once: "
     "the\n"
     "terminal's and those sent to the whole group reach CMD directly, those sent to the runner "
     "alone are\n"
     "passed on. Only SIGTERM, SIGINT, SIGHUP or SIGQUIT not from the terminal start the grace "
     "period.\n"
     "Signals ignored at start (nohup) stay ignored, in CMD too. Exits with CMD's status (128+N "
     "when CMD\n"
     "was ended by signal N), also when the receipt cannot be written; the runner's signal is in "
     "the\n"
     "receipt, which replaces PATH in one rename.\n"},
    {"reap", "[-n|--dry-run] [-y|--yes] [--grace TIME] [--all-users] [-i N|UUID] [--pid PID...]",
     "Ends your stranded workers and the orphans of dead gpuguard sessions.", cmd_reap,
     "  -n, --dry-run  list them, do nothing\n"
     "  -y, --yes      end them without asking (otherwise asks on a terminal, lists elsewhere)\n"
     "  --grace TIME   time between SIGTERM and SIGKILL: 500ms, 2s, 1m or a bare number of "
     "seconds\n"
     "                 (default 2s, at most 600s; a bare number above 600 is refused)\n"
     "  --all-users    as root: other users' stranded workers too\n"
     "  --pid PID...   end these processes instead, whatever their class (the only way to end a\n"
     "                 detached one); pid 1, this process and its ancestors, kernel threads and "
     "other\n"
     "                 users' processes (without --all-users as root) are refused\n"
     "  -i, --id N     only what holds GPU N (a number as nvidia-smi's -i, or a UUID)\n"
     "  -h, --help     this help\n"
     "Each process is checked by its start time and held by pidfd right before the first signal, "
     "so a\n"
     "pid reused since the listing is never signalled; one line per process says what was sent.\n"
     "Stale registry records with nothing of their session left are removed. Exit status: 0 done "
     "(or\n"
     "nothing to do), 1 something was refused or survived SIGKILL, 2 usage error.\n"},
    {"check", "[--json] [--allow BYTES] [-i N] [--interval TIME [--count N]]",
     "Exits 0 when the GPUs hold nothing beyond the allowance, 1 when something is held.",
     cmd_check,
     "  --json            the problems as JSON (with --interval, one object a line per check)\n"
     "  --allow BYTES     memory no listed process holds that is tolerated per GPU (K/M/G\n"
     "                    suffixes; default 1G: NVML counts the driver's reserve as used)\n"
     "  -i, --id N        only GPU N (as nvidia-smi numbers it; a UUID too)\n"
     "  --interval TIME   check again every TIME (500ms, 10s, 1m, or seconds; at most a day),\n"
     "                    printing each check as it ends, until one finds something (its\n"
     "                    status is the exit status) or SIGINT/SIGTERM (the last check's, 0)\n"
     "  --count N         with --interval: stop after N checks\n"
     "  -h, --help        this help\n"
     "One line per problem on stdout: a stranded or orphaned process and the memory it holds,\n"
     "memory no listed process holds. Exit status: 0 ok, 1 something is held, 2 usage error,\n"
     "3 no NVIDIA GPU. For Slurm prologs and epilogs, Kubernetes probes and CI steps\n"
     "(docs/deploy.md); with --interval, a watch that ends when something is left behind.\n"},
    {"info", "[--json|--prom] [-i N]", "Shows the devices and their memory.", cmd_info,
     "  --json        as JSON\n"
     "  --prom        as Prometheus text exposition (format 0.0.4): the GPUs NVML sees, labelled "
     "as\n"
     "                DCGM's exporter labels them; none (and a line on stderr) without a GPU\n"
     "  -i, --id N    only GPU N (as nvidia-smi numbers it; a UUID too), in every format\n"
     "  -h, --help    this help\n"},
    {"plot", "FILE [-o OUT.html] [--x time|step] [--title TEXT]",
     "Draws a memory timeline (watch --record, gpuguard.record()) as one self-contained HTML file.",
     cmd_plot,
     "  -o, --output OUT  the HTML file to write (default memory.html)\n"
     "  --x time|step     horizontal axis (default time)\n"
     "  --title TEXT      the page's title\n"
     "  -h, --help        this help\n"
     "Runs gpuguard.diagnostics.plot with GPUGUARD_PYTHON (set by the wheel's gpuguard command to "
     "its\n"
     "own interpreter), else python3 (the Python package must be importable;\n"
     "GPUGUARD_LIBRARY is set to this command's library unless it is set already).\n"},
    {"watch",
     "[--interval TIME] [--count N] [-i N] [--color=WHEN] [--record FILE] | [--prom-file PATH] "
     "[--listen [ADDR][:PORT]] [--top K] [--command-labels] [--all-users]",
     "A live view of devices, processes and gpuguard sessions; or a Prometheus exporter.",
     cmd_watch,
     "  --interval TIME     time between refreshes: 500ms, 10s, 1m (a bare number is seconds; "
     "default 2s)\n"
     "  --count N           stop after N refreshes (with --listen alone: after N scrapes)\n"
     "  -i, --id N          only GPU N (as nvidia-smi numbers it; a UUID too): the view, and the\n"
     "                      exporter's series\n"
     "  --color=WHEN        auto (on a terminal, unless NO_COLOR is set), always or never\n"
     "  --no-color          the same as --color=never\n"
     "  --record FILE       append a sample of each device's used memory to FILE every interval, "
     "as\n"
     "                      JSON lines that `gpuguard plot FILE` draws\n"
     "  --prom-file PATH    write Prometheus text to PATH every interval, atomically "
     "(node_exporter's\n"
     "                      textfile collector)\n"
     "  --listen ADDR:PORT  serve Prometheus text at http://ADDR:PORT/metrics (and a page at / "
     "linking it)\n"
     "                      to many scrapers at once. Without an address, loopback only "
     "(127.0.0.1):\n"
     "                      9402, :9402 and 127.0.0.1 are the same; 0.0.0.0:9402 or [::]:9402 for "
     "every\n"
     "                      interface (a warning says so). The default port is 9402 (DCGM's "
     "exporter\n"
     "                      has 9400); port 0 picks a free one, printed on stderr\n"
     "  --top K             per-process series (memory, info) for the K largest holders of each "
     "GPU\n"
     "                      and every stranded or orphaned process (default 10); the rest are "
     "counted\n"
     "                      in gpuguard_class_memory_used_bytes and "
     "gpuguard_process_series_omitted\n"
     "  --command-labels    a command label on gpuguard_process_info for your own processes "
     "(none by\n"
     "                      default: command lines carry arguments; for single-user machines)\n"
     "  --all-users         other users' command lines too (implies --command-labels)\n"
     "  -h, --help          this help\n"
     "On a terminal the view fits the width and redraws in place: q quits, any other key "
     "refreshes.\n"
     "Per GPU: utilisation, memory utilisation, temperature and power (from NVML), memory "
     "used/total.\n"
     "Series cover the GPUs NVML sees, labelled gpu (NVML's index), UUID, pci_bus_id, device, "
     "modelName\n"
     "and Hostname as NVIDIA's DCGM exporter labels them; without a GPU, none (a line on stderr "
     "says so).\n"
     "A failed --prom-file write is said and tried again next interval (the status is 1 if the "
     "last\n"
     "failed). SIGTERM/SIGINT end it (status 0).\n"},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void main_usage(FILE *f) {
  fprintf(f, "usage: gpuguard COMMAND [OPTIONS]   (gpuguard %s; -V, --version)\n\ncommands:\n",
          gg_version());
  for (size_t i = 0; i < NCOMMANDS; i++)
    fprintf(f, "  %-6s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\n'gpuguard COMMAND --help' describes each command.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    main_usage(stderr);
    return EXIT_USAGE;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    main_usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
    printf("gpuguard %s\n", gg_version());
    return 0;
  }
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (!strcmp(argv[1], commands[i].name)) {
      current = &commands[i];
      return commands[i].run(argc - 1, argv + 1);
    }
  fprintf(stderr, "gpuguard: unknown command '%s'\n", argv[1]);
  main_usage(stderr);
  return EXIT_USAGE;
}
