/*
 * Files and directories as checkpoints use them: whole writes and reads
 * that survive short transfers and EINTR, fsync of files and directories
 * (what makes a rename durable), recursive removal, and crc32 (zlib).
 * Every failure is recorded with base_error as "<what>: <path>: <reason>",
 * `what` naming the operation the caller is in ("checkpoint save").
 * And a few threads that work through a list of jobs (the files of a
 * save, the blocks of a load) together.
 */
#ifndef SPMD_TRAIN_CHECKPOINT_FS_H
#define SPMD_TRAIN_CHECKPOINT_FS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spmd/spmd.h"

/* Room for any path a checkpoint builds. */
enum { CKPT_PATH_MAX = 4096 };
/* The writers' lock in a checkpoint directory (ckpt_lock_dir). */
#define CKPT_LOCK ".lock"

/* dir + "/" + name into buf; a path too long for CKPT_PATH_MAX is an error. */
spmd_status ckpt_join(char *buf, const char *dir, const char *name, const char *what);

spmd_status ckpt_write_all(int fd, const void *buf, size_t n, const char *path, const char *what);
/* Exactly n bytes at offset `off`; a file that ends first is an error. */
spmd_status ckpt_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path,
                           const char *what);

/* Create `path` and any missing parents (mkdir -p). */
spmd_status ckpt_mkdirs(const char *path, const char *what);
/* fsync a directory, so the names created or renamed in it are durable. */
spmd_status ckpt_fsync_dir(const char *path, const char *what);
/* Remove `path` and everything under it; a missing path is no error. */
spmd_status ckpt_remove_tree(const char *path, const char *what);
bool ckpt_exists(const char *path);

/* `path` opened for reading without blocking: a FIFO or a device with no
 * writer would hang open() forever, so it is opened O_NONBLOCK (cleared
 * once open) and the caller's fstat then refuses what is not a regular
 * file.  The descriptor, or -1 with errno. */
int ckpt_open_input(const char *path);
/* ckpt_open_input, then fstat: the descriptor of a regular file, or -1
 * with *why NULL when the open failed (errno says why) or naming what the
 * path is instead ("a FIFO, not a regular file"). */
int ckpt_open_regular(const char *path, const char **why);
/* What a file of `mode` is when it is not a regular file ("a FIFO, not a
 * regular file"), or NULL for a regular file. */
const char *ckpt_not_regular(unsigned mode);

/* The writers' lock of a checkpoint directory, DIR/.lock: an fcntl write
 * lock held by the writer while it writes (the kernel drops it when the
 * process dies, so a dead writer's lock file holds nothing).  The file
 * records the holder as "PID HOST" for the message a second writer gets.
 * A process that holds DIR's lock already (the tool holds its run's for
 * the whole run, and each save takes it again) shares it: closing any
 * descriptor of the file would drop the process's lock, so the file stays
 * open once, until its last holder lets go.  *fd is the lock to pass to
 * ckpt_unlock_dir, -1 where the file system has no locks (no error then). */
spmd_status ckpt_lock_dir(const char *dir, int *fd, const char *what);
/* Let go of a lock ckpt_lock_dir gave (-1: nothing). */
void ckpt_unlock_dir(int fd);
/* Remove the temporaries a killed save left in `dir` (.tmp-step-* and
 * .del-step-* directories, and the .latest.tmp-* file of ckpt_replace_file);
 * only for the holder of the lock.  How many were removed goes to
 * *removed. */
spmd_status ckpt_remove_temporaries(const char *dir, int *removed, const char *what);

/* A whole file of at most `max` bytes, NUL-terminated, allocated from
 * `alloc`; its size in *len. */
spmd_status ckpt_read_file(const spmd_allocator *alloc, const char *path, size_t max, char **out,
                           size_t *len, const char *what);
/* Replace dir/name by `n` bytes atomically: write a temporary file in dir,
 * fsync it, rename it over dir/name, fsync dir. */
spmd_status ckpt_replace_file(const char *dir, const char *name, const void *data, size_t n,
                              const char *what);

/* zlib's crc32 of n more bytes, for any n. */
uint32_t ckpt_crc32(uint32_t crc, const void *buf, size_t n);
/* The crc32 of A then B from crc32(A), crc32(B) and B's length (< 2 GiB). */
uint32_t ckpt_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* ---- Threads ------------------------------------------------------------------------ */

struct rt_pool;

/* Up to `n` threads (the caller among them) that run jobs together. */
typedef struct ckpt_workers {
    struct rt_pool *pool; /* NULL: the caller alone */
    int n;                /* threads, >= 1 */
    atomic_int stop;      /* a job failed: the others stop early */
} ckpt_workers;

/* Never fails: when the threads cannot be had (no memory, no thread),
 * the caller works alone. */
void ckpt_workers_start(ckpt_workers *w, const spmd_allocator *alloc, int want);
void ckpt_workers_stop(ckpt_workers *w);

/* fn(ctx, job, thread) for every job in 0 .. n_jobs - 1, each once, in
 * that order of claims, on the workers' threads (`thread` in 0 .. w->n - 1
 * tells which; one thread runs one job at a time).  After the first
 * failure no further job starts, and a running one may stop early when
 * ckpt_workers_stopping says so; that failure is returned, its message
 * recorded on the calling thread. */
typedef spmd_status (*ckpt_job_fn)(void *ctx, int job, int thread);
spmd_status ckpt_workers_run(ckpt_workers *w, int n_jobs, ckpt_job_fn fn, void *ctx);
bool ckpt_workers_stopping(ckpt_workers *w);

#endif
