/*
 * Hooks for the end-to-end tests, read from the environment only by
 * `spmd-test`: the same tool built with SPMD_TOOL_TEST_HOOKS (CMake's
 * spmd_tool_test, never installed).  In `spmd` itself they do nothing.
 *
 *   SPMD_TEST_BAD_TOKEN=PROCESS:STEP   process PROCESS feeds a GPT token id
 *       outside the vocabulary at step STEP (from 1): its step fails in the
 *       embedding, as a corrupt shard would make it, while the other
 *       processes wait in a collective (test_cli_mpi).
 *   SPMD_TEST_SAVE_PAUSE=STEP:STAGE    the save of step STEP stops after
 *       STAGE (a file of the save, "index.json", "step-NNNNNNNN" or
 *       "latest"; see train/checkpoint_hook.h), says so on stderr and waits
 *       for a signal, so a test can kill -9 the tool there
 *       (test_cli_checkpoint).
 */
#ifndef SPMD_TOOLS_TEST_HOOKS_H
#define SPMD_TOOLS_TEST_HOOKS_H

#include <stdbool.h>

/* Whether this process feeds a bad token at step `step` (from 0). */
bool test_hooks_bad_token(int step);
/* Around the save of step `step`: arm the pause, then take it away. */
void test_hooks_save_begin(int step);
void test_hooks_save_end(void);

#endif
