#!/bin/sh
# The "remote shell" through which Open MPI reaches the simulated hosts of
# tests/cli/multihost/multihost.sh (mpirun --mca plm_rsh_agent THIS).  A host
# is a network namespace; its name is the "hostname" in the hostfile, so
# this plays ssh: Open MPI calls it as `rsh-agent.sh HOST COMMAND-LINE...`
# (its daemon, orted, with arguments quoted for a remote shell) and it
# runs that line with sh inside the namespace, as sshd would.
#
# Each host also gets its own UTS namespace whose hostname is the
# namespace's name: Open MPI then sees four differently named nodes (its
# session directories in the shared /tmp stay apart, and mpirun recognises
# the host it runs on as the hostfile's first one rather than a fifth).
#
#   rsh-agent.sh HOST COMMAND-LINE...        as ssh: the words joined, run by sh
#   rsh-agent.sh --exec HOST PROGRAM ARG...  the program itself, arguments kept
#                                            (how the test starts mpirun in a host)
set -eu
if [ "$1" = --exec ]; then
  host=$2
  shift 2
  exec ip netns exec "$host" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
fi
host=$1
shift
exec ip netns exec "$host" unshare --uts /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$*"' "$host" "$@"
