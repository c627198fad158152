/*
 * Training a GPT of spmd_gpt_build in the mesh tests (tensor, context and
 * expert parallelism against one device): one step on the addition set's
 * batch for that step, and a parameter's values read back.
 */
#ifndef SPMD_TESTS_SUPPORT_GPT_H
#define SPMD_TESTS_SUPPORT_GPT_H

#include <stddef.h>

#include "spmd/models.h"
#include "spmd/train.h"

/* Step `step` (AdamW at lr 3e-3) on batch `step` of `batch` sequences of
 * spmd_data_sequences(2, ...) over cfg's sequence and vocabulary; its loss
 * in *loss.  The test fails on any error. */
void support_gpt_step(spmd_trainer *tr, const spmd_gpt_tensors *t, const spmd_gpt_config *cfg,
                      int batch, int step, float *loss);

/* The values of g's tensor `name` as program p holds them, malloc'd; their
 * size in *bytes.  The test fails on any error. */
float *support_read_tensor(spmd_graph *g, spmd_program *p, const char *name, size_t *bytes);

#endif
