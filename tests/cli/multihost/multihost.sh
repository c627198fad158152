#!/usr/bin/env bash
# `spmd` over several hosts, simulated on this one machine (CTest's
# test_multihost).
#
#   multihost.sh SPMD SPMD_TEST MPIRUN
#
# SPMD is the tool, SPMD_TEST the tool built with the test hooks
# (tools/test_hooks.h), MPIRUN Open MPI's mpirun.
#
# A host is a network namespace (its own interfaces, addresses and TCP
# stack) with its own hostname (a UTS namespace); the hosts' eth0 ends of
# veth pairs meet on a Linux bridge in a namespace of its own, one subnet
# for all.  The file system is shared, as a cluster's shared file system
# would be.  mpirun runs inside the first host and starts its daemons in
# the others through tests/cli/multihost/rsh-agent.sh, which plays ssh; the
# processes talk over TCP only (pml ob1, btl tcp,self), on the hosts'
# subnet, so every message between hosts crosses a veth and the bridge.
# Nothing is made in the machine's own network namespace.
#
# The cases:
#   1. the same bits: 12 steps of a small GPT on 4x2 over 2 hosts (one
#      process each, then two) and over 4 hosts give the one-process
#      losses bit for bit;
#   2. pipeline stages over hosts: a GPT on 2 stages x 2 data over 2 hosts
#      and on 4 stages over 4, one process (one stage) a host, so every
#      stage transfer crosses the bridge: 12 steps give the one-process
#      losses bit for bit, and explain over the same hosts has 'pp' the
#      axis across processes and no collective spanning it;
#   3. a stage's host stalled (its processes stopped, SIGSTOP, mid-run;
#      2 stages over 2 hosts): the neighbour stage's watchdog
#      (--collective-timeout) ends the job, naming the stage transfer it
#      waited in and the host it waited for (or the step's gather over
#      every process, where the stall met it there), within the
#      watchdog's bound plus BOUND;
#   4. a host killed mid-run (every process in its namespace, kill -9):
#      the job ends, non-zero (Open MPI 5.0.7's mpirun exits 0 there,
#      saying it lost the host: see ended_well), well inside its timeout;
#   5. a host killed mid-save (the save of step 8 paused by spmd-test's
#      hook on that host, after one of its files): `latest` still names
#      step 4, and --resume continues with the uninterrupted run's losses,
#      bit for bit, removing what the killed save left;
#   6. a link taken down mid-run (the bridge's end of a host's veth, of 4),
#      the job started by `spmd launch`, every host with Linux's default
#      TCP settings: the collective watchdog (--collective-timeout) ends
#      the job with its message naming the host, within the watchdog's
#      bound plus 60 s (the launcher ends an mpirun that waits for the
#      unreachable daemon), the other hosts' processes end with it, and
#      the host cut off ends its own processes; skipped, saying so, by a
#      tool without that flag.
# Each case prints what it measured (seconds from the kill or the link
# going down to the job's end).
#
# Exit status: 0 when every case passed (or was skipped, saying why), 1
# when one failed, 77 (CTest's SKIP_RETURN_CODE) when hosts cannot be made
# here: not root, no iproute2, or the kernel refuses namespaces, veth pairs
# or bridges.  Everything made (namespaces, and with them their veths and
# the bridge; the temporary directory) is removed on every exit, and a run
# killed outright (no trap runs on SIGKILL) has its leftovers removed by
# the next run: every name carries the pid of the run that made it.
set -uo pipefail

