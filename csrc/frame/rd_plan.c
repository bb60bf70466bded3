/*
 * Per-call plans: the shape class of a grouped product, the default
 * choices the cost model below makes for it, the candidates a tuner times,
 * and the table of tuned plans that every call consults.
 *
 * The cost model.  A plan chooses the register block's use, the cache
 * blocking, the tiling and the threads from the class alone, so that the
 * choice is deterministic and a tuned entry covers every call of the class:
 *   - Tiles or vectors (tile types only): tiles by default, but the vector
 *     kernels (RD_KIND_VECTOR, with the tile's KC) for int8 at fewer than 8
 *     rows a group; a tuned plan may take them for any class.
 *   - B packed or read in place.  Packing B copies each KC x NC panel of a
 *     group once per row tile, a pass over memory that the products of the
 *     tile then wait for; for a few rows a group that pass is the whole
 *     cost.  Groups of fewer than 8 rows on average (bucket <= 3) read B
 *     where it lies, row after row, with the streaming kernel (rd_sukr_t):
 *     measured on Zen4, decoding shapes (1-4 rows an expert) read the
 *     weights at 80-100% of the read bandwidth this way against 45-55%
 *     packed, while at 8 and 16 rows the packed register-blocked kernel
 *     was faster (its products run at twice the streaming kernel's rate).
 *   - The contraction blocks stay the kernel's: prepacked weights are laid
 *     out in them, and a product on prepacked weights equals the one on
 *     the weights themselves bit for bit only with the same blocks.  (At
 *     16 rows a group KC 128 ran 13% faster than 512 on Zen4, the next
 *     block of B that the kernels request, rd_ahead, fitting in L2 beside
 *     the one they read: a tuned plan may take it.)
 *   - The tile split.  A tile never mixes groups, so the row tiles of a
 *     group of r rows are at most r rows: the revisit model (megablox's
 *     N / (N + G (1 - 1/T))) says that row tiles larger than a group waste
 *     nothing here (the micro-kernel's 4/8/12-row bodies run only the rows a
 *     group has) but give the threads fewer tiles, so small groups split
 *     along n.
 *   - Teams.  A group of more than max(threads, 4) x MC rows is run by all
 *     threads together (frame/rd_tiling.c): B packed once and shared, where
 *     row tiles of their own would each pack all of it (a dense 2048^3
 *     product on 2 threads packed B 8 times; measured on Zen4, 89% of the
 *     FMA peak with the team against 80%).
 *   - Threads.  A product under RD_TEAM_MIN_FLOPS and RD_TEAM_MIN_BYTES runs
 *     on one thread (rd_frame.h).
 */
#include "rd_frame.h"
#include "rd_playout.h"

#include <stdint.h>
#include <string.h>

/* Groups of fewer mean rows than this read B in place (the bucket of the
 * class: the bit length of the mean, so bucket <= 3 is < 8 rows). */
#define RD_STREAM_BUCKET 3

#define RD_PLAN_MAX 4096

static rd_pclass_t rd_plan_keys[RD_PLAN_MAX];
static rd_pchoice_t rd_plan_vals[RD_PLAN_MAX];
static int rd_plan_n = 0;
static rd_pclass_t rd_plan_log[RD_PLAN_LOG];
static int rd_plan_logged = 0, rd_plan_logging = 0;
static volatile char rd_plan_busy = 0;

static void
rd_plan_lock(void)
{
    while (__atomic_test_and_set(&rd_plan_busy, __ATOMIC_ACQUIRE))
        ;
}

static void
rd_plan_unlock(void)
{
    __atomic_clear(&rd_plan_busy, __ATOMIC_RELEASE);
}

const rd_family_t *
rd_family_named(const char *name)
{
    for (const rd_family_t *const *f = rd_families; *f != NULL; f++)
        if (strcmp((*f)->name, name) == 0)
            return *f;
    return NULL;
}

static int
rd_bit_length(rd_int x)
{
    int b = 0;
    for (; x > 0; x >>= 1)
        b++;
    return b;
}

void
rd_plan_class(rd_pclass_t *c, const rd_plan_t *plan, int mode, rd_int k, rd_int n, rd_int ng,
              const rd_int *bounds)
{
    rd_int nonempty = 0;
    for (rd_int g = 0; g < ng; g++)
        nonempty += bounds[g + 1] > bounds[g];
    memset(c, 0, sizeof *c);
    c->mode = mode;
    c->ct = plan->ct;
    c->family = plan->family;
    c->k = k;
    c->n = n;
    c->g = ng;
    c->bucket = nonempty > 0 ? rd_bit_length((bounds[ng] - bounds[0]) / nonempty) : 0;
    c->threads = plan->nthreads;
}

