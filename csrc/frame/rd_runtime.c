/*
 * Runtime settings: which micro-kernel serves each compute type (chosen
 * from the table of config/rd_config.c), its cache blocking, the thread
 * count and the streaming threshold.  A call copies them into its own
 * rd_plan_t when it starts.
 *
 * The setters are called with the GIL held (from the binding), and so is
 * rd_plan_init, so a plan is always a consistent snapshot.
 */
#include "rd_frame.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The selection in force: per compute type, the family serving it and a
 * copy of its descriptor (set_blocking tunes the copy; set_kernel restores
 * the family's values). */
static const rd_family_t *rd_selected = NULL;     /* NULL: automatic */
static const rd_family_t *rd_serving[RD_CT_COUNT];
static rd_ukr_desc_t rd_active[RD_CT_COUNT];
static int rd_ready = 0;

/* The first family of the table this CPU runs that has a kernel for ct,
 * twins aside (the last row, "ref", has one for every type but the
 * dot-product ones: NULL for those when no family with the instruction
 * runs here). */
static const rd_family_t *
rd_best_for(rd_ctype_t ct)
{
    for (const rd_family_t *const *f = rd_families; *f != NULL; f++)
        if (!(*f)->twin && (*f)->types[ct].ukr != NULL && (*f)->runnable())
            return *f;
    return NULL;
}

/* Serve each compute type by `family` where it has a kernel; the types it
 * lacks go to the best family for them, except the dot-product types when
 * a family was named: those are then not used (their products take the
 * widening compute types), so that naming a float family forces the
 * widening path. */
/* Whether the bfloat16 dot-product kernels (vdpbf16ps) multiply faster
 * than the float32 kernels that widen bfloat16 operands: the instruction's
 * measured rate against the float32 FMA's (rd_bf16dot_vs_fma), once per
 * process.  Measured: 2x on AMD Zen4 (the dot kernels serve), 0.5x on
 * Intel's Xeons (the widening path is 1.5x faster there, so it serves). */
static double rd_bf16dot_ratio = -1.0;

double
rd_bf16dot_measured(void)
{
    if (rd_bf16dot_ratio < 0.0)
        rd_bf16dot_ratio = rd_bf16dot_vs_fma();
    return rd_bf16dot_ratio;
}

/* Bumped whenever the selection or a blocking changes (see rd_frame.h). */
static unsigned long rd_generation;

static void
rd_select(const rd_family_t *family)
{
    rd_generation++;
    for (int ct = 0; ct < RD_CT_COUNT; ct++) {
        const rd_family_t *f = family;
        if (f == NULL || f->types[ct].ukr == NULL)
            f = family != NULL && rd_ctype_optional(ct) ? NULL : rd_best_for((rd_ctype_t)ct);
        /* chosen automatically, vdpbf16ps serves only where it is the faster */
        if (family == NULL && (ct == RD_CT_BF16DP || ct == RD_CT_BF16MMA) && f != NULL
            && rd_bf16dot_measured() < 1.0)
            f = NULL;
        rd_serving[ct] = f;
        if (f != NULL)
            rd_active[ct] = f->types[ct];
        else
            memset(&rd_active[ct], 0, sizeof rd_active[ct]);
    }
    rd_selected = family;
    rd_ready = 1;
}

static void
rd_ensure(void)
{
    if (!rd_ready)
        rd_select(NULL);
}

unsigned long
rd_selection_generation(void)
{
    rd_ensure();
    return rd_generation;
}

static int
rd_served_now(rd_ctype_t ct)
{
    rd_ensure();
    return rd_serving[ct] != NULL;
}

int
rd_set_kernel(const char *name)
{
    if (strcmp(name, "auto") == 0) {
        rd_select(NULL);
        return 0;
    }
    for (const rd_family_t *const *f = rd_families; *f != NULL; f++) {
        if (strcmp((*f)->name, name) == 0) {
            if (!(*f)->runnable())
                return -2;
            rd_select(*f);
            return 0;
        }
    }
    return -1;
}

const char *
rd_get_kernel(void)
{
    rd_ensure();
    return rd_selected != NULL ? rd_selected->name : rd_serving[RD_CT_F32]->name;
}

const char *
rd_kernel_selection(void)
{
    rd_ensure();
    return rd_selected != NULL ? rd_selected->name : "auto";
}

const char *
rd_kernel_for(rd_ctype_t ct)
{
    rd_ensure();
    return rd_serving[ct] != NULL ? rd_serving[ct]->name : "none";
}

const rd_ukr_desc_t *
rd_active_kernel(rd_ctype_t ct, const char **family)
{
    rd_ensure();
    if (family != NULL)
        *family = rd_kernel_for(ct);
    return &rd_active[ct];
}

static rd_int
rd_round_up_to(rd_int x, rd_int unit)
{
    return (x + unit - 1) / unit * unit;
}

int
rd_set_blocking(rd_ctype_t ct, rd_int mc, rd_int kc, rd_int nc)
{
    rd_ensure();
    if (mc < 1 || kc < 1 || nc < 1 || rd_active[ct].ukr == NULL)
        return -1;
    rd_ukr_desc_t *k = &rd_active[ct];
    k->mc = rd_round_up_to(mc, k->mr);
    k->kc = kc;
    k->nc = rd_round_up_to(nc, k->nr);
    rd_generation++;
    return 0;
}


rd_ctype_t
rd_bf16_product(int exact)
{
    if (exact)
        return RD_CT_F32;
    if (rd_served_now(RD_CT_BF16TILE))
        return RD_CT_BF16TILE;
    if (rd_served_now(RD_CT_BF16MMA))
        return RD_CT_BF16MMA;
    return rd_served_now(RD_CT_BF16DP) ? RD_CT_BF16DP : RD_CT_F32;
}

rd_ctype_t
rd_float_product(rd_ctype_t base, rd_dtype_t a, rd_dtype_t b, int quantized, int exact)
{
    const int bf16_a = a == RD_BF16 || a == RD_F32_AS_BF16, bf16_b = b == RD_BF16 || b == RD_F32_AS_BF16;
    return base == RD_CT_F32 && !quantized && bf16_a && bf16_b ? rd_bf16_product(exact) : base;
}

rd_ctype_t
rd_int8_product(void)
{
    if (rd_served_now(RD_CT_U8S8TILE))
        return RD_CT_U8S8TILE;
    if (rd_served_now(RD_CT_U8S8MMA))
        return RD_CT_U8S8MMA;
    return rd_served_now(RD_CT_U8S8) ? RD_CT_U8S8 : RD_CT_I8I32;
}

rd_ctype_t
rd_layout_product(rd_ctype_t layout)
{
    if (layout == RD_CT_BF16DP && rd_served_now(RD_CT_BF16TILE))
        return RD_CT_BF16TILE;
    if (layout == RD_CT_U8S8 && rd_served_now(RD_CT_U8S8TILE))
        return RD_CT_U8S8TILE;
    return layout;
}

/* ---------------------------------------------------------- streaming */

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

/* ------------------------------------------------------------ threads */

static int rd_threads = 0;

/*
 * fork: GNU OpenMP's thread pool does not survive it, and a child that
 * starts a team of more than one thread after its parent ran one waits
 * forever for threads that are not there.  So a process forked after this
 * one may have used threads runs single-threaded (its results are the same:
 * they never depend on the thread count).
 */
static volatile int rd_threads_used = 0;   /* a team of > 1 may have run here */
static volatile int rd_forked = 0;         /* forked after that: one thread only */

/* pthread_atfork: every POSIX system (Linux, the BSDs, macOS, whose
 * compilers define __APPLE__ and not __unix__) */
#if defined(__unix__) || defined(__APPLE__)
#define RD_HAVE_ATFORK 1
#else
#define RD_HAVE_ATFORK 0
#endif

#if defined(_OPENMP) && RD_HAVE_ATFORK
#include <pthread.h>

static void
rd_atfork_child(void)
{
    if (rd_threads_used)
        rd_forked = 1;
}

static pthread_once_t rd_atfork_once = PTHREAD_ONCE_INIT;

static void
rd_register_atfork(void)
{
    (void)pthread_atfork(NULL, NULL, rd_atfork_child);
}
#endif

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
rd_forked_single_threaded(void)
{
    return rd_forked;
}

int
rd_team_size(int wanted)
{
#if defined(_OPENMP) && RD_HAVE_ATFORK
    pthread_once(&rd_atfork_once, rd_register_atfork);
#endif
    if (rd_forked || wanted < 2)
        return 1;
    rd_threads_used = 1;
    return wanted;
}

int
rd_get_num_threads(void)
{
#ifndef _OPENMP
    return 1;
#else
    if (rd_threads <= 0) {
        int n = 0;
        const char *env = getenv("RAGGEDDOT_NUM_THREADS");
        if (env != NULL)
            n = atoi(env);
        if (n <= 0)
            n = omp_get_max_threads();
        rd_threads = n > 0 ? n : 1;
    }
    /* more threads than the processors this process may run on only wait
     * for each other */
    const int procs = omp_get_num_procs();
    return rd_team_size(procs > 0 && rd_threads > procs ? procs : rd_threads);
#endif
}

void
rd_set_num_threads(int n)
{
    rd_threads = n > 0 ? n : 0;
}

/* -------------------------------------------------------------- plans */

void
rd_plan_init(rd_plan_t *plan, rd_ctype_t ct)
{
    const char *family;
    const rd_ukr_desc_t *k = rd_active_kernel(ct, &family);
    const rd_family_t *f = rd_family_named(family);
    plan->ct = ct;
    plan->family = family;
    plan->k = *k;
    memset(&plan->s, 0, sizeof plan->s);
    memset(&plan->few, 0, sizeof plan->few);
    if (f != NULL) {
        plan->s = f->stream[ct];
        plan->few = f->few[ct];
    }
    plan->kind = RD_KIND_MAIN;
    plan->split = RD_SPLIT_M;
    plan->auto_threads = 1;
    plan->team = 1;
    plan->tm = 0;
    plan->tn = 0;
    plan->nthreads = rd_get_num_threads();
    plan->stream_min = rd_stream_min;
    /* a tile type's vector alternative: the dot type that reads its B
     * layout where served; for bfloat16, else the widening float32 kernels */
    memset(&plan->alt_k, 0, sizeof plan->alt_k);
    plan->alt_ct = ct;
    plan->alt_family = "none";
    if (rd_ctype_layout(ct) != (int)ct) {
        rd_ctype_t alt = (rd_ctype_t)rd_ctype_layout(ct);
        if (!rd_served_now(alt) && ct == RD_CT_BF16TILE)
            alt = RD_CT_F32;
        if (rd_served_now(alt)) {
            plan->alt_ct = alt;
            plan->alt_k = *rd_active_kernel(alt, &plan->alt_family);
        }
    }
}