if [ $# -ne 3 ]; then
  echo "usage: $0 SPMD SPMD_TEST MPIRUN" >&2
  exit 2
fi
SPMD=$1
SPMD_TEST=$2
MPIRUN=$3
case $0 in */*) HERE=${0%/*} ;; *) HERE=. ;; esac
AGENT=$(cd "$HERE" && pwd)/rsh-agent.sh
# mpirun as every test starts it (root allowed, oversubscribed, the
# warnings of Open MPI 4.1 and 5.0 kept alike): scripts/mpirun.sh.
MPIRUN_SH=$(cd "$HERE/../../.." && pwd)/scripts/mpirun.sh
SKIP=77

say() { printf 'multihost: %s\n' "$*"; }
skip() {
  say "skipped: $*"
  exit $SKIP
}

# ---- What the hosts need ---------------------------------------------------------------
[ "$(id -u)" = 0 ] || skip "making network namespaces needs root (uid $(id -u))"
for tool in ip unshare hostname timeout; do
  command -v $tool >/dev/null || skip "no '$tool' command (ip: iproute2; unshare, hostname: util-linux)"
done
[ -x "$MPIRUN" ] || skip "no mpirun at '$MPIRUN'"
for tool in "$SPMD" "$SPMD_TEST"; do
  [ -x "$tool" ] || { say "FAIL: no tool at '$tool'"; exit 1; }
done

# ---- Names, all of them this run's -----------------------------------------------------
PREFIX=spmd-mh
ID=$PREFIX-$$
BRIDGE_NS=$ID-br
HOSTS=("$ID-h0" "$ID-h1" "$ID-h2" "$ID-h3")
SUBNET=10.123.0.0/24 # inside the namespaces only: no clash with the machine's networks
TMP=

# Kill whatever still runs in namespace $1, then remove it (its veth ends
# and bridge go with it).  A namespace's name can be removed while its
# processes live; the kill comes first so that none outlives the test.
drop_ns() {
  ip netns pids "$1" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$1" 2>/dev/null
}

cleanup() {
  local ns
  for ns in "${HOSTS[@]}" "$BRIDGE_NS"; do
    [ -e "/run/netns/$ns" ] && drop_ns "$ns"
  done
  [ -n "$TMP" ] && rm -rf "$TMP"
}
trap cleanup EXIT
# A signal exits through the EXIT trap (a timeout's SIGTERM included).
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Leftovers of runs that were killed outright: namespaces named after a pid
# that no longer runs.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
  case $ns in
    "$PREFIX"-*-*)
      pid=${ns#"$PREFIX"-}
      pid=${pid%%-*}
      if [[ $pid =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2>/dev/null; then
        say "removing namespace $ns, left by run $pid"
        drop_ns "$ns"
      fi
      ;;
  esac
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/spmd-multihost-$$-XXXXXX") || { say "FAIL: no temporary directory"; exit 1; }

# ---- The hosts ---------------------------------------------------------------------------
# A step that fails here is this machine's limit, not the library's: skip.
setup() {
  local out
  out=$("$@" 2>&1) || skip "cannot make the hosts: '$*' failed: $out"
}
setup ip netns add "$BRIDGE_NS"
setup ip -n "$BRIDGE_NS" link set lo up
setup ip -n "$BRIDGE_NS" link add br0 type bridge
setup ip -n "$BRIDGE_NS" link set br0 up
for i in "${!HOSTS[@]}"; do
  h=${HOSTS[$i]}
  setup ip netns add "$h"
  # Loopback up: a host's processes reach each other and their daemon.
  setup ip -n "$h" link set lo up
  # The pair is made in the bridge's namespace, its other end moved into
  # the host as eth0: v$i is the host's cable, plugged into the bridge.
  setup ip -n "$BRIDGE_NS" link add "v$i" type veth peer name eth0 netns "$h"
  setup ip -n "$BRIDGE_NS" link set "v$i" master br0 up
  setup ip -n "$h" addr add "10.123.0.$((i + 1))/24" dev eth0
  setup ip -n "$h" link set eth0 up
  # Each namespace keeps Linux's default TCP settings (tcp_retries2 15: a
  # connection whose peer stopped answering fails after about 15 minutes),
  # as a user's hosts would: case 6 holds through `spmd launch`.
done

printf '%s slots=1\n' "${HOSTS[0]}" "${HOSTS[1]}" >"$TMP/hosts2"
printf '%s slots=2\n' "${HOSTS[0]}" "${HOSTS[1]}" >"$TMP/hosts2x2"
printf '%s slots=1\n' "${HOSTS[@]}" >"$TMP/hosts4"

LIMIT=120 # seconds any one mpirun may take (each here takes a few to about 20)

# mpi HOSTFILE NPROCS ARGS...: mpirun inside the first host, under a
# timeout (and a kill 5 s later if the timeout's SIGTERM is not enough),
# through scripts/mpirun.sh (root allowed, oversubscribed, no leak checks
# in a sanitizer build: Open MPI leaves its allocations to the exit).
# The hostfile's slots place processes 0, 1, ... on its first host first
# (--map-by slot), so a host holds consecutive mesh positions.  Open MPI's
# daemons are started through the agent (--mca plm_rsh_agent: 5.0's
# PRRTE calls it plm_ssh_agent, and its mpirun takes the old name); the
# processes are not bound to cores (the hosts share two).
mpi() {
  local hosts=$1 n=$2
  shift 2
  timeout -k 5 $LIMIT "$AGENT" --exec "${HOSTS[0]}" sh "$MPIRUN_SH" --mpirun "$MPIRUN" \
    --hostfile "$hosts" -n "$n" --map-by slot --bind-to none \
    --mca plm_rsh_agent "$AGENT" \
    --mca pml ob1 --mca btl tcp,self \
    --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET" \
    "$@"
}

# launch HOSTFILE COMMAND...: `spmd launch` inside the first host, as
# mpi() runs mpirun (the same environment as scripts/mpirun.sh gives it,
# the same transport and agent), under the same timeout.
launch() {
  local hosts=$1
  shift
  timeout -k 5 $LIMIT "$AGENT" --exec "${HOSTS[0]}" env OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_disable_family=6 ASAN_OPTIONS=detect_leaks=0 \
    "$SPMD" launch --mpirun "$MPIRUN" --hosts "$hosts" --subnet "$SUBNET" \
    --mca plm_rsh_agent="$AGENT" --mca pml=ob1 --mca btl=tcp,self -- "$@"
}

now_ms() { date +%s%3N; }
seconds() { awk -v ms="$1" 'BEGIN { printf "%.1f", ms / 1000 }'; }

# wait_for PATTERN FILE PID SECONDS: until FILE holds PATTERN (0), or PID
# has ended or SECONDS have passed (1).
wait_for() {
  local i
  for ((i = 0; i < $4 * 10; i++)); do
    grep -q -- "$1" "$2" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { grep -q -- "$1" "$2" 2>/dev/null; return; }
    sleep 0.1
  done
  return 1
}

# The losses of report $1, one a line, as cJSON printed them: text that
# reads back as the same double (15 digits, else 17), so equal text is
# equal bits.
losses() {
  sed -n 's/^\t"loss":\t\[\(.*\)\],\{0,1\}$/\1/p' "$1" | tr -d ' ' | tr ',' '\n'
}

# same_losses WANT GOT WHAT: the two lists of losses (files) equal, else
# say where they first differ.
same_losses() {
  if [ ! -s "$1" ] || ! cmp -s "$1" "$2"; then
    say "  $3: the losses differ (left: expected, right: got)"
    diff "$1" "$2" | head -5 | sed 's/^/    /'
    return 1
  fi
}

# show FILE: the tail of a run's output, for a failure's message.
show() { tail -n 15 "$1" | sed 's/^/    | /'; }

# shellcheck disable=SC2054 # replica,fsdp is one word
FLAGS=(--mesh 4x2 --axes replica,fsdp --eval 0 --batch 16 --seq 24 --dim 32 --heads 2)
STEPS=12

# The one-process run every comparison is with (made once).
reference() {
  [ -s "$TMP/one.loss" ] && return 0
  if ! "$SPMD" train "${FLAGS[@]}" --steps $STEPS --threads 8 --json "$TMP/one.json" \
    >"$TMP/one.txt" 2>&1; then
    say "  the one-process run failed:"
    show "$TMP/one.txt"
    return 1
  fi
  losses "$TMP/one.json" >"$TMP/one.loss"
  [ "$(wc -l <"$TMP/one.loss")" = $STEPS ] || { say "  no $STEPS losses in the one-process report"; return 1; }
}

# ---- The hosts work: each process on its own host ----------------------------------------
hosts_are_apart() {
  # Only the processes' lines: Open MPI may warn on stderr (its rsh
  # launcher's setpgid racing the agent's exec, harmless).
  local out
  out=$(mpi "$TMP/hosts4" 4 sh -c 'echo "$(hostname) $(readlink /proc/self/ns/net)"' 2>"$TMP/apart.err")
  local names nets
  names=$(printf '%s\n' "$out" | awk '{print $1}' | sort -u | wc -l)
  nets=$(printf '%s\n' "$out" | awk '{print $2}' | sort -u | wc -l)
  if [ "$names" != 4 ] || [ "$nets" != 4 ]; then
    say "  4 processes over 4 hosts did not run on 4 hosts:"
    printf '%s\n' "$out" | sed 's/^/    | /'
    show "$TMP/apart.err"
    return 1
  fi
}

# ---- 1. The same bits as one process -----------------------------------------------------
case_same_bits() {
  reference || return 1
  local layout hosts n threads
  for layout in "2 hosts x 1 process:hosts2:2:4" "2 hosts x 2 processes:hosts2x2:4:2" \
    "4 hosts x 1 process:hosts4:4:2"; do
    IFS=: read -r what hosts n threads <<<"$layout"
    local report=$TMP/bits-$hosts.json
    if ! mpi "$TMP/$hosts" "$n" "$SPMD" train "${FLAGS[@]}" --steps $STEPS --threads "$threads" \
      --json "$report" >"$TMP/bits-$hosts.txt" 2>&1; then
      say "  $what: the run failed:"
      show "$TMP/bits-$hosts.txt"
      return 1
    fi
    losses "$report" >"$TMP/bits-$hosts.loss"
    same_losses "$TMP/one.loss" "$TMP/bits-$hosts.loss" "$what" || return 1
    # The report lists every process: the run was the one asked for.
    local procs
    procs=$(grep -c '"rank":' "$report")
    [ "$procs" = "$n" ] || { say "  $what: the report lists $procs processes"; return 1; }
    say "  $what: $STEPS losses equal the one-process run's, bit for bit"
  done
}

# ---- 2. Pipeline stages over hosts ------------------------------------------------------
STAGE_FLAGS=(--eval 0 --batch 4 --seq 24 --dim 32 --heads 2 --layers 4 --pp pp --microbatches 4
  --threads 1 --steps $STEPS)
case_stages() {
  local layout what hosts n mesh axes
  # Mesh positions are process-major, the stage axis first: each host's
  # process holds one stage (its data replicas with it).
  for layout in "2 stages x 2 data over 2 hosts:hosts2:2:2x2:pp,data" \
    "4 stages over 4 hosts:hosts4:4:4:pp"; do
    IFS=: read -r what hosts n mesh axes <<<"$layout"
    local one=$TMP/stages-$mesh-one many=$TMP/stages-$mesh-$hosts
    if ! "$SPMD" train --mesh "$mesh" --axes "$axes" "${STAGE_FLAGS[@]}" --json "$one.json" \
      >"$one.txt" 2>&1; then
      say "  $what: the one-process run failed:"
      show "$one.txt"
      return 1
    fi
    if ! mpi "$TMP/$hosts" "$n" "$SPMD" train --mesh "$mesh" --axes "$axes" "${STAGE_FLAGS[@]}" \
      --json "$many.json" >"$many.txt" 2>&1; then
      say "  $what: the run failed:"
      show "$many.txt"
      return 1
    fi
    losses "$one.json" >"$one.loss"
    losses "$many.json" >"$many.loss"
    if [ "$(wc -l <"$one.loss")" != $STEPS ]; then
      say "  $what: no $STEPS losses in the one-process report"
      return 1
    fi
    same_losses "$one.loss" "$many.loss" "$what" || return 1
    local procs
    procs=$(grep -c '"rank":' "$many.json")
    [ "$procs" = "$n" ] || { say "  $what: the report lists $procs processes"; return 1; }
    # explain over the same hosts: the stage axis is the one across
    # processes, and only the stage transfers cross it.
    if ! mpi "$TMP/$hosts" "$n" "$SPMD" explain --mesh "$mesh" --axes "$axes" "${STAGE_FLAGS[@]}" \
      >"$many.explain" 2>&1; then
      say "  $what: explain failed:"
      show "$many.explain"
      return 1
    fi
    if ! grep -aq "across processes: pp" "$many.explain" ||
      ! grep -aq "nothing else crosses: no collective spans it" "$many.explain"; then
      say "  $what: explain does not put each stage on its own host, or a collective spans 'pp':"
      grep -a -e "^processes:" -e "^stage transfers" "$many.explain" | sed 's/^/    | /'
      return 1
    fi
    say "  $what: $STEPS losses equal the one-process run's, bit for bit; only the stage transfers" \
      "cross between hosts: $(grep -a "stage 0 to stage 1:" "$many.explain" | sed 's/^ *//')"
  done
}

