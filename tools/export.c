/*
 * `spmd export CKPT --out FILE [--format hf|llmc]`: the GPT parameters of
 * a checkpoint written by `spmd train --save` (any mesh), as one file
 * other tools read: Hugging Face GPT-2 safetensors (hf, the default) or an
 * llm.c checkpoint (llmc).  The library does the work (spmd/weights.h):
 * it builds the recorded GPT on one device, loads the checkpoint into it
 * and writes the file atomically.
 */
#include "cli.h"

#include "spmd/weights.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static void export_usage(FILE *f)
{
    fprintf(f, "usage: spmd export CKPT --out FILE [--format hf|llmc]\n"
               "  CKPT             a checkpoint directory (spmd train --save DIR: its latest\n"
               "                   step) or one of its step directories\n"
               "  --out FILE       the file to write (replaced atomically)\n"
               "  --format hf      Hugging Face GPT-2 safetensors: names wte.weight,\n"
               "                   h.0.ln_1.weight, ..., Conv1D [in, out] weights, head tied to\n"
               "                   wte (default)\n"
               "  --format llmc    an llm.c checkpoint (gpt2_124M.bin layout, version 3, fp32,\n"
               "                   vocabulary padded to a multiple of 128)\n");
}

/* Flags into ckpt, out and format; 0, -1 after help, or an exit code. */
static int parse(int argc, char **argv, const char **ckpt, const char **out,
                 spmd_weights_format *format)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            export_usage(stdout);
            return -1;
        }
        if (a[0] != '-') {
            if (*ckpt) return cli_fail("export takes one checkpoint, got '%s' and '%s'", *ckpt, a);
            *ckpt = a;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        bool is_out = len == 5 && !strncmp(a, "--out", 5);
        bool is_format = len == 8 && !strncmp(a, "--format", 8);
        if (!is_out && !is_format) {
            export_usage(stderr);
            return cli_fail("unknown flag '%.*s'", (int)len, a);
        }
        if (!v) return cli_fail("%.*s needs a value", (int)len, a);
        if (is_out) *out = v;
        else if (!strcmp(v, "hf")) *format = SPMD_WEIGHTS_HF;
        else if (!strcmp(v, "llmc")) *format = SPMD_WEIGHTS_LLMC;
        else return cli_fail("--format is hf or llmc, got '%s'", v);
    }
    if (!*ckpt || !*out) {
        export_usage(stderr);
        return cli_fail("export needs a checkpoint and --out FILE");
    }
    return 0;
}

int cmd_export(int argc, char **argv)
{
    const char *ckpt = NULL, *out = NULL;
    spmd_weights_format format = SPMD_WEIGHTS_HF;
    int rc = parse(argc, argv, &ckpt, &out, &format);
    if (rc) return rc < 0 ? 0 : rc;
    spmd_gpt_config c;
    int64_t step;
    if (spmd_weights_export(ckpt, format, out, &c, &step) != SPMD_OK) {
        cli_fail("%s", spmd_last_error());
        return 1;
    }
    struct stat sb;
    long long bytes = stat(out, &sb) == 0 ? (long long)sb.st_size : -1;
    printf("export: %s step %lld -> %s (%s, %lld bytes): gpt, vocab %d, context %d, %d layers, "
           "%d heads, dim %d\n",
           ckpt, (long long)step, out,
           format == SPMD_WEIGHTS_HF ? "Hugging Face GPT-2 safetensors" : "llm.c checkpoint", bytes,
           c.vocab, c.context ? c.context : c.seq, c.layers, c.heads, c.dim);
    return 0;
}
