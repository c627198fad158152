/*
 * `spmd export CKPT --out FILE [--format hf|llmc] [--dtype fp32|bf16]`: the GPT parameters of
 * a checkpoint written by `spmd train --save` (any mesh), as one file
 * other tools read: Hugging Face GPT-2 safetensors (hf, the default) or an
 * llm.c checkpoint (llmc), f32 or (safetensors) rounded to bf16.  The
 * library does the work (spmd/weights.h):
 * it builds the recorded GPT on one device, loads the checkpoint into it
 * and writes the file atomically.
 */
#include "commands/export.h"

#include "flags.h"
#include "message.h"
#include "paths.h"

#include "spmd/weights.h"

#include <stdio.h>
#include <sys/stat.h>

int cmd_export(int argc, char **argv)
{
    cli_opts o;
    int rc = flags_read(argc, argv, CMD_EXPORT, &o);
    if (rc) return rc < 0 ? 0 : rc;
    const char *ckpt = o.operand, *out = o.out;
    if (!ckpt || !out) {
        flags_usage(stderr, CMD_EXPORT);
        return cli_fail("export needs a checkpoint and --out FILE");
    }
    /* Nothing of the checkpoint is overwritten (tools/paths.c). */
    if ((rc = paths_check(&o))) return rc;
    spmd_weights_format format = o.llmc ? SPMD_WEIGHTS_LLMC : SPMD_WEIGHTS_HF;
    if (o.export_bf16 && o.llmc)
        return cli_fail("--dtype bf16 writes safetensors (--format hf) only; llm.c's bf16 "
                        "checkpoint (version 5) is not written");
    spmd_gpt_config c;
    int64_t step;
    spmd_dtype dtype = o.export_bf16 ? SPMD_BF16 : SPMD_F32;
    if (spmd_weights_export_as(ckpt, format, dtype, out, &c, &step) != SPMD_OK) {
        cli_fail("%s", spmd_last_error());
        return 1;
    }
    struct stat sb;
    long long bytes = stat(out, &sb) == 0 ? (long long)sb.st_size : -1;
    printf("export: %s step %lld -> %s (%s%s, %lld bytes): gpt, vocab %d, context %d, %d layers, "
           "%d heads, dim %d\n",
           ckpt, (long long)step, out,
           format == SPMD_WEIGHTS_HF ? "Hugging Face GPT-2 safetensors" : "llm.c checkpoint",
           o.export_bf16 ? ", bf16" : "", bytes,
           c.vocab, c.context ? c.context : c.seq, c.layers, c.heads, c.dim);
    return 0;
}