# run_until_end JOB: wait for background job JOB; sets RC (its exit
# status) and ENDED_MS (when it ended).
run_until_end() {
  wait "$1"
  RC=$?
  ENDED_MS=$(now_ms)
}

# ended_well WHAT LOG: the job ended on its own (not by its timeout),
# non-zero.  Open MPI 5.0.7's mpirun (PRRTE) exits 0 when it loses a host's
# daemon, having ended the job and said so on stderr ("PRTE has lost
# communication with a remote daemon"); 4.1's exits non-zero.  That 0 is
# taken for the end it is, saying so.
ended_well() {
  if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
    say "  $1: the job did not end: killed by its ${LIMIT} s timeout"
    return 1
  fi
  if [ "$RC" = 0 ]; then
    if grep -q 'PRTE has lost communication with a remote daemon' "$2"; then
      say "  $1: mpirun exited 0 after losing a host's daemon (Open MPI 5's PRRTE does)"
      return 0
    fi
    say "  $1: the job exited 0"
    return 1
  fi
}

BOUND=30 # seconds from a host's death to the job's end

# ---- 3. A stage's host stalled: its neighbour's watchdog ----------------------------------
STALL_WATCHDOG_S=3
case_stage_stalled() {
  local log=$TMP/stage-stalled.txt
  mpi "$TMP/hosts2" 2 "$SPMD" train --mesh 2 --axes pp --eval 0 --batch 4 --seq 24 --dim 32 \
    --heads 2 --layers 2 --pp pp --microbatches 2 --threads 1 --steps 1000000 --log-every 1 \
    --collective-timeout $STALL_WATCHDOG_S >"$log" 2>&1 &
  local job=$!
  if ! wait_for 'ms/step' "$log" $job 60; then
    say "  no progress line:"
    show "$log"
    return 1
  fi
  # Host 1's spmd process (stage 1) stops as a hung host's would; its
  # daemon stays, so the abort can end it.
  local t0 pid
  t0=$(now_ms)
  for pid in $(ip netns pids "${HOSTS[1]}"); do
    [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$SPMD")" ] && kill -STOP "$pid"
  done
  run_until_end $job
  ended_well "stage 1 stalled" "$log" || { show "$log"; return 1; }
  # The stall meets stage 0 in a stage transfer (the watchdog names it
  # and the process and host it waits for) or, as often on this small
  # shape, in the step's gather over every process that reads the loss
  # from the last stage (a collective over all, which cannot say which
  # one is missing: it names the one waiting).
  local why
  why=$(grep -a -E 'collective timeout: (stage_transfer from stage |a gather over the 2 processes)' \
    "$log" | head -1)
  if [ -z "$why" ] || [[ $why != *"process 0: step "*" failed: "* ]] ||
    { [[ $why == *stage_transfer* ]] && [[ $why != *"without progress for process 1 on ${HOSTS[1]}"* ]]; } ||
    { [[ $why != *stage_transfer* ]] && [[ $why != *"process 0 on ${HOSTS[0]} waited"* ]]; }; then
    say "  no watchdog message naming the stage transfer and ${HOSTS[1]}, or the gather:"
    show "$log"
    return 1
  fi
  local took=$((ENDED_MS - t0))
  say "  stage 1's host stalled: the job ended $(seconds $took) s later, exit $RC:"
  say "    ${why#*failed: }"
  if ((took > (STALL_WATCHDOG_S + BOUND) * 1000)); then
    say "  that is past the bound of $((STALL_WATCHDOG_S + BOUND)) s"
    return 1
  fi
}

