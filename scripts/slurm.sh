#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for the tests (docs/slurm-testing.md).
#
#   scripts/slurm.sh up DIR     install slurm-wlm + munge if missing, write DIR/slurm.conf, start
#                               munged, slurmctld and two slurmd (nodes n1, n2), wait until both
#                               nodes are idle; idempotent (a cluster already up in DIR is kept)
#   scripts/slurm.sh down DIR   cancel every job, stop every daemon started for DIR, and every
#                               process left of a job of this cluster; idempotent
#   scripts/slurm.sh env DIR    print the environment a client needs, for eval: export SLURM_CONF=...
#
# Everything lives under DIR: the config, the munge key and socket, state, spool, logs, pids.
# Clients find the cluster with SLURM_CONF=DIR/slurm.conf (the munge socket is in its AuthInfo).
# Ports: SLURM_TEST_PORT (default 16817) for slurmctld, +1 and +2 for the slurmd of n1 and n2.
# Run as root (slurmd runs jobs as their user; here every job is root's).
set -euo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH  # the daemons are in sbin

usage() { echo "usage: $0 up|down|env DIR" >&2; exit 2; }
(($# == 2)) || usage
cmd=$1
if [[ $cmd == down && ! -d $2 ]]; then exit 0; fi
mkdir -p "$2"
DIR=$(cd "$2" && pwd -P)
CONF=$DIR/slurm.conf
SOCKET=$DIR/munge/munge.socket.2
# every daemon we start carries this variable; `down` finds them (and their slurmstepd) by it
MARK="MT_SLURM_CLUSTER=$DIR"
export SLURM_CONF=$CONF
unset SLURM_JOB_ID  # this script's own processes are never taken for a job's
NODES=(n1 n2)

log() { echo "slurm.sh: $*" >&2; }

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sinfo >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    ((${#missing[@]})) || return 0
    log "installing ${missing[*]}"
    # a package's postinst must not start a system daemon (no systemd here: invoke-rc.d would run
    # the init.d scripts): deny it for the install, as Docker images do, unless a policy is there
    local policy=/usr/sbin/policy-rc.d ours=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && ours=1
    fi
    local rc=0
    {
        # (wait for another apt-get on this machine rather than fail)
        apt-get -o DPkg::Lock::Timeout=300 update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
                --no-install-recommends slurm-wlm slurmctld slurmd slurm-client munge
    } >"$DIR/log/install.log" 2>&1 || rc=$?
    ((ours)) && rm -f "$policy"
    if ((rc)); then
        tail -20 "$DIR/log/install.log" >&2
        log "apt-get failed ($rc)"
        exit 1
    fi
}

write_conf() {
    local host port cpus
    host=$(hostname -s)
    port=${SLURM_TEST_PORT:-16817}
    # each slurmd sees the whole machine, and says so: CPUs = its cores (SLURM_TEST_CPUS to change).
    # A task asks 1 CPU by default: `srun -N2` runs one task on each node, and on 2 cores two such
    # jobs run at once (or one with --ntasks-per-node=2)
    cpus=${SLURM_TEST_CPUS:-$(nproc)}
    cat >"$CONF" <<EOF
# written by scripts/slurm.sh for a test cluster in $DIR
ClusterName=mt-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmUser=root
SlurmdUser=root
# munge on a socket of our own. cred_expire: how long a launch credential lives (a slurmd must get
# the launch within it), and so how long a requeued job waits before it may start again: 120 s by
# default, cred_expire + 1 s here (5 is the least Slurm takes; 10 leaves room on a loaded machine)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET,cred_expire=${SLURM_TEST_CRED_EXPIRE:-10}
# no cgroups, no systemd in a container: processes tracked by their parent pids, no task binding
ProctrackType=${SLURM_TEST_PROCTRACK:-proctrack/linuxproc}
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
PropagateResourceLimits=NONE
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
JobRequeue=1
# job ids from SLURM_TEST_FIRST_JOB_ID: two test clusters on one machine would otherwise both run job 1,
# and a job's rendezvous port is derived from its id (tui/cluster/slurm.py rendezvous_port)
FirstJobId=${SLURM_TEST_FIRST_JOB_ID:-1}
# short timeouts: finished jobs leave squeue after 5 s; a step gets 2 s between SIGTERM and SIGKILL
MinJobAge=5
KillWait=2
InactiveLimit=0
WaitTime=0
MessageTimeout=20
SlurmdTimeout=120
SlurmctldTimeout=30
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# the nodes report what this file says, not what they detect (SLURM_TEST_CPUS may say more)
SlurmdParameters=config_overrides
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 1)) CPUs=$cpus State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 2)) CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
}

