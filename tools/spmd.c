/*
 * The `spmd` command-line tool (README, "`spmd train`" and after):
 *   spmd train [flags]      build a model, compile one training step, run it
 *   spmd explain [flags]    show how the step is partitioned
 *   spmd visualize [flags]  draw which device holds which block of a tensor
 *   spmd export CKPT --out FILE [--format hf|llmc]
 *                           a checkpoint's GPT as GPT-2 weights for other tools
 *   spmd sample [flags]     generate text from a checkpoint or GPT-2 weights
 *   spmd plot LOG.jsonl --out FILE.svg [--title TEXT]
 *                           a run's loss and learning rate (spmd train --log) as a chart
 *   spmd tokenize TEXT... --out DIR
 *                           text files as GPT-2 token shards for spmd train --data
 *   spmd launch [-n N] [--hosts H] -- train|sample|explain ... | PROGRAM ...
 *                           a job over processes and hosts through mpirun
 * The entry point, at the top of the tool's modules: it has no header.
 */
#include "commands/explain.h"
#include "commands/export.h"
#include "commands/launch.h"
#include "commands/plot_cmd.h"
#include "commands/sample.h"
#include "commands/tokenize.h"
#include "commands/train.h"
#include "commands/visualize.h"
#include "flags.h"
#include "processes.h"

#include <stdio.h>
#include <string.h>

static int run_command(int argc, char **argv)
{
    /* As git does: a bare `spmd` is a usage error, and says what to type. */
    if (argc < 2) {
        flags_usage_commands(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        flags_usage_commands(stdout);
        return 0;
    }
    static const struct {
        cli_command command;
        int (*run)(int argc, char **argv);
    } runs[] = {{CMD_TRAIN, cmd_train},   {CMD_EXPLAIN, cmd_explain},
                {CMD_VISUALIZE, cmd_visualize}, {CMD_EXPORT, cmd_export},
                {CMD_SAMPLE, cmd_sample}, {CMD_PLOT, cmd_plot},
                {CMD_TOKENIZE, cmd_tokenize}, {CMD_LAUNCH, cmd_launch}};
    cli_command command = flags_command(cmd);
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++)
        if (runs[i].command == command) return runs[i].run(argc - 2, argv + 2);
    fprintf(stderr, "spmd: unknown command '%s' (train, explain, visualize, export, sample, plot, "
            "tokenize, launch)\n",
            cmd);
    return 2;
}

/* Under mpirun every process runs the same command on its share of the
 * mesh's devices (processes.h); the launcher itself is never one of them. */
int main(int argc, char **argv)
{
    if (argc > 1 && flags_command(argv[1]) == CMD_LAUNCH) return run_command(argc, argv);
    int rc = processes_start(&argc, &argv);
    if (rc) return rc;
    return processes_end(run_command(argc, argv));
}
