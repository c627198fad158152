/*
 * The motivating case over processes: the (4, 2) mesh ('replica', 'fsdp')
 * of examples/fsdp_replicas.c, run by a program that owns MPI.  Start it
 * with `mpirun -n P` (P divides 8): each process runs 8 / P devices, the
 * minor axis 'fsdp' inside a process, and feeds only the rows of the batch
 * its devices hold.  The losses are the one-process run's, bit for bit.
 */
#include <spmd/data.h>
#include <spmd/mesh.h>
#include <spmd/models.h>
#include <spmd/train.h>

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

/* A failure on one process would leave the others waiting in a
 * collective: end the job. */
#define CHECK(x)                                                                           \
    do {                                                                                   \
        if (!(x)) {                                                                        \
            fprintf(stderr, "error: %s\n", spmd_last_error());                             \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                  \
        }                                                                                  \
    } while (0)

int main(int argc, char **argv)
{
    int level = 0, rank = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int steps = argc > 1 ? atoi(argv[1]) : 30, batch = 16;
    spmd_mesh *mesh = spmd_mesh_parse("4x2", "replica,fsdp");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_config cfg = {.vocab = 64, .seq = 32, .layers = 2, .heads = 4, .dim = 64};
    spmd_gpt_tensors t;
    CHECK(mesh && g && spmd_gpt_build(g, &cfg, batch, &t) == SPMD_OK);
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        spmd_tensor *p = spmd_graph_tensor(g, i);
        if (spmd_tensor_is_param(p) && spmd_tensor_rank(p) == 2)
            CHECK(spmd_mark_sharding(g, p, mesh, "fsdp, None") == SPMD_OK);
    }
    CHECK(spmd_mark_sharding(g, t.input, mesh, "(replica, fsdp), None") == SPMD_OK);
    CHECK(spmd_mark_sharding(g, t.targets, mesh, "(replica, fsdp), None") == SPMD_OK);

    /* The only change from one process: the communicator to run over. */
    MPI_Comm comm = MPI_COMM_WORLD;
    spmd_trainer_options opts = {
        .optimizer = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.01f, .clip_norm = 1.0f},
        .compile = {.seed = 1, .mpi_comm = &comm}};
    spmd_trainer *trainer = spmd_trainer_create(g, t.loss, &opts);
    CHECK(trainer);
    spmd_program *prog = spmd_trainer_program(trainer);
    int first = 0, here = spmd_program_local_devices(prog, &first);
    int64_t lo = 0, hi = 0;
    CHECK(spmd_program_input_rows(prog, t.input, &lo, &hi) == SPMD_OK);
    printf("process %d of %d: devices %d to %d, batch rows %lld to %lld\n", rank,
           spmd_program_processes(prog), first, first + here - 1, (long long)lo, (long long)hi - 1);
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);

    /* Only this process's rows of the batch are read; the rest may be anything. */
    static int32_t in[16 * 32], tg[16 * 32];
    for (int s = 0; s < steps; s++) {
        float lr = spmd_lr_schedule(s, 5, steps, 3e-3f, 3e-4f), loss;
        CHECK(spmd_data_sequences(1, (int64_t)s * batch + lo, (int)(hi - lo), cfg.seq, cfg.vocab,
                                  in + lo * cfg.seq, tg + lo * cfg.seq) == SPMD_OK);
        CHECK(spmd_program_set_input(prog, t.input, in, sizeof in) == SPMD_OK);
        CHECK(spmd_program_set_input(prog, t.targets, tg, sizeof tg) == SPMD_OK);
        CHECK(spmd_trainer_step(trainer, lr, &loss, NULL) == SPMD_OK);
        if (rank == 0 && (s % 10 == 0 || s == steps - 1)) printf("step %3d  loss %.4f\n", s, loss);
    }
    spmd_trainer_free(trainer);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
    MPI_Finalize();
    return 0;
}
