/*
 * Hooks for the end-to-end tests, read from the environment only by
 * `spmd-test`: the same tool built with SPMD_TOOL_TEST_HOOKS (CMake's
 * spmd_tool_test, never installed).  In `spmd` itself they do nothing.
 *
 *   SPMD_TEST_BAD_TOKEN=PROCESS:STEP   process PROCESS feeds a GPT token id
 *       outside the vocabulary at step STEP (from 1): its step fails in the
 *       embedding, as a corrupt shard would make it, while the other
 *       processes wait in a collective (test_cli_mpi).
 *   SPMD_TEST_STOP=PROCESS:STEP        process PROCESS stops itself (SIGSTOP)
 *       as step STEP (from 1) begins, as a hung host or a dead link would
 *       leave it: the others wait in a collective until the watchdog
 *       (--collective-timeout) ends the job (test_cli_mpi).
 *   SPMD_TEST_DELAY=PROCESS:SECONDS    process PROCESS sleeps SECONDS before
 *       every step, so its peers wait that long in a collective each step:
 *       a slow process, which the watchdog must not end (test_cli_mpi).
 *   SPMD_TEST_NET_ROUNDS=1             process 0 prints each round of the
 *       network measurement ("spmd: test: network round R: X us per
 *       message, Y GB/s"), so a test can check which round's figures the
 *       run took (test_cli_mpi).
 *   SPMD_TEST_SAVE_PAUSE=STEP:STAGE    the save of step STEP stops after
 *       STAGE (a file of the save, "index.json", "step-NNNNNNNN" or
 *       "latest"; see train/checkpoint_hook.h), says so on stderr and waits
 *       for a signal, so a test can kill -9 the tool there
 *       (test_cli_checkpoint).
 *   SPMD_TEST_SHARD_TOKENS=N           spmd tokenize's shards hold at most N
 *       tokens instead of 2^31 - 1, so the refusal of a shard too large runs
 *       on a small text (test_cli_tokenize).
 *   SPMD_TEST_FREE_BYTES=N             the --save directory's file system has
 *       N bytes free, so the refusal of a run whose checkpoint cannot fit
 *       runs without filling a disk (test_cli_files).
 *   SPMD_TEST_PHASES=FILE              every process appends a line to FILE
 *       (one write, O_APPEND) as it enters each phase of a training run,
 *       "P<rank> <pid> <seconds, CLOCK_MONOTONIC> <phase>", the phase one
 *       of: start (flags read), probe (the file that checks --save takes
 *       writes made), lock (--save's lock taken, a killed save's
 *       temporaries not yet removed), prepared (they are: start-up goes
 *       on), step N, save N (the save of step N
 *       begun), save N STAGE (a stage of it done; see
 *       train/checkpoint_hook.h), saved N; so a test that kills the tool
 *       knows where each kill landed (test_cli_chaos).
 *   SPMD_TEST_PHASE_STOP=PROCESS:PHASE process PROCESS stops itself
 *       (SIGSTOP) as it enters PHASE, after its line, so a test can kill
 *       it exactly there (test_cli_chaos).
 */
#ifndef SPMD_TOOLS_TEST_HOOKS_H
#define SPMD_TOOLS_TEST_HOOKS_H

#include <stdbool.h>
#include <stddef.h>

/* Whether this process feeds a bad token at step `step` (from 0). */
bool test_hooks_bad_token(int step);
/* As step `step` (from 0) begins: the stop or the delay, if asked for. */
void test_hooks_step_begin(int step);
/* One round of the network measurement, seconds and bytes per second. */
void test_hooks_network_round(int round, double latency_s, double bytes_per_s);
/* Around the save of step `step`: arm the pause, then take it away. */
void test_hooks_save_begin(int step);
void test_hooks_save_end(void);
/* The most tokens a shard of spmd tokenize holds: `max`, or the hook's. */
size_t test_hooks_shard_tokens(size_t max);
/* The bytes free where --save writes: `real`, or the hook's. */
double test_hooks_free_bytes(double real);
/* This process enters the phase the format names ("step 3"). */
void test_hooks_phase(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
