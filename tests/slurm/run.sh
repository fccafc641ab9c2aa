#!/usr/bin/env bash
# End-to-end test of `jem-bench robust … --slurm N` on a real Slurm cluster of one node, started
# on this machine in a private temporary folder (its own munged, slurmctld and slurmd, its own
# slurm.conf through SLURM_CONF; nothing system-wide is read or written but the packages).
#
# It proves that:
#   1. without sbatch on the PATH the command exits 1 naming sbatch, with OUT/slurm/shards.sh written;
#   2. the job array of 3 shards and the merge job that waits on it run to COMPLETED, and the
#      merged robust.csv and examples.csv equal the unsharded sweep's byte for byte;
#   3. after one array task is cancelled mid-shard (its merge then never runs), rerunning the same
#      command resubmits, reuses the cells already finished, and merges to the same bytes again.
#
# Usage: tests/slurm/run.sh [BIN]   (BIN: the jem-bench binary, default target/release/jem-bench)
# Needs root (it installs slurmctld, slurmd, slurm-client and munge from Debian's packages where
# missing, and runs the daemons as root). Takes about 100 s on 2 cores, about 10 s more where the
# packages have to be downloaded and installed first. Ends with `slurm: N passed, 0 failed`.
# JEM_SLURM_KEEP=1 keeps the temporary folder (config, daemons' logs, sweeps) for a look afterwards.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${1:-target/release/jem-bench}"
# A relative BIN is taken from the caller's folder if it is there, else from the repository root.
if [[ "$bin" != /* ]]; then
    if [[ -e "$PWD/$bin" ]]; then bin="$PWD/$bin"; else bin="$repo/$bin"; fi
fi
cd "$repo"
# Nothing from a cluster the caller may be on (its config, partition, account) reaches this one.
for v in $(compgen -e | grep -E '^(SLURM|SBATCH|SALLOC|SRUN|SQUEUE|SINFO|SCONTROL|SCANCEL)_' || true); do
    unset "$v"
done
unset SLURM_CONF

passed=0
say() { echo "== slurm test, ${SECONDS} s in: $*"; }
ok() { passed=$((passed + 1)); echo "ok: $*"; }
fail() {
    echo "FAILED: $*" >&2
    echo "slurm test: ${SECONDS} s" >&2
    echo "slurm: $passed passed, 1 failed" >&2
    exit 1
}

[[ -x "$bin" ]] || fail "no jem-bench binary at $bin (build it with cargo build --release, or give its path)"
[[ "$(id -u)" == 0 ]] || fail "run as root: it installs Slurm and runs its daemons as root"

# The sweep: both models, FGSM and PGD, K = 0 and 1, 20 digits: 8 cells, about 15 s on 2 cores.
sweep=(robust --models results/models/baseline,results/models/jem --attacks fgsm,pgd
    --steps 0,1 --eps 0,0.1,0.3 --n-examples 20 --pgd-steps 5 --chains 2 --recheck-chains 2
    --eot 2 --convergence-sample 2 --grad full --jobs 1)
shards=3

tmp="$(mktemp -d /tmp/jem-slurm-test.XXXXXX)"
chmod 755 "$tmp" # munged wants its socket's folder searchable by all
mkdir -p "$tmp"/{etc,state,spool,log,run,munge,nopath}

# --- cleanup: everything this script started, by the ids it recorded -------------------------
daemons=() # pids of munged, slurmctld, slurmd (started in the foreground, so $! is the daemon)
stepds_before=" $(pgrep -x slurmstepd | tr '\n' ' ' || true) "
policy_rc_made=""
cluster_up="" # set once SLURM_CONF names this script's own cluster
cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    if [[ -n "$policy_rc_made" ]]; then rm -f /usr/sbin/policy-rc.d; fi
    if [[ $rc != 0 ]]; then
        for f in "$tmp"/log/*.log "$tmp"/*/slurm/logs/*.log; do
            [[ -s "$f" ]] || continue
            echo "---- last lines of $f" >&2
            tail -n 15 "$f" >&2
        done
    fi
    if [[ -n "$cluster_up" ]]; then
        timeout 20 scancel --user=root 2>/dev/null
        for _ in $(seq 50); do
            [[ -z "$(timeout 10 squeue -h -t running,completing 2>/dev/null)" ]] && break
            sleep 0.2
        done
    fi
    # Stop in reverse order of start: slurmd, slurmctld, munged.
    local i pid
    for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do
        pid="${daemons[i]}"
        kill -TERM "$pid" 2>/dev/null || continue
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    # A job step's slurmstepd that outlived its slurmd is ours if it is new; a zombie one is
    # only waiting for init to reap it.
    alive() { [[ -n "$(ps -o stat= -p "$1" 2>/dev/null | grep -v Z)" ]]; }
    new_stepds() {
        for pid in $(pgrep -x slurmstepd); do
            [[ "$stepds_before" == *" $pid "* ]] || ! alive "$pid" || echo "$pid"
        done
    }
    for pid in $(new_stepds); do kill -KILL "$pid" 2>/dev/null; done
    local left=""
    for _ in $(seq 10); do
        left=""
        for pid in "${daemons[@]}" $(new_stepds) $(pgrep -f "$tmp"); do
            alive "$pid" && left+=" $pid"
        done
        [[ -z "$left" ]] && break
        sleep 0.2
    done
    if [[ -n "${left// /}" ]]; then
        echo "error: processes still running after cleanup:$left" >&2
        rc=1
    fi
    if [[ "${JEM_SLURM_KEEP:-}" == 1 ]]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 1. Slurm and munge from Debian's packages, where missing ---------------------------------
find_cmd() { # the path of a command, also in sbin folders a non-login PATH may lack
    command -v "$1" 2>/dev/null || { for d in /usr/sbin /sbin /usr/bin; do
        [[ -x "$d/$1" ]] && { echo "$d/$1"; return; }; done; }
}
need=()
for c in slurmctld slurmd sbatch munged; do [[ -n "$(find_cmd "$c")" ]] || need+=("$c"); done
if ((${#need[@]})); then
    say "installing Slurm and munge (missing: ${need[*]})"
    # Debian's maintainer scripts would start the packages' own daemons; keep them from it.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        policy_rc_made=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge; } > "$tmp/log/apt.log" 2>&1 ||
        { tail -n 30 "$tmp/log/apt.log" >&2; fail "apt-get install of Slurm and munge failed"; }
    if [[ -n "$policy_rc_made" ]]; then rm -f /usr/sbin/policy-rc.d; policy_rc_made=""; fi
fi
slurmctld="$(find_cmd slurmctld)"; slurmd="$(find_cmd slurmd)"; munged="$(find_cmd munged)"
sbatch="$(find_cmd sbatch)"
[[ -n "$slurmctld" && -n "$slurmd" && -n "$munged" && -n "$sbatch" ]] ||
    fail "Slurm or munge is still missing after the install"
# Client commands (sbatch, squeue, scontrol, scancel) from the folder that holds sbatch.
export PATH="$(dirname "$sbatch"):$PATH"

# --- 2. without sbatch: exit 1 naming sbatch, the scripts written -----------------------------
say "without sbatch on the PATH"
! PATH="$tmp/nopath" command -v sbatch > /dev/null || fail "sbatch found in an empty PATH"
set +e
PATH="$tmp/nopath" "$bin" "${sweep[@]}" --slurm "$shards" --out "$tmp/nosbatch" \
    > "$tmp/nosbatch.out" 2>&1
rc=$?
set -e
[[ $rc == 1 ]] || { cat "$tmp/nosbatch.out" >&2; fail "without sbatch the command exited $rc, not 1"; }
grep -q sbatch "$tmp/nosbatch.out" || { cat "$tmp/nosbatch.out" >&2; fail "the error does not name sbatch"; }
[[ -s "$tmp/nosbatch/slurm/shards.sh" && -s "$tmp/nosbatch/slurm/merge.sh" ]] ||
    fail "without sbatch, OUT/slurm/shards.sh and merge.sh were not written"
ok "without sbatch: exit 1, '$(grep -m1 sbatch "$tmp/nosbatch.out" | cut -c1-60)…', scripts written"

# --- 3. a one-node cluster in $tmp -------------------------------------------------------------
say "starting munged, slurmctld and slurmd in $tmp"
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
msock="$tmp/munge/munge.socket"
"$munged" --foreground --force --socket="$msock" --key-file="$tmp/munge/munge.key" \
    --pid-file="$tmp/run/munged.pid" --log-file="$tmp/log/munged.log" \
    --seed-file="$tmp/munge/munged.seed" > "$tmp/log/munged.out" 2>&1 &
daemons+=($!)
for _ in $(seq 50); do [[ -S "$msock" ]] && break; sleep 0.1; done
[[ -S "$msock" ]] || { cat "$tmp/log/munged.out" >&2; fail "munged did not start"; }

port_free() { ! (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; }
ctld_port=16817
while ! port_free "$ctld_port" || ! port_free $((ctld_port + 1)); do ctld_port=$((ctld_port + 2)); done
host="$(hostname -s)"
cpus="$(nproc)"
mem_mb=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 9 / 10))
export SLURM_CONF="$tmp/etc/slurm.conf"
cat > "$SLURM_CONF" << EOF
# A one-node cluster for tests/slurm/run.sh; every path is inside $tmp.
ClusterName=jemtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$((ctld_port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$msock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
ReturnToService=2
SlurmctldTimeout=300
SlurmdTimeout=300
MessageTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=3600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
"$slurmctld" -D -i -f "$SLURM_CONF" > "$tmp/log/slurmctld.out" 2>&1 &
daemons+=($!)
"$slurmd" -D -N "$host" -f "$SLURM_CONF" > "$tmp/log/slurmd.out" 2>&1 &
daemons+=($!)
state=""
for _ in $(seq 150); do # 30 s
    state="$(sinfo -h -n "$host" -o %T 2>/dev/null || true)"
    [[ "$state" == idle ]] && break
    sleep 0.2
done
[[ "$state" == idle ]] || fail "the node did not come up idle in 30 s (sinfo: '${state:-no answer}')"
cluster_up=1
say "node $host idle ($cpus CPUs)"

# --- helpers -----------------------------------------------------------------------------------
job_state() { # JOBID or ARRAYID_TASK -> PENDING, RUNNING, COMPLETED, CANCELLED, ...
    scontrol show job -o "$1" 2>/dev/null | sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p' | head -n 1
}
finished_state() { [[ "$1" =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE)$ ]]; }
wait_job() { # JOBID SECONDS -> its final state on stdout; fails on timeout
    local s=""
    for _ in $(seq $(($2 * 5))); do
        s="$(job_state "$1")"
        finished_state "$s" && { echo "$s"; return; }
        sleep 0.2
    done
    fail "job $1 did not end in $2 s (state ${s:-unknown}): $(squeue -h -o '%i %T %r' 2>&1 | tr '\n' ';')"
}
submit() { # OUT -> "ARRAYID MERGEID", the ids the command printed
    local out="$1" line ids
    "$bin" "${sweep[@]}" --slurm "$shards" --slurm-time 0:10:00 --slurm-cpus 1 --out "$out" \
        > "$out.submit" 2>&1 || { cat "$out.submit" >&2; fail "robust --slurm $shards exited non-zero"; }
    line="$(tail -n 1 "$out.submit")"
    # "submitted 3 shards as job array A (…) and their merge as job M (…); …"
    ids=("$(grep -oE 'array [0-9]+' <<< "$line" | head -n 1 | cut -d' ' -f2)"
        "$(grep -oE '\bjob [0-9]+' <<< "$line" | head -n 1 | cut -d' ' -f2)")
    [[ -n "${ids[0]}" && -n "${ids[1]}" ]] ||
        { cat "$out.submit" >&2; fail "no array and merge job ids in the last line: $line"; }
    [[ "$(scontrol show job -o "${ids[0]}" | head -n 1)" == *"JobName=jem-bench-shards"* ]] ||
        fail "job ${ids[0]} from '$line' is not the shards' array"
    [[ "$(scontrol show job -o "${ids[1]}")" == *"JobName=jem-bench-merge"* ]] ||
        fail "job ${ids[1]} from '$line' is not the merge"
    echo "submitted: $line" >&2
    echo "${ids[0]} ${ids[1]}"
}
same_bytes() { # DIR -> compares its robust.csv and examples.csv with the unsharded sweep's
    local f
    for f in robust.csv examples.csv; do
        [[ -s "$1/$f" ]] || fail "$1/$f is missing"
        cmp "$tmp/whole/$f" "$1/$f" || { diff "$tmp/whole/$f" "$1/$f" | head -n 20 | cut -c1-240 >&2
            fail "$1/$f differs from the unsharded sweep's"; }
        ok "$(basename "$1")/$f equals the unsharded sweep's, byte for byte ($(wc -l < "$1/$f") lines)"
    done
}

# --- 4. sharded through Slurm, then unsharded, compared ---------------------------------------
say "submitting the sweep as $shards shards"
ids="$(submit "$tmp/sharded")"
read -r array merge <<< "$ids"
s="$(wait_job "$merge" 120)"
[[ "$s" == COMPLETED ]] || fail "merge job $merge ended $s"
for i in $(seq 0 $((shards - 1))); do
    s="$(job_state "${array}_$i")"
    [[ "$s" == COMPLETED ]] || fail "array task ${array}_$i ended $s"
done
grep -q "wrote $tmp/sharded" "$tmp/sharded/slurm/logs/merge.log" ||
    fail "the merge's log does not say it wrote $tmp/sharded"
ok "array $array (${shards} tasks) and merge $merge COMPLETED; merge log and OUT/robust.csv there"

say "the same sweep unsharded"
"$bin" "${sweep[@]}" --out "$tmp/whole" > "$tmp/whole.out" 2>&1 ||
    { tail -n 20 "$tmp/whole.out" >&2; fail "the unsharded sweep failed"; }
same_bytes "$tmp/sharded"

# --- 5. one task cancelled mid-shard, then the same command again -----------------------------
say "submitting again, to cancel a task"
ids="$(submit "$tmp/cancelled")"
read -r array merge <<< "$ids"
# The task to cancel: the first seen running with a cell finished (a .json.gz in its cells/) and its
# shard not yet done, so that it is cut mid-shard and its rerun has a finished cell to reuse.
cells_done() { compgen -G "$tmp/cancelled/shards/$1/cells/*.json.gz" | wc -l || true; }
victim="" done_at_cancel=0
for _ in $(seq 1200); do # 120 s
    open=0
    for i in $(seq 0 $((shards - 1))); do
        s="$(job_state "${array}_$i")"
        finished_state "$s" && continue
        open=$((open + 1))
        n="$(cells_done "$i")"
        if [[ "$s" == RUNNING && $n -ge 1 ]] &&
            ! grep -qsE '^ran [0-9]+ cells' "$tmp/cancelled/slurm/logs/shard-$i.log"; then
            victim=$i done_at_cancel=$n
            scancel "${array}_$i"
            break 2
        fi
    done
    ((open)) || break
    sleep 0.1
done
[[ -n "$victim" ]] || fail "no task of array $array was seen running with a cell finished before it ended"
say "cancelled task ${array}_$victim while it ran, $done_at_cancel cell(s) of its shard finished"
for i in $(seq 0 $((shards - 1))); do wait_job "${array}_$i" 120 > /dev/null; done
s="$(job_state "${array}_$victim")"
[[ "$s" == CANCELLED ]] || fail "task ${array}_$victim ended $s, not CANCELLED (it finished before scancel reached it)"
for _ in $(seq 25); do # the scheduler marks the merge's dependency as never satisfied
    [[ "$(scontrol show job -o "$merge")" == *DependencyNeverSatisfied* ]] && break
    sleep 0.2
done
s="$(job_state "$merge")"
[[ "$s" == PENDING ]] || fail "merge $merge is $s after a shard was cancelled, not PENDING"
[[ ! -e "$tmp/cancelled/robust.csv" ]] || fail "a merge ran although a shard was cancelled"
scancel "$merge"
ok "task ${array}_$victim CANCELLED, its merge $merge left pending (then cancelled), nothing merged"

say "the same command again resubmits"
ids="$(submit "$tmp/cancelled")"
read -r array merge <<< "$ids"
s="$(wait_job "$merge" 120)"
[[ "$s" == COMPLETED ]] || fail "merge job $merge of the resubmission ended $s"
# The shards that had finished compute nothing; the cancelled one reuses the cells it finished.
for i in $(seq 0 $((shards - 1))); do
    last="$(grep -E '^ran [0-9]+ cells' "$tmp/cancelled/slurm/logs/shard-$i.log" | tail -n 1 || true)"
    echo "  shard $i: ${last:-(no 'ran … cells' line in its log)}"
    if [[ $i == "$victim" ]]; then
        reused="$(sed -nE 's/^ran [0-9]+ cells \(([0-9]+) were finished already\).*/\1/p' <<< "$last")"
        [[ -n "$reused" && $reused -ge $done_at_cancel ]] ||
            fail "the cancelled shard $i did not reuse the $done_at_cancel cell(s) it had finished: $last"
    else
        [[ "$last" =~ ^ran\ 0\ cells ]] || fail "resubmitted shard $i, finished before, computed cells: $last"
    fi
done
ok "resubmission: finished shards computed nothing, the cancelled one reused its $reused finished cell(s), merge $merge COMPLETED"
same_bytes "$tmp/cancelled"

echo "slurm test: ${SECONDS} s"
echo "slurm: $passed passed, 0 failed"
