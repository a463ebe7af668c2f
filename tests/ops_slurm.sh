#!/usr/bin/env bash
# ops_slurm.sh BUILD SRC — deploy/slurm's prolog, epilog and health check on a real single-node Slurm
# (issue 43 §2): munged, slurmctld and slurmd from Debian's packages, started here with their state in
# a temp dir, the stand-in NVML for the GPU (its process list in the scripts' config file).
#  A. a batch job whose trainer is SIGKILLed leaves two spawn workers "holding" GPU memory: the epilog
#     reaps them and the node stays idle;
#  B. a stranded worker already there when a job starts: the prolog drains the node with a reason naming
#     pid, class and GPU (no command line), the batch job is requeued and held, the epilog Slurm runs
#     then reaps the worker and resumes the node; without a job (no epilog) a drain stays while the
#     worker lives, and the health check resumes the node once `check` passes again;
#  C. the scripts never drain on a missing gpuguard (127) or a usage error (2).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
g=$build/gpuguard
for t in munged slurmctld slurmd sbatch scontrol sinfo; do
  command -v $t >/dev/null || [ -x /usr/sbin/$t ] || { echo "skipped: $t missing (apt install slurm-wlm munge; scripts/deps.sh --tests)"; exit 77; }
done
[ "$(id -u)" = 0 ] || { echo "skipped: slurmd runs jobs as their users: needs root"; exit 77; }
[ "$(readlink /proc/self/ns/pid)" = "pid:[4026531836]" ] || { echo "SKIP: not in the initial PID namespace"; exit 77; }
tmp=$(mktemp -d)
chmod 755 "$tmp"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [ -s "$tmp/kids" ] && for k in $(cat "$tmp/kids"); do kill -9 "$k" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in ctld.log d.log; do echo "--- $f" >&2; tail -20 "$tmp/$f" >&2 2>/dev/null || true; done
  exit 1
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
node=$(hostname -s)

# The scripts as an operator installs them: gpuguard's absolute path and the config file edited in.
conf=$tmp/gpuguard.conf
for s in prolog epilog healthcheck; do
  sed -e "s|^GPUGUARD=.*|GPUGUARD=$g|" -e "s|^CONF=.*|CONF=$conf|" "$src/deploy/slurm/$s.sh" >"$tmp/$s.sh"
  chmod 755 "$tmp/$s.sh"
done
cat >"$conf" <<EOF2
GPUGUARD_REGISTRY_DIR=$tmp/registry
GPUGUARD_ALLOW=1G
GPUGUARD_GRACE=500ms
export GPUGUARD_BACKEND=host GPUGUARD_NVML_LIBRARY=$build/tests/libfake_nvml.so
export FAKE_NVML_PROCS=
export FAKE_NVML_MEMORY=85899345920,1073741824
export SLURM_CONF=$tmp/slurm.conf
EOF2
procs() { sed -i "s|^export FAKE_NVML_PROCS=.*|export FAKE_NVML_PROCS=$1|" "$conf"; }

# munged with a key of its own.
mkdir -p "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/key" bs=1024 count=1 2>/dev/null
chmod 700 "$tmp/munge"; chmod 400 "$tmp/munge/key"
/usr/sbin/munged --force --key-file="$tmp/munge/key" --socket="$tmp/munge/sock" \
  --pid-file="$tmp/munge/pid" --log-file="$tmp/munge/log" --seed-file="$tmp/munge/seed" ||
  fail "munged did not start: $(cat "$tmp/munge/log" 2>/dev/null)"
pids+=("$(cat "$tmp/munge/pid")")

cat >"$tmp/slurm.conf" <<EOF2
ClusterName=gpuguardci
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/sock
CredType=cred/munge
StateSaveLocation=$tmp/ctld
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/ctld.pid
SlurmdPidFile=$tmp/d.pid
SlurmctldLogFile=$tmp/ctld.log
SlurmdLogFile=$tmp/d.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout=30
Prolog=$tmp/prolog.sh
Epilog=$tmp/epilog.sh
PrologEpilogTimeout=60
HealthCheckProgram=$tmp/healthcheck.sh
HealthCheckInterval=2
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=ci Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF2
export SLURM_CONF=$tmp/slurm.conf
mkdir -p "$tmp/ctld" "$tmp/spool"
/usr/sbin/slurmctld -D -i -f "$SLURM_CONF" >"$tmp/ctld.out" 2>&1 &
pids+=("$!")
/usr/sbin/slurmd -D -f "$SLURM_CONF" -N "$node" >"$tmp/d.out" 2>&1 &
pids+=("$!")
state() { sinfo -h -n "$node" -o %T 2>/dev/null | head -1; }
wait_state() { # pattern, what
  for _ in $(seq 1 150); do [[ "$(state)" =~ $1 ]] && return 0; sleep 0.2; done
  fail "$2: the node is '$(state)'"
}
wait_state '^idle$' "Slurm did not come up"
echo "slurm $(sinfo -V | cut -d' ' -f2): $node idle"

