/*
 * GPT-2 weights in and out: the parameters of a GPT built by
 * spmd_gpt_build (spmd/models.h) read from, or written to, the files other
 * tools use.
 *
 *   Hugging Face GPT-2 safetensors ("hf"): names wte.weight, wpe.weight,
 *     h.{i}.ln_1.weight, ..., ln_f.bias, optionally under "transformer.";
 *     the attention, MLP and projection weights in Conv1D's [in, out]
 *     layout (libspmd's are [out, in], as nn.Linear); F32.  Reading also
 *     takes lm_head.weight (it must equal wte.weight: the head is tied) and
 *     ignores the attention mask buffers h.{i}.attn.bias and
 *     h.{i}.attn.masked_bias; any other tensor is refused.  Writing uses
 *     the names without prefix and no lm_head.weight, as the gpt2 model on
 *     the Hugging Face hub has them: GPT2LMHeadModel.from_pretrained adds
 *     the prefix and ties the head, and safetensors' load_file gives
 *     GPT2Model's own state_dict keys.  The header's metadata holds
 *     {"format": "pt", "n_head": "<heads>"}.
 *   llm.c checkpoint ("llmc", gpt2_124M.bin): 256 little-endian int32
 *     (magic 20240326, version, maxT, V, L, NH, C, Vp), then fp32
 *     parameters in llm.c's order with [out, in] layouts: wte [Vp, C] (only
 *     the first V rows are real), wpe [maxT, C], ln1w [L, C], ln1b [L, C],
 *     qkvw [L, 3C, C], qkvb [L, 3C], attprojw [L, C, C], attprojb [L, C],
 *     ln2w, ln2b, fcw [L, 4C, C], fcb [L, 4C], fcprojw [L, C, 4C],
 *     fcprojb [L, C], lnfw [C], lnfb [C].  Reading takes version 3 and
 *     version 1 (no padding: Vp = V); writing makes version 3 with V padded
 *     to a multiple of 128 by zero rows.
 *
 * The format is recognised from the file's first bytes, not its name.
 * Every failure names the file and the cause; a load that fails leaves the
 * program's values as they were.
 */
#ifndef SPMD_WEIGHTS_H
#define SPMD_WEIGHTS_H

#include "spmd/models.h"
#include "spmd/spmd.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum spmd_weights_format {
    SPMD_WEIGHTS_HF = 0,  /* Hugging Face GPT-2 safetensors */
    SPMD_WEIGHTS_LLMC = 1 /* llm.c checkpoint, fp32 */
} spmd_weights_format;

/* Where the number of heads came from: the tensors do not show it. */
typedef enum spmd_weights_heads {
    SPMD_HEADS_UNKNOWN = 0,    /* nowhere: config.heads is 0 */
    SPMD_HEADS_FILE = 1,       /* the llm.c header, or n_head in the safetensors metadata */
    SPMD_HEADS_CONFIG_JSON = 2, /* n_head of a config.json beside the file */
    SPMD_HEADS_GPT2_RULE = 3   /* dim / 64: GPT-2's head size */
} spmd_weights_heads;

typedef struct spmd_weights_info {
    spmd_weights_format format;
    /* vocab, context (rows of wpe), layers, heads, dim; seq is set to the
     * context. */
    spmd_gpt_config config;
    spmd_weights_heads heads_from;
} spmd_weights_info;

/* "hf" or "llmc"; NULL for another value. */
SPMD_API const char *spmd_weights_format_name(spmd_weights_format format);
/* The format and model shape of the weights file at `path`, after checking
 * its header and that it holds every GPT-2 parameter of that shape, F32,
 * in the layout the format says (data is not read). */
SPMD_API spmd_status spmd_weights_inspect(const char *path, spmd_weights_info *info);

/* Overwrite every parameter of runnable program p, whose graph was built
 * by spmd_gpt_build with `cfg` (on any mesh), with the weights of the file
 * at `path`.  The file's shape must be cfg's (vocab, context, layers,
 * dim, and heads where the file records them).  Everything is read and
 * checked before the first parameter is written; optimizer state is not
 * touched. */
SPMD_API spmd_status spmd_weights_load(spmd_program *p, const spmd_gpt_config *cfg,
                                       const char *path);

/* Write every parameter of runnable program p (built by spmd_gpt_build
 * with `cfg`) to one file at `path` in `format`, atomically: a temporary
 * file beside it, fsynced, renamed over `path`, the directory fsynced. */
SPMD_API spmd_status spmd_weights_save(const spmd_program *p, const spmd_gpt_config *cfg,
                                       spmd_weights_format format, const char *path);

/* spmd_weights_save with the values in `dtype`: SPMD_F32 (what
 * spmd_weights_save writes), or SPMD_BF16, each weight rounded to the
 * nearest bf16 (ties to even), a safetensors file of dtype BF16 (half the
 * bytes; the format SPMD_WEIGHTS_HF only: llm.c's bf16 checkpoint is not
 * written).  spmd_weights_load reads F32 files only and refuses a BF16
 * one, naming its dtype: training starts from the f32 masters, which the
 * checkpoints keep. */
SPMD_API spmd_status spmd_weights_save_as(const spmd_program *p, const spmd_gpt_config *cfg,
                                          spmd_weights_format format, spmd_dtype dtype,
                                          const char *path);

/* The GPT configuration a checkpoint (spmd/checkpoint.h) records in its
 * "meta" object under "config", as `spmd train --save` writes it:
 *     {"config": {"model": "gpt", "vocab": V, "seq": T, "context": N,
 *                 "layers": L, "heads": H, "dim": C}, ...}
 * `ckpt_dir` is a checkpoint directory (its latest step) or a step
 * directory.  `step` (may be NULL) receives the saved step. */
SPMD_API spmd_status spmd_weights_checkpoint_config(const char *ckpt_dir, spmd_gpt_config *cfg,
                                                    int64_t *step);

/* Export a checkpoint's GPT parameters to one file: the GPT of its
 * recorded configuration is built on one device, the checkpoint loaded
 * into it (from whatever mesh wrote it), and spmd_weights_save writes
 * `path`.  `cfg` and `step` (each may be NULL) receive the configuration
 * and the step. */
SPMD_API spmd_status spmd_weights_export(const char *ckpt_dir, spmd_weights_format format,
                                         const char *path, spmd_gpt_config *cfg, int64_t *step);
/* spmd_weights_export with the values in `dtype` (spmd_weights_save_as). */
SPMD_API spmd_status spmd_weights_export_as(const char *ckpt_dir, spmd_weights_format format,
                                            spmd_dtype dtype, const char *path,
                                            spmd_gpt_config *cfg, int64_t *step);

#ifdef __cplusplus
}
#endif
#endif
