#!/usr/bin/env bash
# Scale-out on a real scheduler: starts a one-node Slurm (munged, slurmctld
# and slurmd of Debian's slurm-wlm, as root, in a private folder with its own
# ports and key), submits docs/cluster/segment-array.sbatch as an array job of
# 3 tasks, and checks that the union of the tasks' outputs is byte-identical
# to one unsharded run. Also checks the GNU parallel one-liner the README
# documents. Exit 77 (skipped) where Slurm cannot start here (not root, the
# daemons or munge missing).
set -u
. "$(dirname "$0")/common_e2e.sh"
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
h() { "$PY" "$HELPER" "$@"; }

[ "$(id -u)" -eq 0 ] || { echo "skip: Slurm's daemons need root"; exit 77; }
for b in munged slurmctld slurmd sbatch squeue scontrol; do
    command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || { echo "skip: $b not installed"; exit 77; }
done
PATH=$PATH:/usr/sbin

# ---- a private one-node cluster ----------------------------------------------
S=$T/slurm
mkdir -p "$S/state" "$S/spool" "$S/log" "$S/munge"
chmod 700 "$S/munge"
dd if=/dev/urandom of="$S/munge/key" bs=1 count=1024 status=none
chmod 400 "$S/munge/key"
sock=$S/munge/sock
munged --force --socket="$sock" --key-file="$S/munge/key" --pid-file="$S/munge/pid" \
       --log-file="$S/log/munged.log" --seed-file="$S/munge/seed" 2>"$S/log/munged.err" ||
    { echo "skip: munged would not start: $(head -c 300 "$S/log/munged.err")"; exit 77; }
stop_all() {
    [ -f "$S/slurmd.pid" ] && kill "$(cat "$S/slurmd.pid")" 2>/dev/null
    [ -f "$S/slurmctld.pid" ] && kill "$(cat "$S/slurmctld.pid")" 2>/dev/null
    munged --stop --socket="$sock" >/dev/null 2>&1
    sleep 0.5
    rm -rf "$T"
}
trap stop_all EXIT

node=$(hostname -s)
# Two ports nothing listens on, from the ephemeral range, picked at random so
# two runs on one machine do not collide.
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 20000))
        ss -ltnH "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return; }
    done
}
cport=$(free_port); dport=$(free_port)
[ "$dport" != "$cport" ] || dport=$((cport + 1))
cat > "$S/slurm.conf" <<CONF
ClusterName=mitaseg-test
SlurmctldHost=$node
SlurmctldPort=$cport
SlurmdPort=$dport
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$node CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$S/slurm.conf
slurmctld -i -f "$SLURM_CONF" 2>"$S/log/slurmctld.err" ||
    { echo "skip: slurmctld would not start: $(tail -c 300 "$S/log/slurmctld.err")"; exit 77; }
slurmd -f "$SLURM_CONF" 2>"$S/log/slurmd.err" ||
    { echo "skip: slurmd would not start: $(tail -c 300 "$S/log/slurmd.err")"; exit 77; }
up=0
for _ in $(seq 100); do
    sinfo -h -o %T 2>/dev/null | grep -qx idle && { up=1; break; }
    sleep 0.2
done
if [ $up -eq 0 ]; then
    echo "skip: the node did not come up: $(sinfo -h -o '%T %E' 2>&1 | head -1)"
    tail -5 "$S/log/slurmctld.log" "$S/log/slurmd.log" 2>/dev/null
    exit 77
fi
ok "one-node Slurm up (ports $cport/$dport)"

# ---- inputs and the reference: one unsharded run --------------------------------
for i in $(seq 1 7); do h img "in/img$i.png" $((30 + i * 3)) $((20 + i * 2)) "$i"; done
h img in/sub/deep.png 41 29 9
"$BIN" segment in -r -o ref --threads 1 -q || bad "unsharded run"

# ---- the documented array job ----------------------------------------------------
jid=$(MITASEG=$BIN sbatch --parsable --array=0-2 --cpus-per-task=1 --chdir="$T" \
          --output="$T/job-%A_%a.log" --export=ALL \
          "$SRC/docs/cluster/segment-array.sbatch" in sharded 2>"$S/sbatch.err")
check "sbatch accepted the array job" test -n "$jid"
done_=0
for _ in $(seq 600); do
    [ -z "$(squeue -h -j "$jid" 2>/dev/null)" ] && { done_=1; break; }
    sleep 0.2
done
check "the array job finished within 2 minutes" test $done_ -eq 1
states=$(sacct -n -X -j "$jid" -o State 2>/dev/null | tr -d ' ' | sort -u)
# Without accounting, sacct has nothing: the logs and outputs are the evidence.
n_logs=$(ls "$T"/job-"$jid"_*.log 2>/dev/null | wc -l)
check "three array tasks ran (one log each)" test "$n_logs" -eq 3
check "no task wrote an error" bash -c "! grep -l . '$T'/job-${jid}_*.log"
check "sharded union is byte-identical to the unsharded run" diff -r ref sharded
# Each image was written by exactly one task: a task's log would say if it
# had failed, and diff -r already showed no extra or missing file.
[ -n "$states" ] && echo "note: sacct states: $states"

# ---- the GNU parallel one-liner from the README -------------------------------------
if command -v parallel >/dev/null; then
    parallel -j3 "'$BIN'" segment in -r -o par --threads 1 -q --shard {}/3 ::: 1 2 3 ||
        bad "parallel one-liner"
    check "GNU parallel shards equal the unsharded run" diff -r ref par
fi

echo "$pass passed, $fails failed"
[ $fails -eq 0 ]
