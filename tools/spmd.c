/*
 * The `spmd` command-line tool:
 *   spmd train [flags]      build a model, compile one training step, run it
 *   spmd explain [flags]    show how the step is partitioned
 *   spmd visualize [flags]  draw which device holds which block of a tensor
 *   spmd export CKPT --out FILE [--format hf|llmc]
 *                           a checkpoint's GPT as GPT-2 weights for other tools
 *   spmd sample [flags]     generate text from a checkpoint or GPT-2 weights
 *   spmd plot LOG.jsonl --out FILE.svg [--title TEXT]
 *                           a run's loss and learning rate (spmd train --log) as a chart
 */
#include "cli.h"
#include "plot.h"
#include "processes.h"

#include <string.h>

static int run_command(int argc, char **argv)
{
    if (argc < 2) return cmd_train(0, NULL);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "train")) return cmd_train(argc - 2, argv + 2);
    if (!strcmp(cmd, "explain")) return cmd_explain(argc - 2, argv + 2);
    if (!strcmp(cmd, "visualize")) return cmd_visualize(argc - 2, argv + 2);
    if (!strcmp(cmd, "export")) return cmd_export(argc - 2, argv + 2);
    if (!strcmp(cmd, "sample")) return cmd_sample(argc - 2, argv + 2);
    if (!strcmp(cmd, "plot")) return cmd_plot(argc - 2, argv + 2);
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        cli_usage(stdout, "train|explain");
        printf("       spmd visualize --mesh 4x2 --axes replica,fsdp --shape 8,6 --spec 'fsdp, None'\n");
        printf("       spmd export CKPT --out FILE [--format hf|llmc]\n");
        printf("       spmd sample --resume DIR --prompt TEXT [--tokens N] (spmd sample --help)\n");
        printf("       spmd plot LOG.jsonl --out FILE.svg [--title TEXT]\n");
        return 0;
    }
    fprintf(stderr, "spmd: unknown command '%s' (train, explain, visualize, export, sample, plot)\n",
            cmd);
    return 2;
}

/* Under mpirun every process runs the same command on its share of the
 * mesh's devices (processes.h). */
int main(int argc, char **argv)
{
    int rc = cli_processes_start(&argc, &argv);
    if (rc) return rc;
    return cli_processes_end(run_command(argc, argv));
}