alive() {  # alive PIDFILE: the pid in it runs
    local pid
    [[ -s $1 ]] && pid=$(<"$1") && [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

start() {  # start NAME CMD...: CMD in the background, in its own session, pid in DIR/run/NAME.pid
    local name=$1
    shift
    STARTED+=("$name")
    if alive "$DIR/run/$name.pid"; then return 0; fi
    FRESH=1
    env "$MARK" setsid "$@" </dev/null >>"$DIR/log/$name.out" 2>&1 &
    echo $! >"$DIR/run/$name.pid"
}
STARTED=()
FRESH=0  # this `up` started a daemon (a failed `up` stops the cluster only then)

wait_for() {  # wait_for SECONDS WHAT CMD...: until CMD succeeds; fails when a daemon has died
    local limit=$1 what=$2 t0=$SECONDS name dead=
    shift 2
    until "$@" >/dev/null 2>&1; do
        for name in "${STARTED[@]}"; do alive "$DIR/run/$name.pid" || dead=$name; done
        if [[ -n $dead ]] || ((SECONDS - t0 > limit)); then
            if [[ -n $dead ]]; then
                log "$dead exited while waiting for $what; logs in $DIR/log:"
            else
                log "timed out after ${limit}s waiting for $what; logs in $DIR/log:"
            fi
            tail -n 15 "$DIR"/log/*.log "$DIR"/log/*.out >&2 2>/dev/null || true
            return 1
        fi
        sleep 0.5
    done
}

nodes_up() {  # both nodes responding and taking jobs: idle on a fresh start; with jobs, mixed or allocated
    local states
    states=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u) || return 1
    [[ $states =~ ^n1\ (idle|mixed|allocated|completing)$'\n'n2\ (idle|mixed|allocated|completing)$ ]]
}

up() {
    if ((EUID != 0)); then log "needs root (it installs packages; slurmd runs jobs as their user)"; exit 1; fi
    if ((${#SOCKET} > 100)); then log "DIR is too long for a unix socket path: $SOCKET"; exit 1; fi
    mkdir -p "$DIR"/{log,run,state,munge} "$DIR"/spool/{n1,n2}
    install_packages
    # clients need to reach the socket in DIR/munge; the key file itself is root's only
    chmod 755 "$DIR/munge"
    if [[ ! -s $DIR/munge/munge.key ]]; then
        dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    fi
    chmod 600 "$DIR/munge/munge.key"
    write_conf
    # munged refuses root without --force; everything of it in DIR/munge
    start munged munged --foreground --force --socket="$SOCKET" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed"
    wait_for 30 munged test -S "$SOCKET"
    start slurmctld slurmctld -D -f "$CONF"
    wait_for 60 slurmctld scontrol ping
    local n
    for n in "${NODES[@]}"; do
        start "slurmd-$n" slurmd -D -f "$CONF" -N "$n"
    done
    wait_for 90 "nodes n1 and n2 up" nodes_up
}

marked() {  # the pids of processes carrying MARK (daemons, their slurmstepd), or of a job of this cluster
    local f pid
    {
        grep -lzxF "$MARK" /proc/[0-9]*/environ
        for f in $(grep -lzxF "SLURM_CONF=$CONF" /proc/[0-9]*/environ); do
            if grep -qz '^SLURM_JOB_ID=' "$f"; then echo "$f"; fi
        done
    } 2>/dev/null | while IFS=/ read -r _ _ pid _; do
        if [[ $pid != "$$" && $pid != "$BASHPID" ]]; then echo "$pid"; fi
    done | sort -un
    return 0  # (grep finds nothing, or a process is gone: not an error)
}

running() {  # those of the pids that still run (a zombie does not; a dying process still does)
    local pid state
    for pid in "$@"; do
        state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || continue
        if [[ -n $state && $state != Z && $state != X ]]; then echo "$pid"; fi
    done
    return 0
}

down() {
    [[ -d $DIR/run ]] || return 0
    if alive "$DIR/run/slurmctld.pid"; then
        # cancel every job and give the nodes a moment to end their steps
        scancel --quiet --full --user=root 2>/dev/null || true
        local t0=$SECONDS
        # (finished jobs stay in squeue for MinJobAge: wait only for those still live)
        while ((SECONDS - t0 < 15)) && [[ -n $(squeue -h -t PD,CF,R,S,CG,RQ,RS,SO -o %i 2>/dev/null) ]]; do sleep 0.3; done
    fi
    # slurmd first (its steps are ended by the cancel), then slurmctld, munged last
    local name pid
    for name in slurmd-n1 slurmd-n2 slurmctld munged; do
        if alive "$DIR/run/$name.pid"; then kill -TERM "$(<"$DIR/run/$name.pid")" 2>/dev/null || true; fi
    done
    local t0=$SECONDS
    while ((SECONDS - t0 < 15)); do
        local left=0
        for name in slurmd-n1 slurmd-n2 slurmctld munged; do
            alive "$DIR/run/$name.pid" && left=1
        done
        ((left)) || break
        sleep 0.3
    done
    # whatever is left (a daemon stuck, a slurmstepd or a job's process): SIGKILL, by pid
    local pids
    pids=$(marked)
    if [[ -n $pids ]]; then
        log "killing what is left: $(echo $pids)"
        for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
        t0=$SECONDS
        while ((SECONDS - t0 < 10)) && [[ -n $(running $pids) ]]; do sleep 0.3; done
    fi
    rm -f "$DIR"/run/*.pid
    pids="$(running $pids) $(marked)"
    if [[ -n ${pids// /} ]]; then
        log "still running: $(echo $pids)"
        return 1
    fi
}

case $cmd in
    up)
        # a failed start stops what it started (the logs stay in DIR/log)
        ok=0
        trap '((ok || !FRESH)) || { log "up failed; stopping the cluster"; down || true; }' EXIT
        up
        ok=1
        ;;
    down) down ;;
    env) printf 'export SLURM_CONF=%q\n' "$CONF" ;;   # eval "$(scripts/slurm.sh env DIR)" sets it in a shell
    *) usage ;;
esac
