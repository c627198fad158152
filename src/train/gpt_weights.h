/*
 * What reading and writing GPT-2 weights share (spmd/weights.h): the
 * parameters of a GPT as both formats hold them.  Both hold the same 16
 * groups of tensors; llm.c stacks each block tensor over the layers and
 * keeps [out, in] layouts, Hugging Face names each layer's tensor and
 * keeps Conv1D's [in, out].  One table (GW_GROUPS, in llm.c's order)
 * drives reading, checking and writing both.
 */
#ifndef SPMD_TRAIN_GPT_WEIGHTS_H
#define SPMD_TRAIN_GPT_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "spmd/models.h"
#include "spmd/spmd.h"

/* llm.c: 256 int32 (magic, version, maxT, V, L, NH, C, Vp), then fp32. */
#define GW_LLMC_MAGIC 20240326
#define GW_LLMC_HEADER_INTS 256
#define GW_LLMC_HEADER_BYTES (GW_LLMC_HEADER_INTS * 4)
#define GW_LLMC_VERSION_PADDED 3 /* fp32, vocab padded to Vp */

/* What a dimension of a parameter stands for. */
typedef enum gw_unit { U_NONE, U_V, U_T, U_C, U_3C, U_4C } gw_unit;

/* A group of parameters, in llm.c's order: one tensor (top level) or one
 * per block, named "h.{i}." + name. */
typedef struct gw_group {
    const char *name;
    bool per_layer;
    bool conv1d; /* Hugging Face stores it transposed, [in, out] */
    gw_unit rows, cols; /* libspmd's layout; cols U_NONE for a vector */
} gw_group;

extern const gw_group GW_GROUPS[];
enum { GW_N_GROUPS = 16, GW_FIRST_BLOCK_GROUP = 2, GW_BLOCK_GROUPS = 12 };

/* One parameter of a GPT. */
typedef struct gw_param {
    char name[64]; /* libspmd's (and Hugging Face's, without prefix) */
    int group;
    int layer; /* -1 at the top level */
    int rank;
    int64_t shape[2];      /* libspmd's layout */
    int64_t file_shape[2]; /* Hugging Face's: Conv1D weights transposed */
    int64_t numel;
} gw_param;

/* Rows of wpe: cfg->context, or seq when it is 0. */
int gw_context(const spmd_gpt_config *cfg);
/* Parameters of a GPT: 4 + 12 per block. */
int64_t gw_param_total(const spmd_gpt_config *cfg);
/* Group `group`'s parameter of block `layer` (ignored at the top level). */
void gw_param_of(const spmd_gpt_config *cfg, int group, int layer, gw_param *p);
/* The k-th parameter in libspmd's (and Hugging Face's) order: wte, wpe,
 * each block's twelve, ln_f. */
void gw_param_at(const spmd_gpt_config *cfg, int64_t k, gw_param *p);

/* Program p's tensor for parameter `w`, checked against its shape; an
 * error prefixed `what` when p has none. */
spmd_status gw_program_param(const spmd_program *p, const gw_param *w, const char *what,
                             const spmd_tensor **out);
/* p is runnable and holds every parameter of cfg's GPT. */
spmd_status gw_check_program(const spmd_program *p, const spmd_gpt_config *cfg,
                             const char *what);

/* obj[key] as a whole number in [1, INT32_MAX]; 0 when absent, -1 when
 * it is not one. */
struct cJSON;
int gw_json_int(const struct cJSON *obj, const char *key);

/* dst [cols, rows] = src [rows, cols] transposed. */
void gw_transpose(const float *src, int64_t rows, int64_t cols, float *dst);

#endif
