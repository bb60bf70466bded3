/*
 * Configuration: which micro-kernels run, with which cache blocking, on how
 * many threads.  The table below is the only place that binds kernels to
 * blocking sizes; the drivers read it through rd_context().
 *
 * Blocking: KC x NR of B (one micro-panel) stays in L1, MC x KC of packed A
 * in L2, KC x NC of packed B in L3.  Starting points are the published BLIS
 * Zen/Haswell float32 (6x16, MC=144, KC=256, NC=4080) and float64 (6x8,
 * MC=72, KC=256, NC=4080) values, tuned on the target machine class.
 */
#include "rd_kernel.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static const rd_context_t rd_ctx_ref = {
    "ref",
    {rd_sgemm_ref_6x16, 6, 16, 144, 256, 4080},
    {rd_dgemm_ref_6x8, 6, 8, 72, 256, 4080},
};

#ifdef RD_HAVE_X86_KERNELS
static const rd_context_t rd_ctx_avx2 = {
    "avx2",
    {rd_sgemm_avx2_6x16, 6, 16, 144, 256, 4080},
    {rd_dgemm_avx2_6x8, 6, 8, 72, 256, 4080},
};

static const rd_context_t rd_ctx_avx512 = {
    "avx512",
    {rd_sgemm_avx512_12x32, 12, 32, 144, 256, 4080},
    {rd_dgemm_avx512_12x16, 12, 16, 72, 256, 4080},
};
#endif

static const char *const rd_kernel_names[] = {
    "ref",
#ifdef RD_HAVE_X86_KERNELS
    "avx2",
    "avx512",
#endif
    NULL,
};

/* The configuration in force: a copy of one of the tables above, so that
 * set_blocking can tune it and set_kernel restores the table's values. */
static rd_context_t rd_active;
static int rd_active_ready = 0;

static rd_int
rd_round_up_int(rd_int x, rd_int unit)
{
    return (x + unit - 1) / unit * unit;
}

int
rd_cpu_has_avx2(void)
{
#ifdef RD_HAVE_X86_KERNELS
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

int
rd_cpu_has_avx512(void)
{
#ifdef RD_HAVE_X86_KERNELS
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

static const rd_context_t *
rd_best_context(void)
{
#ifdef RD_HAVE_X86_KERNELS
    if (rd_cpu_has_avx512())
        return &rd_ctx_avx512;
    if (rd_cpu_has_avx2())
        return &rd_ctx_avx2;
#endif
    return &rd_ctx_ref;
}

static void
rd_activate(const rd_context_t *table)
{
    rd_active = *table;
    rd_active_ready = 1;
}

const rd_context_t *
rd_context(void)
{
    if (!rd_active_ready)
        rd_activate(rd_best_context());
    return &rd_active;
}

int
rd_set_kernel(const char *name)
{
    if (strcmp(name, "auto") == 0) {
        rd_activate(rd_best_context());
        return 0;
    }
    if (strcmp(name, "ref") == 0) {
        rd_activate(&rd_ctx_ref);
        return 0;
    }
#ifdef RD_HAVE_X86_KERNELS
    if (strcmp(name, "avx2") == 0) {
        if (!rd_cpu_has_avx2())
            return -2;
        rd_activate(&rd_ctx_avx2);
        return 0;
    }
    if (strcmp(name, "avx512") == 0) {
        if (!rd_cpu_has_avx512())
            return -2;
        rd_activate(&rd_ctx_avx512);
        return 0;
    }
#endif
    return -1;
}

int
rd_set_blocking(int dtype_bytes, rd_int mc, rd_int kc, rd_int nc)
{
    rd_context_t *ctx = &rd_active;
    rd_context();
    if (mc < 1 || kc < 1 || nc < 1)
        return -1;
    if (dtype_bytes == 4) {
        ctx->s.mc = rd_round_up_int(mc, ctx->s.mr);
        ctx->s.kc = kc;
        ctx->s.nc = rd_round_up_int(nc, ctx->s.nr);
    }
    else if (dtype_bytes == 8) {
        ctx->d.mc = rd_round_up_int(mc, ctx->d.mr);
        ctx->d.kc = kc;
        ctx->d.nc = rd_round_up_int(nc, ctx->d.nr);
    }
    else
        return -1;
    return 0;
}

static rd_int rd_stream_min = RD_STREAM_MIN_BYTES;

rd_int
rd_get_stream_min_bytes(void)
{
    return rd_stream_min;
}

void
rd_set_stream_min_bytes(rd_int bytes)
{
    rd_stream_min = bytes;
}

const char *const *
rd_compiled_kernels(void)
{
    return rd_kernel_names;
}

/* ------------------------------------------------------------------ threads */

static int rd_threads = 0;

int
rd_have_openmp(void)
{
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

int
rd_get_num_threads(void)
{
    if (rd_threads <= 0) {
        int n = 1;
        const char *env = getenv("RAGGEDDOT_NUM_THREADS");
        if (env != NULL && atoi(env) > 0)
            n = atoi(env);
#ifdef _OPENMP
        else
            n = omp_get_max_threads();
#endif
        rd_threads = n > 0 ? n : 1;
    }
#ifndef _OPENMP
    return 1;
#else
    return rd_threads;
#endif
}

void
rd_set_num_threads(int n)
{
    rd_threads = n > 0 ? n : 0;
}