static int
rd_class_eq(const rd_pclass_t *a, const rd_pclass_t *b)
{
    return a->mode == b->mode && a->ct == b->ct && a->k == b->k && a->n == b->n && a->g == b->g
           && a->bucket == b->bucket && a->threads == b->threads && strcmp(a->family, b->family) == 0;
}

void
rd_plan_default(const rd_pclass_t *c, const rd_ukr_desc_t *k, const rd_sukr_desc_t *s,
                rd_pchoice_t *out)
{
    memset(out, 0, sizeof *out);
    const int few = c->mode == 0 && c->bucket <= RD_STREAM_BUCKET;
    out->kind = few && s != NULL && s->ukr != NULL ? RD_KIND_STREAM : RD_KIND_MAIN;
    /* int8 tiles at a few rows a group: the vector kernels (where a family
     * serves them: rd_plan_choose), which give the same bits with the
     * tile's KC.  A 16-row tile instruction spends its work on the rows a
     * group lacks, and the weights then stream slower than the vector
     * kernels read them: on an AMX Xeon at 16 threads, int8 x int8 at 1-4
     * rows an expert read 45-48% of the bandwidth on the tiles, and the
     * same weights with float rows (vector kernels doing more work a byte)
     * 49-64%.  bfloat16 tiles stay: their vector alternative's arithmetic
     * is another. */
    if (few && c->ct == RD_CT_U8S8TILE)
        out->kind = RD_KIND_VECTOR;
    /* rows of a group under a row tile's least (48): split along n */
    out->split = few ? RD_SPLIT_N : RD_SPLIT_M;
    out->team = 1;
    (void)k;
}

int
rd_plan_candidates(const rd_pclass_t *c, const rd_ukr_desc_t *k, const rd_sukr_desc_t *s,
                   rd_pchoice_t *out, int most)
{
    rd_pchoice_t d, all[12];
    int n = 0;
    rd_plan_default(c, k, s, &d);
    all[n++] = d;
    if (s != NULL && s->ukr != NULL && c->mode == 0) {
        all[n] = d;
        all[n++].kind = d.kind == RD_KIND_STREAM ? RD_KIND_MAIN : RD_KIND_STREAM;
    }
    if (rd_ctype_layout(c->ct) != (int)c->ct) {   /* a tile type: tiles or its vector alternative */
        all[n] = d;
        all[n++].kind = d.kind == RD_KIND_VECTOR ? RD_KIND_MAIN : RD_KIND_VECTOR;
    }
    for (rd_int kc = k->kc / 2; kc >= 64 && kc >= k->kc / 4; kc /= 2) {
        all[n] = d;
        all[n++].kc = kc;
    }
    all[n] = d;
    all[n++].kc = 2 * k->kc;
    all[n] = d;
    all[n++].split = d.split == RD_SPLIT_M ? RD_SPLIT_N : RD_SPLIT_M;
    if (c->threads > 1) {
        all[n] = d;
        all[n++].team = 0;
        all[n] = d;
        all[n++].threads = 1;
        all[n] = d;
        all[n++].threads = c->threads;
    }
    int count = n < most ? n : most;
    memcpy(out, all, sizeof(rd_pchoice_t) * (size_t)count);
    return count;
}

int
rd_plan_set(const rd_pclass_t *c, const rd_pchoice_t *choice)
{
    int rc = 0;
    rd_plan_lock();
    int i = 0;
    while (i < rd_plan_n && !rd_class_eq(&rd_plan_keys[i], c))
        i++;
    if (choice == NULL) {
        if (i < rd_plan_n) {
            rd_plan_n--;
            rd_plan_keys[i] = rd_plan_keys[rd_plan_n];
            rd_plan_vals[i] = rd_plan_vals[rd_plan_n];
        }
    }
    else if (i < rd_plan_n)
        rd_plan_vals[i] = *choice;
    else if (rd_plan_n < RD_PLAN_MAX) {
        rd_plan_keys[rd_plan_n] = *c;
        rd_plan_vals[rd_plan_n++] = *choice;
    }
    else
        rc = -1;
    rd_plan_unlock();
    return rc;
}

/* The table's entry of c into *out (1), or 0; the lock held. */
static int
rd_plan_find(const rd_pclass_t *c, rd_pchoice_t *out)
{
    for (int i = 0; i < rd_plan_n; i++)
        if (rd_class_eq(&rd_plan_keys[i], c)) {
            *out = rd_plan_vals[i];
            return 1;
        }
    return 0;
}

