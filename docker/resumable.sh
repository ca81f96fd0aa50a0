#!/bin/bash
# Runs a training launch so that the signal a cluster stops it with reaches
# every rank with time to checkpoint, and exits with the launch's status
# (200: preempted, start again with --resume; 1: failure; 2: usage error).
#   docker/resumable.sh horovodrun ... --mpi hvdtrain train ... --resume
# A shell that goes on after the launch (Slurm's batch script, the only
# process `--signal=B:...` reaches) sources it, for the traps to be its own:
#   source docker/resumable.sh; resumable horovodrun ... || status=$?
#
# SIGTERM, SIGINT or SIGUSR1 goes on as
# - SIGUSR1 to mpirun under `horovodrun --mpi` (its child; Horovod as
#   released replaces itself with `sh -c "mpirun ..."`): mpirun passes
#   SIGUSR1 to every rank on every host and exits with their status.
#   Not SIGTERM: mpirun kills the ranks 1 s after it.
# - SIGTERM to the launcher otherwise: `horovodrun --gloo` passes it to
#   every worker (and kills them 30 s later); a lone `hvdtrain train` takes
#   it itself; `horovodrun --mpi` still starting, before any rank, dies.
# A second signal is only logged: the ranks are stopping already.

_resumable_launcher=""
_resumable_forwarded=""

# The signal and pid to pass a stop to: mpirun's if it is the launcher or
# the launcher shell's child, else the launcher's.
_resumable_target() {
    local stat pid comm state ppid
    if [[ $(cat "/proc/$1/comm" 2>/dev/null) == mpirun ]]; then
        echo "USR1 $1"
        return
    fi
    for stat in /proc/[0-9]*/stat; do
        read -r pid comm state ppid _ 2>/dev/null <"$stat" || continue
        if [[ $ppid == "$1" && $comm == "(mpirun)" ]]; then
            echo "USR1 $pid"
            return
        fi
    done
    echo "TERM $1"
}

# The trap of signal $1.
_resumable_stop() {
    if [[ -n $_resumable_forwarded ]]; then
        echo "resumable.sh: SIG$1 again: not passed on, $_resumable_forwarded already" >&2
    else
        local signal pid
        read -r signal pid < <(_resumable_target "$_resumable_launcher")
        _resumable_forwarded="SIG$signal to $(cat "/proc/$pid/comm" 2>/dev/null) (pid $pid)"
        kill -s "$signal" "$pid" 2>/dev/null
        echo "resumable.sh: SIG$1: passed on as $_resumable_forwarded" >&2
    fi
}

# Runs the command "$@" in the background, passes a stop on to it, and
# returns its status.
resumable() {
    # In a process group of its own (-m), for a terminal's Ctrl-C to reach
    # this shell only: SIGINT to mpirun kills the ranks 1 s later.
    local -
    set -m
    "$@" &
    _resumable_launcher=$!
    set +m
    local signal
    # `|| true`: under `set -e` a trap that fails ends the shell.
    for signal in TERM INT USR1; do
        trap "_resumable_stop $signal || true" "$signal"
    done
    # A trap interrupts wait: wait again while the launcher runs, then once
    # more for its status, which the shell keeps.
    while kill -0 "$_resumable_launcher" 2>/dev/null; do
        wait "$_resumable_launcher" || true
    done
    wait "$_resumable_launcher"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    resumable "$@"
fi