# ---- 4. A host killed mid-run --------------------------------------------------------------
case_host_killed() {
  local log=$TMP/killed.txt
  mpi "$TMP/hosts2" 2 "$SPMD" train "${FLAGS[@]}" --steps 1000000 --log-every 1 --threads 4 \
    >"$log" 2>&1 &
  local job=$!
  if ! wait_for 'ms/step' "$log" $job 60; then
    say "  no progress line:"
    show "$log"
    return 1
  fi
  local t0
  t0=$(now_ms)
  ip netns pids "${HOSTS[1]}" | xargs -r kill -9
  run_until_end $job
  ended_well "host 1 killed" "$log" || { show "$log"; return 1; }
  local took=$((ENDED_MS - t0))
  say "  host 1 killed mid-run: the job ended $(seconds $took) s later, exit $RC"
  if ((took > BOUND * 1000)); then
    say "  that is past the bound of $BOUND s"
    return 1
  fi
}

# ---- 5. A host killed mid-save, then resumed ---------------------------------------------
case_killed_save() {
  reference || return 1
  local ck=$TMP/ckpt log=$TMP/save-killed.txt
  # Process 1 (host 1; mesh positions 4-7) writes dev-0004..0007: its save
  # of step 8 stops after dev-0004, the hook says so and waits; process 0
  # waits for it.  The hook's variable reaches the processes through -x.
  SPMD_TEST_SAVE_PAUSE=8:dev-0004.safetensors \
    mpi "$TMP/hosts2" 2 -x SPMD_TEST_SAVE_PAUSE "$SPMD_TEST" train "${FLAGS[@]}" --steps $STEPS \
    --threads 4 --save "$ck" --save-every 4 >"$log" 2>&1 &
  local job=$!
  if ! wait_for 'paused after dev-0004' "$log" $job 60; then
    say "  the save of step 8 did not pause:"
    show "$log"
    return 1
  fi
  local t0
  t0=$(now_ms)
  ip netns pids "${HOSTS[1]}" | xargs -r kill -9
  run_until_end $job
  ended_well "host 1 killed in a save" "$log" || { show "$log"; return 1; }
  local took=$((ENDED_MS - t0))
  say "  host 1 killed in the save of step 8: the job ended $(seconds $took) s later, exit $RC"
  ((took <= BOUND * 1000)) || { say "  that is past the bound of $BOUND s"; return 1; }
  # The kill left step 4 the newest complete checkpoint, and a partial save.
  local latest
  latest=$(cat "$ck/latest" 2>/dev/null)
  [ "$latest" = step-00000004 ] || { say "  latest names '$latest', not step-00000004"; return 1; }
  [ ! -e "$ck/step-00000008" ] || { say "  a step-00000008 was committed"; return 1; }
  compgen -G "$ck/.tmp-*" >/dev/null || { say "  no partial save left to clean up"; return 1; }

  # Resumed over the same hosts, saving into the same directory.
  local resumed=$TMP/resumed.json
  if ! mpi "$TMP/hosts2" 2 "$SPMD" train "${FLAGS[@]}" --steps $STEPS --threads 4 --resume "$ck" \
    --save "$ck" --save-every 4 --json "$resumed" >"$TMP/resumed.txt" 2>&1; then
    say "  the resumed run failed:"
    show "$TMP/resumed.txt"
    return 1
  fi
  losses "$resumed" >"$TMP/resumed.loss"
  tail -n +5 "$TMP/one.loss" >"$TMP/one-after4.loss"
  same_losses "$TMP/one-after4.loss" "$TMP/resumed.loss" "resumed from step 4" || return 1
  latest=$(cat "$ck/latest" 2>/dev/null)
  [ "$latest" = "$(printf 'step-%08d' $STEPS)" ] || { say "  after the resumed run latest names '$latest'"; return 1; }
  if compgen -G "$ck/.tmp-*" >/dev/null; then
    say "  the killed save's temporary directory is still there: $(compgen -G "$ck/.tmp-*")"
    return 1
  fi
  say "  resumed from step 4: steps 5-$STEPS equal the uninterrupted run's, bit for bit"
}