int
rd_plan_get(const rd_pclass_t *c, rd_pchoice_t *out)
{
    rd_plan_lock();
    const int found = rd_plan_find(c, out);
    rd_plan_unlock();
    return found;
}

int
rd_plan_count(void)
{
    return rd_plan_n;
}

int
rd_plan_entry(int i, rd_pclass_t *c, rd_pchoice_t *out)
{
    int ok = 0;
    rd_plan_lock();
    if (i >= 0 && i < rd_plan_n) {
        *c = rd_plan_keys[i];
        *out = rd_plan_vals[i];
        ok = 1;
    }
    rd_plan_unlock();
    return ok;
}

void
rd_plan_clear(void)
{
    rd_plan_lock();
    rd_plan_n = 0;
    rd_plan_unlock();
}

void
rd_plan_record(int on)
{
    rd_plan_lock();
    if (on)
        rd_plan_logged = 0;
    rd_plan_logging = on;
    rd_plan_unlock();
}

int
rd_plan_recorded(rd_pclass_t *out, int most)
{
    rd_plan_lock();
    int n = rd_plan_logged < most ? rd_plan_logged : most;
    memcpy(out, rd_plan_log, sizeof(rd_pclass_t) * (size_t)n);
    rd_plan_unlock();
    return n;
}

/* A call's class: logged when recording, and its entry looked up (1, with
 * *out filled), under one hold of the lock. */
static int
rd_plan_lookup(const rd_pclass_t *c, rd_pchoice_t *out)
{
    rd_plan_lock();
    if (rd_plan_logging) {
        int i = 0;
        while (i < rd_plan_logged && !rd_class_eq(&rd_plan_log[i], c))
            i++;
        if (i == rd_plan_logged && rd_plan_logged < RD_PLAN_LOG)
            rd_plan_log[rd_plan_logged++] = *c;
    }
    const int found = rd_plan_find(c, out);
    rd_plan_unlock();
    return found;
}

void
rd_plan_choose(rd_plan_t *plan, int mode, rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
               int prepacked, int streamable)
{
    rd_pclass_t c;
    rd_pchoice_t ch;
    rd_plan_class(&c, plan, mode, k, n, ng, bounds);
    if (!rd_plan_lookup(&c, &ch))
        rd_plan_default(&c, &plan->k, &plan->s, &ch);
    /* a tile type's vector alternative: prepacked weights only where it
     * reads their layout, with their blocking */
    if (ch.kind == RD_KIND_VECTOR && plan->alt_k.ukr != NULL
        && (!prepacked || (rd_ctype_layout(plan->alt_ct) == rd_ctype_layout(plan->ct)
                           && plan->alt_k.nr == plan->k.nr))) {
        const rd_int kc = plan->k.kc;
        const rd_family_t *alt = rd_family_named(plan->alt_family);
        plan->ct = plan->alt_ct;
        plan->family = plan->alt_family;
        plan->k = plan->alt_k;
        memset(&plan->s, 0, sizeof plan->s);
        memset(&plan->few, 0, sizeof plan->few);
        if (alt != NULL)
            plan->few = alt->few[plan->ct];
        /* the tile's KC, plain or prepacked: an int8 product's bits are
         * those of its blocks (RD_CT_U8S8TILE), and a prepacked product's
         * the plain one's */
        plan->k.kc = kc;
    }
    /* prepacked weights were laid out with this blocking, and are read in
     * place already */
    plan->kind = ch.kind == RD_KIND_STREAM && plan->s.ukr != NULL && streamable && !prepacked
                 ? RD_KIND_STREAM : RD_KIND_MAIN;
    plan->split = ch.split;
    rd_ukr_desc_t *kd = &plan->k;
    if (plan->kind == RD_KIND_STREAM) {
        kd->mr = plan->s.mr;
        kd->nr = plan->s.nr;
        kd->mc = rd_round_up(kd->mc, kd->mr);
        kd->nc = rd_round_up(kd->nc, kd->nr);
    }
    if (!prepacked) {
        const rd_int unit = rd_ctypes[plan->ct].k_unit;
        if (ch.mc > 0)
            kd->mc = rd_round_up(ch.mc, kd->mr);
        if (ch.kc > 0)
            kd->kc = rd_round_up(ch.kc, unit);
        if (ch.nc > 0)
            kd->nc = rd_round_up(ch.nc, kd->nr);
    }
    if (ch.tm > 0)
        plan->tm = ch.tm;
    if (ch.tn > 0)
        plan->tn = ch.tn;
    plan->team = ch.team;
    plan->auto_threads = ch.threads == 0;
    if (ch.threads > 0 && ch.threads < plan->nthreads)
        plan->nthreads = ch.threads;
}
