/*
 * The motivating case, by hand: 8 devices as a (4, 2) mesh ('replica',
 * 'fsdp') -- four copies of a GPT, each sharded over a pair of devices,
 * trained concurrently.  Mark the weights and the batch; libspmd does the
 * all-gathers, reduce-scatters and all-reduces.
 */
#include <spmd/data.h>
#include <spmd/mesh.h>
#include <spmd/models.h>
#include <spmd/train.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "error: %s\n", spmd_last_error()); return 1; } } while (0)

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 30, batch = 16;
    spmd_mesh *mesh = spmd_mesh_parse("4x2", "replica,fsdp");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_config cfg = {.vocab = 64, .seq = 32, .layers = 2, .heads = 4, .dim = 64};
    spmd_gpt_tensors t;
    CHECK(mesh && g && spmd_gpt_build(g, &cfg, batch, &t) == SPMD_OK);

    /* Parameters split over 'fsdp' (replicated x4), the batch 8 ways. */
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        spmd_tensor *p = spmd_graph_tensor(g, i);
        if (spmd_tensor_is_param(p) && spmd_tensor_rank(p) == 2)
            CHECK(spmd_mark_sharding(g, p, mesh, "fsdp, None") == SPMD_OK);
    }
    CHECK(spmd_mark_sharding(g, t.input, mesh, "(replica, fsdp), None") == SPMD_OK);
    CHECK(spmd_mark_sharding(g, t.targets, mesh, "(replica, fsdp), None") == SPMD_OK);

    /* Backward and AdamW as graph ops; compile once, step many times. */
    spmd_trainer_options opts = {
        .optimizer = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.01f, .clip_norm = 1.0f},
        .compile = {.seed = 1}};
    spmd_trainer *trainer = spmd_trainer_create(g, t.loss, &opts);
    CHECK(trainer);
    spmd_program *prog = spmd_trainer_program(trainer);
    printf("%d devices, %d collectives per step, %.1f KiB of parameters per device\n",
           spmd_program_devices(prog), spmd_program_collective_count(prog),
           spmd_program_param_bytes(prog) / 1024.0);

    int32_t in[16 * 32], tg[16 * 32];
    for (int s = 0; s < steps; s++) {
        float lr = spmd_lr_schedule(s, 5, steps, 3e-3f, 3e-4f), loss;
        CHECK(spmd_data_sequences(1, (int64_t)s * batch, batch, cfg.seq, cfg.vocab, in, tg) == SPMD_OK);
        CHECK(spmd_program_set_input(prog, t.input, in, sizeof in) == SPMD_OK);
        CHECK(spmd_program_set_input(prog, t.targets, tg, sizeof tg) == SPMD_OK);
        CHECK(spmd_trainer_step(trainer, lr, &loss, NULL) == SPMD_OK);
        if (s % 10 == 0 || s == steps - 1) printf("step %3d  loss %.4f\n", s, loss);
    }
    spmd_trainer_free(trainer);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
    return 0;
}