# ---- 6. A link down mid-run: the collective watchdog --------------------------------------
WATCHDOG_S=3
# Seconds past the watchdog within which the job must end: `spmd launch`
# gives mpirun 30 s (--abort-wait) to end an aborted job, then ends it.
LINK_BOUND=60
# empty_within HOST SECONDS: until no process runs in HOST (0), or SECONDS
# have passed (1, the processes left in LEFT).
empty_within() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    LEFT=$(ip netns pids "$1")
    [ -z "$LEFT" ] && return 0
    sleep 0.1
  done
  return 1
}
# no_spmd_within HOST SECONDS: until no process of the tool runs in HOST
# (0), or SECONDS have passed (1, those left in LEFT).
no_spmd_within() {
  local i pid
  for ((i = 0; i < $2 * 10; i++)); do
    LEFT=
    for pid in $(ip netns pids "$1"); do
      [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$SPMD")" ] && LEFT="$LEFT$pid
"
    done
    LEFT=${LEFT%$'\n'}
    [ -z "$LEFT" ] && return 0
    sleep 0.1
  done
  return 1
}
case_link_down() {
  if ! "$SPMD" train --help 2>&1 | grep -q -- '--collective-timeout'; then
    SKIPPED="this spmd has no --collective-timeout (the collective watchdog is not built)"
    return 0
  fi
  # Four hosts, one process each: besides the host cut off, two that the
  # abort must reach through their daemons.
  local log=$TMP/link-down.txt
  launch "$TMP/hosts4" train "${FLAGS[@]}" --steps 1000000 --log-every 1 --threads 2 \
    --collective-timeout $WATCHDOG_S >"$log" 2>&1 &
  local job=$!
  if ! wait_for 'ms/step' "$log" $job 60; then
    say "  no progress line:"
    show "$log"
    return 1
  fi
  local t0 fired=
  t0=$(now_ms)
  # The bridge's end of host 1's cable: host 1 is cut off from the others
  # (its daemon too), its own interface still up.
  ip -n "$BRIDGE_NS" link set v1 down
  while kill -0 $job 2>/dev/null; do
    [ -z "$fired" ] && grep -q 'collective timeout' "$log" && fired=$(now_ms)
    sleep 0.1
  done
  run_until_end $job
  [ -z "$fired" ] && grep -q 'collective timeout' "$log" && fired=$ENDED_MS
  ended_well "link down" "$log" || { show "$log"; return 1; }
  if [ -z "$fired" ]; then
    say "  no 'collective timeout' message:"
    show "$log"
    return 1
  fi
  # A process that waited for host 1 names that host.
  # -a: a log is text even where mpirun wrote a byte grep takes for
  # binary (Open MPI 5's does), which would print "binary file matches".
  if ! grep -a 'collective timeout' "$log" | grep -q -- "${HOSTS[1]}"; then
    say "  no 'collective timeout' message names ${HOSTS[1]}:"
    grep -a 'collective timeout' "$log" | sed 's/^/    | /'
    return 1
  fi
  local took=$((ENDED_MS - t0))
  say "  host 1's link down mid-run: 'collective timeout' $(seconds $((fired - t0))) s later" \
    "(--collective-timeout $WATCHDOG_S), the job ended $(seconds $took) s after the link went down, exit $RC"
  ((took <= (WATCHDOG_S + LINK_BOUND) * 1000)) || {
    say "  that is past the bound of $((WATCHDOG_S + LINK_BOUND)) s"
    show "$log"
    return 1
  }
  if grep -q 'spmd: launch: the job aborted' "$log"; then
    say "  mpirun waited for host 1's daemon; spmd launch ended it (--abort-wait)"
  fi
  # The abort reached the hosts still connected: their daemons ended their
  # processes and themselves as mpirun ended (a moment's grace for exits).
  local h
  for h in "${HOSTS[2]}" "${HOSTS[3]}"; do
    if ! empty_within "$h" 5; then
      say "  processes still on $h 5 s after the job ended:"
      ps -o pid,args -p "$(echo "$LEFT" | tr '\n' ',' | sed 's/,$//')" | sed 's/^/    | /'
      return 1
    fi
  done
  local others=$(($(now_ms) - ENDED_MS))
  # The host cut off ends its own processes: their watchdog fired too.
  # Its daemon, which holds nothing, stays until TCP gives up its
  # connection to mpirun (about 15 minutes with Linux's defaults), and
  # goes with the namespace.
  if ! no_spmd_within "${HOSTS[1]}" $BOUND; then
    say "  spmd processes still on host 1 $BOUND s after the job ended:"
    ps -o pid,args -p "$(echo "$LEFT" | tr '\n' ',' | sed 's/,$//')" | sed 's/^/    | /'
    return 1
  fi
  local daemon=
  [ -n "$(ip netns pids "${HOSTS[1]}")" ] && daemon="; its daemon waits for TCP to give up"
  say "  hosts 2 and 3 empty $(seconds $others) s after the job ended; host 1's processes" \
    "ended on their own $(seconds $(($(now_ms) - ENDED_MS))) s after it$daemon"
}

