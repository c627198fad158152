#!/bin/sh
# mpirun as the tests, the examples' tests and the scripts start it: the one
# place that knows how the Open MPI releases libspmd runs on differ (4.1 on
# Debian 12; 5.0 on Debian 13, whose mpirun runs PRRTE's prterun with Open
# MPI's options).
#
#   mpirun.sh [--mpirun PATH] [--timeout SECONDS] MPIRUN-ARGUMENTS...
#
# runs `timeout -k 10 SECONDS PATH --oversubscribe MPIRUN-ARGUMENTS...`
# (PATH: mpirun from PATH by default; no timeout unless given) with:
#   - root allowed: OMPI_ALLOW_RUN_AS_ROOT and _CONFIRM, which the mpirun
#     of both releases reads (prterun itself would want
#     PRTE_ALLOW_RUN_AS_ROOT, but 5.0's mpirun passes Open MPI's on);
#   - more processes than cores: --oversubscribe, which both take (5.0's
#     own spelling is --map-by :OVERSUBSCRIBE; 5.0.7 takes the old one
#     silently, and ignores OMPI_MCA_rmaps_base_oversubscribe);
#   - no InfiniBand probing: OMPI_MCA_btl=^openib (4.1's openib; 5.0 has
#     none, and takes the exclusion silently);
#   - the TCP transport over IPv4 only: OMPI_MCA_btl_tcp_disable_family=6.
#     On a host with IPv4 and IPv6 addresses 5.0.7's TCP transport prints
#     "Unable to find reachable pairing between local and remote
#     interfaces" on stderr for each process pair, even on one host
#     where the processes talk through shared memory (harmless, but noise
#     in every test's output); 4.1 pairs IPv4 as well;
#   - no leak checks in a sanitizer build (ASAN_OPTIONS detect_leaks=0):
#     Open MPI leaves its allocations to the exit.
# A variable the caller set wins over these defaults, and an --mca on the
# command line wins over an OMPI_MCA_ variable (multihost.sh's
# `--mca btl tcp,self`).  The exit status is mpirun's, or the timeout's:
# 124 (137 when mpirun outlived the SIGTERM by 10 s and was killed; 137 is
# also mpirun's status when a process of the job was killed by SIGKILL).
#
# What the releases do differently and no option hides (see
# docs/processes.md):
#   - Debian 13's mpirun 5.0.7 crashes (SIGSEGV, before starting anything)
#     on a colon-separated MPMD launch (`-n 1 A : -n 1 B`; Open MPI issue
#     13303): test_cli_agree starts its two command lines by rank instead;
#   - 5.0.7 exits 0 when it loses a host's daemon (a host killed, a link
#     down), having ended the job; 4.1 exits non-zero (multihost.sh).
set -eu

mpirun=mpirun
limit=
while [ $# -gt 0 ]; do
  case $1 in
    --mpirun) mpirun=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: mpirun.sh [--mpirun PATH] [--timeout SECONDS] MPIRUN-ARGUMENTS..." >&2; exit 2; }

export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT-1}"
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM-1}"
export OMPI_MCA_btl="${OMPI_MCA_btl-^openib}"
export OMPI_MCA_btl_tcp_disable_family="${OMPI_MCA_btl_tcp_disable_family-6}"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

if [ -n "$limit" ]; then
  exec timeout -k 10 "$limit" "$mpirun" --oversubscribe "$@"
fi
exec "$mpirun" --oversubscribe "$@"