# A. The trainer SIGKILLed in a batch job; its spawn workers outlive the job (linuxproc loses them).
cp "$src/tests/stranded_trainer.py" "$tmp/trainer.py"
cat >"$tmp/job.sh" <<EOF2
#!/bin/bash
python3 $tmp/trainer.py $tmp/kids 2 &
trainer=\$!
while [ ! -s $tmp/kids ]; do sleep 0.05; done
spec=""
for k in \$(cat $tmp/kids); do spec="\$spec\$k:4294967296,"; done
sed -i "s|^export FAKE_NVML_PROCS=.*|export FAKE_NVML_PROCS=\${spec%,}|" $conf
kill -9 \$trainer
sleep 0.3
EOF2
job=$(sbatch --parsable -o "$tmp/job.out" "$tmp/job.sh")
for _ in $(seq 1 150); do [ -z "$(squeue -h -j "$job" 2>/dev/null)" ] && break; sleep 0.2; done
[ -s "$tmp/kids" ] || fail "the job did not start its trainer: $(cat "$tmp/job.out" 2>/dev/null)"
for k in $(cat "$tmp/kids"); do
  for _ in $(seq 1 100); do [ -d "/proc/$k" ] || break; sleep 0.1; done
  [ -d "/proc/$k" ] && fail "stranded worker $k outlived the epilog"
done
sleep 1
[ "$(state)" = idle ] || fail "after the epilog the node is '$(state)'"
echo "A: batch job $job: trainer SIGKILLed, 2 spawn workers (4 GiB each) reaped by the epilog; node $(state)"
procs ""

# B. A stranded worker there before the job: the prolog drains, the job is held, the health check
#    resumes the node once the worker is gone.
setsid sh -c "python3 '$tmp/trainer.py' '$tmp/kids2' 1 & echo \$! > '$tmp/t2'"
for _ in $(seq 1 500); do [ -s "$tmp/kids2" ] && break; sleep 0.02; done
w=$(cat "$tmp/kids2")
echo "$w" >>"$tmp/kids"
kill -9 "$(cat "$tmp/t2")"
procs "$w:2147483648"
job2=$(sbatch --parsable -o /dev/null --wrap "true")
# The prolog drains; the epilog that Slurm runs after the failed prolog reaps the worker and resumes
# the node at once, so the drain's reason is read from slurmctld's log (sinfo -R showed it meanwhile).
for _ in $(seq 1 150); do grep -q "reason set to: gpuguard" "$tmp/ctld.log" && break; sleep 0.2; done
reason=$(grep -o "reason set to: gpuguard.*" "$tmp/ctld.log" | head -1 | sed 's/^reason set to: //')
echo "B: the prolog drained $node, reason: $reason"
[[ "$reason" =~ ^gpuguard:\ GPU\ 0:\ stranded\ process\ $w\ \(user\ root\)\ holds\ 2.0\ GiB$ ]] || fail "reason: $reason"
[[ "$reason" != *multiprocessing* && "$reason" != *python* ]] || fail "a command line in the reason: $reason"
for _ in $(seq 1 100); do
  jr=$(squeue -h -j "$job2" -o "%T %r" 2>/dev/null || true)
  [[ "$jr" == "PENDING launch failed requeued held" ]] && break
  sleep 0.2
done
echo "B: job $job2: $jr"
[[ "$jr" == "PENDING launch failed requeued held" ]] || fail "job $job2 is '$jr'"
for _ in $(seq 1 100); do [ -d "/proc/$w" ] || break; sleep 0.1; done
[ -d "/proc/$w" ] && fail "the epilog did not reap the stranded worker $w"
wait_state '^idle$' "the epilog did not resume the node"
echo "B: the epilog reaped worker $w and resumed $node: $(state)"
scancel "$job2" 2>/dev/null || true
procs ""

# B2. No job, so no epilog: a drain by the prolog (run here as slurmd runs it, no PATH) stays while the
#     stranded worker lives, and the health check resumes the node once `check` passes again.
setsid sh -c "python3 '$tmp/trainer.py' '$tmp/kids3' 1 & echo \$! > '$tmp/t3'"
for _ in $(seq 1 500); do [ -s "$tmp/kids3" ] && break; sleep 0.02; done
w=$(cat "$tmp/kids3")
echo "$w" >>"$tmp/kids"
kill -9 "$(cat "$tmp/t3")"
sleep 0.3
procs "$w:3221225472"
set +e; env -i SLURMD_NODENAME="$node" SLURM_CONF="$SLURM_CONF" /bin/bash "$tmp/prolog.sh"; rc=$?; set -e
[ $rc = 1 ] || fail "the prolog exited $rc with a stranded worker, wanted 1"
sleep 3 # the health check runs every 2 s: the worker is still there, the node stays drained
echo "B2: prolog exit $rc; 3 s later: $(state), sinfo -R: $(sinfo -h -R -n "$node" -o %E)"
[[ "$(state)" == drain* ]] || fail "the node did not stay drained while the worker lived"
kill -9 "$w"
wait_state '^idle$' "the health check did not resume the node"
echo "B2: worker gone, check passes: the health check resumed $node: $(state)"
procs ""

# C. Not a verdict, never a drain: gpuguard missing (127), a usage error (2).
sed "s|^GPUGUARD=.*|GPUGUARD=/nonexistent/gpuguard|" "$tmp/prolog.sh" >"$tmp/prolog-missing.sh"
sed "s|--allow \"\$GPUGUARD_ALLOW\"|--allow lots|" "$tmp/prolog.sh" >"$tmp/prolog-usage.sh"
for s in prolog-missing prolog-usage; do
  set +e; env -i SLURMD_NODENAME="$node" SLURM_CONF="$SLURM_CONF" /bin/bash "$tmp/$s.sh"; rc=$?; set -e
  [ $rc = 0 ] && [ "$(state)" = idle ] || fail "$s: exit $rc, node '$(state)'"
done
echo "C: a missing gpuguard and a usage error: prolog exits 0, the node stays idle"
echo "ops_slurm: ok"