# ---- Run them all --------------------------------------------------------------------------
FAILED=0
run_case() {
  local name=$1 t0 took
  SKIPPED=
  say "$name"
  t0=$(now_ms)
  if "$2"; then
    took=$(seconds $(($(now_ms) - t0)))
    if [ -n "$SKIPPED" ]; then
      say "  skipped: $SKIPPED"
    else
      say "  passed ($took s)"
    fi
  else
    took=$(seconds $(($(now_ms) - t0)))
    say "  FAILED ($took s)"
    FAILED=1
  fi
}

run_case "the hosts: 4 processes on 4 hosts, each its own hostname and network" hosts_are_apart
[ $FAILED = 0 ] || { say "the hosts do not work: nothing else tested"; exit 1; }
run_case "1. the same bits over 2 and 4 hosts as in one process" case_same_bits
run_case "2. pipeline stages over 2 and 4 hosts: the one-process bits" case_stages
run_case "3. a stage's host stalled: its neighbour's watchdog names the transfer" case_stage_stalled
run_case "4. a host killed mid-run ends the job" case_host_killed
run_case "5. a host killed mid-save; the resumed run has the same bits" case_killed_save
# Last: it leaves host 1 cut off.
run_case "6. a link down mid-run: the collective watchdog ends the job" case_link_down
exit $FAILED
