/*
 * Timing for the benchmarks: a monotonic clock and the median of repeats
 * (the machines are shared and noisy, so medians, never means).
 */
#ifndef SPMD_BENCH_TIME_H
#define SPMD_BENCH_TIME_H

#include <stdlib.h>
#include <time.h>

static inline double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* CPU time of every thread of the process: on a machine shared past its
 * cores, what a step cost while its threads ran. */
static inline double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v. */
static inline double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

#endif
