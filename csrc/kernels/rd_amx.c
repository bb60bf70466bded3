/*
 * AMX tile micro-kernels (Intel Sapphire Rapids and later), written once
 * over the tile operations (kernels/rd_amx_body.h) and compiled twice:
 * with the instructions (family "amx", where the CPU has AMX and the OS
 * grants the process its tile state) and with their emulation in C
 * (family "amx-twin", runnable on every CPU, chosen only by name), so that
 * the packing, the chunking of the contraction, the edges and the
 * epilogues are tested everywhere.
 *
 *   rd_amx_bf16 / rd_amxtwin_bf16  (RD_CT_BF16TILE, 32 x 32): TDPBF16PS
 *   rd_amx_u8s8 / rd_amxtwin_u8s8  (RD_CT_U8S8TILE, 32 x 32): TDPBUSD
 *
 * The tile state, as Linux requires it:
 *   - the process asks once for permission to use it (arch_prctl
 *     ARCH_REQ_XCOMP_PERM for XTILEDATA; without it the first tile
 *     instruction raises SIGILL).  A CPU without AMX, an OS that does not
 *     enable its state or a refused request leaves the family not runnable,
 *     and rd_amx_unavailable() says which;
 *   - the tile configuration (palette 1, eight tiles of 16 rows x 64 bytes)
 *     is per thread: a kernel loads it when its thread has not yet
 *     (TENTER), so every OpenMP worker, and a thread some other library
 *     started, configures itself before its first tile operation;
 *   - the driver calls the descriptor's release hook on each thread that
 *     ran a tile kernel once its share of the call is done: TILERELEASE
 *     returns the state to its initial one, so no configuration outlives a
 *     call (the next call loads it again, a few dozen cycles).
 *
 * The twin's arithmetic: int8 exactly as the instruction (products of
 * unsigned and signed bytes summed in int32, modulo 2^32).  bfloat16: the
 * instruction's order of additions inside a tile is not documented and
 * matches none of the simple models measured (SPEC), so the twin takes the
 * order of Intel's pseudocode: per pair the even element's product, then
 * the odd one's, each added with one rounding to nearest even (a fused
 * multiply-add: the products of bfloat16 values are exact), denormal
 * inputs (and a denormal accumulator) read as 0 and denormal results
 * flushed to 0.  Native and twin then agree bit for bit wherever every
 * partial sum is exact, and both stay within the error bound of a float32
 * sum elsewhere.
 */
#include "rd_frame.h"

#ifdef RD_HAVE_X86_KERNELS

#include <cpuid.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ------------------------------------------------------------ the OS */

#define RD_ARCH_REQ_XCOMP_PERM 0x1023
#define RD_XFEATURE_XTILEDATA 18

static pthread_once_t rd_amx_once = PTHREAD_ONCE_INIT;
static int rd_amx_ok = 0;
static char rd_amx_why[160] = "";

/* The permission request: the system call, or (rd_amx_simulate_refusal,
 * for tests) a refusal with a chosen errno. */
static int rd_amx_refusal = 0;

#ifdef SYS_arch_prctl
static long
rd_amx_request(void)
{
    if (rd_amx_refusal != 0) {
        errno = rd_amx_refusal;
        return -1;
    }
    return syscall(SYS_arch_prctl, RD_ARCH_REQ_XCOMP_PERM, RD_XFEATURE_XTILEDATA);
}
#endif

static void
rd_amx_probe(void)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, NULL) < 7) {
        snprintf(rd_amx_why, sizeof rd_amx_why, "the CPU has no AMX (cpuid leaf 7 absent)");
        return;
    }
    __cpuid_count(7, 0, a, b, c, d);
    const int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1, int8 = (d >> 25) & 1;
    if (!tile || !bf16 || !int8) {
        snprintf(rd_amx_why, sizeof rd_amx_why, "the CPU has no AMX (cpuid: AMX-TILE %d, AMX-BF16 %d, AMX-INT8 %d)",
                 tile, bf16, int8);
        return;
    }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) {
        snprintf(rd_amx_why, sizeof rd_amx_why, "the CPU has AMX but not AVX-512F/BW");
        return;
    }
    /* the OS enables the tile state in XCR0 (bits 17: TILECFG, 18: TILEDATA) */
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) {
        snprintf(rd_amx_why, sizeof rd_amx_why, "the OS does not enable the AMX tile state (XCR0 = 0x%x)", lo);
        return;
    }
#ifdef SYS_arch_prctl
    if (rd_amx_request() != 0) {
        const int e = errno;
        /* ENOSPC: some thread's alternate signal stack (sigaltstack) is too
         * small for a signal frame that holds the tile state */
        snprintf(rd_amx_why, sizeof rd_amx_why, "the kernel refused the AMX tile state "
                 "(arch_prctl ARCH_REQ_XCOMP_PERM: %s%s)", strerror(e),
                 e == ENOSPC ? ": a thread's sigaltstack is too small for the tile state" : "");
        return;
    }
    rd_amx_ok = 1;
#else
    snprintf(rd_amx_why, sizeof rd_amx_why, "no arch_prctl system call on this OS");
#endif
    (void)hi;
}

const char *
rd_amx_unavailable(void)
{
    pthread_once(&rd_amx_once, rd_amx_probe);
    return rd_amx_ok ? NULL : rd_amx_why;
}

void
rd_amx_simulate_refusal(int err)
{
    pthread_once(&rd_amx_once, rd_amx_probe);
    rd_amx_refusal = err;
    rd_amx_ok = 0;
    rd_amx_why[0] = '\0';
    rd_amx_probe();
}

static int
rd_amx_runnable(void)
{
    return rd_amx_unavailable() == NULL;
}

static int
rd_always(void)
{
    return 1;
}

/* Palette 1: eight tiles of 16 rows x 64 bytes (LDTILECFG's 64-byte block:
 * byte 0 the palette, bytes 16-31 colsb[8] as uint16, bytes 48-55 rows[8]). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} rd_tilecfg_t;

static const rd_tilecfg_t rd_tilecfg = {
    1, 0, {0},
    {64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0},
    {16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0},
};

/* ------------------------------------------------------ native tiles */

static __thread int rd_amx_loaded = 0;

#define RD_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,amx-int8,avx512f,avx512bw")))

RD_AMX_TARGET static inline void
rd_amx_enter(void)
{
    if (!rd_amx_loaded) {
        __asm__ volatile("ldtilecfg %0" : : "m"(rd_tilecfg) : "memory");
        rd_amx_loaded = 1;
    }
}

RD_AMX_TARGET static void
rd_amx_release(void)
{
    if (rd_amx_loaded) {
        __asm__ volatile("tilerelease" ::: "memory");
        rd_amx_loaded = 0;
    }
}

/* loads and stores that the compiler orders with the memory they touch */
#define TLOAD(t, p, s)                                                      \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t                        \
                     : : "r"((const void *)(p)), "r"((long)(s)) : "memory")
#define TSTORE(t, p, s)                                                     \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)"                    \
                     : : "r"((void *)(p)), "r"((long)(s)) : "memory")
#define TZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define TDPBF16(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define TDPBUSD(c, a, b) __asm__ volatile("tdpbusd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define TENTER() rd_amx_enter()
#define RD_TNAME(x) rd_amx_##x
#define RD_TTARGET RD_AMX_TARGET
#include "rd_amx_body.h"   /* (which undefines the macros above) */

/* -------------------------------------------------------- twin tiles */

/* The emulated tile registers of a thread, and whether its configuration is
 * loaded.  rd_amx_twin_held counts the threads holding one now,
 * rd_amx_twin_strays the tile operations run without one (a driver that
 * forgot TENTER or ran a kernel after the release): both 0 between calls. */
typedef struct {
    unsigned char r[16][64];
} rd_tile_t;

static __thread rd_tile_t rd_tmm[8];
static __thread int rd_twin_loaded = 0;
static int rd_amx_twin_held = 0;
static long rd_amx_twin_strays = 0;

static void
rd_twin_enter(void)
{
    if (!rd_twin_loaded) {
        memset(rd_tmm, 0, sizeof rd_tmm);
        rd_twin_loaded = 1;
        __atomic_add_fetch(&rd_amx_twin_held, 1, __ATOMIC_RELAXED);
    }
}

static void
rd_twin_release(void)
{
    if (rd_twin_loaded) {
        rd_twin_loaded = 0;
        __atomic_sub_fetch(&rd_amx_twin_held, 1, __ATOMIC_RELAXED);
    }
}

void
rd_amx_twin_state(int *held, long *strays)
{
    *held = __atomic_load_n(&rd_amx_twin_held, __ATOMIC_RELAXED);
    *strays = __atomic_load_n(&rd_amx_twin_strays, __ATOMIC_RELAXED);
}

static inline void
rd_twin_check(void)
{
    if (!rd_twin_loaded)
        __atomic_add_fetch(&rd_amx_twin_strays, 1, __ATOMIC_RELAXED);
}

static void
rd_twin_load(rd_tile_t *t, const void *p, long stride)
{
    rd_twin_check();
    for (int i = 0; i < 16; i++)
        memcpy(t->r[i], (const char *)p + i * stride, 64);
}

static void
rd_twin_store(const rd_tile_t *t, void *p, long stride)
{
    rd_twin_check();
    for (int i = 0; i < 16; i++)
        memcpy((char *)p + i * stride, t->r[i], 64);
}

static void
rd_twin_zero(rd_tile_t *t)
{
    rd_twin_check();
    memset(t, 0, sizeof *t);
}

static inline float
rd_bf16_daz(uint16_t h)
{
    uint32_t u = (h & 0x7f80u) == 0 ? (uint32_t)(h & 0x8000u) << 16 : (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* 0 for a denormal float (sign kept): the flush of inputs and results */
static inline float
rd_ftz(float x)
{
    return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x;
}

/* C[16 x 16] float32 += A[16 x 16 pairs] . B[16 pair rows x 16 columns],
 * pair by pair, even element first, a correctly rounded fused
 * multiply-add each (hardware FMA in the clones that have it, libm's
 * otherwise: the same values). */
__attribute__((target_clones("arch=haswell", "default"))) static void
rd_twin_dpbf16(rd_tile_t *ct, const rd_tile_t *at, const rd_tile_t *bt)
{
    rd_twin_check();
    float b[16][32];
    for (int q = 0; q < 16; q++)
        for (int e = 0; e < 32; e++) {
            uint16_t h;
            memcpy(&h, bt->r[q] + 2 * e, 2);
            b[q][e] = rd_bf16_daz(h);
        }
    for (int i = 0; i < 16; i++) {
        float acc[16], a[32];
        memcpy(acc, ct->r[i], 64);
        for (int j = 0; j < 16; j++)
            acc[j] = rd_ftz(acc[j]);
        for (int p = 0; p < 32; p++) {
            uint16_t h;
            memcpy(&h, at->r[i] + 2 * p, 2);
            a[p] = rd_bf16_daz(h);
        }
        for (int q = 0; q < 16; q++)
            for (int e = 0; e < 2; e++)
                for (int j = 0; j < 16; j++)
                    acc[j] = rd_ftz(fmaf(a[2 * q + e], b[q][2 * j + e], acc[j]));
        memcpy(ct->r[i], acc, 64);
    }
}

/* C[16 x 16] int32 += A[16 x 16 quads] (unsigned) . B[16 quad rows x 16
 * columns] (signed), modulo 2^32. */
__attribute__((target_clones("arch=haswell", "default"))) static void
rd_twin_dpbusd(rd_tile_t *ct, const rd_tile_t *at, const rd_tile_t *bt)
{
    rd_twin_check();
    for (int i = 0; i < 16; i++) {
        uint32_t acc[16];
        memcpy(acc, ct->r[i], 64);
        for (int q = 0; q < 16; q++)
            for (int j = 0; j < 16; j++) {
                uint32_t s = 0;
                for (int e = 0; e < 4; e++)
                    s += (uint32_t)((int32_t)at->r[i][4 * q + e] * (int32_t)(int8_t)bt->r[q][4 * j + e]);
                acc[j] += s;
            }
        memcpy(ct->r[i], acc, 64);
    }
}

#define TLOAD(t, p, s) rd_twin_load(&rd_tmm[t], (p), (long)(s))
#define TSTORE(t, p, s) rd_twin_store(&rd_tmm[t], (p), (long)(s))
#define TZERO(t) rd_twin_zero(&rd_tmm[t])
#define TDPBF16(c, a, b) rd_twin_dpbf16(&rd_tmm[c], &rd_tmm[a], &rd_tmm[b])
#define TDPBUSD(c, a, b) rd_twin_dpbusd(&rd_tmm[c], &rd_tmm[a], &rd_tmm[b])
#define TENTER() rd_twin_enter()
#define RD_TNAME(x) rd_amxtwin_##x
#define RD_TTARGET
#include "rd_amx_body.h"   /* (which undefines the macros above) */

/* ------------------------------------------------------------- families */

/* Blocking: a 32 x 32 block (four accumulator tiles, the most eight tiles
 * allow beside two of A and two of B).  KC keeps a B micro-panel in L1
 * (bfloat16: 256 steps x 32 columns = 16 KiB; int8: 512 steps, 16 KiB)
 * beside the A micro-panel being read, MC = 128 rows of A (64-128 KiB) in
 * L2, NC = 4096 columns.  Chosen from the tile facts (SPEC section 6), not
 * measured here: the tuner's candidates (KC / 2, KC / 4, ...) and the plan
 * table take a measured blocking per shape class. */
#define RD_AMX_BF16_DESC(UKR, REL) {UKR, 32, 32, 128, 256, 4096, REL}
#define RD_AMX_U8S8_DESC(UKR, REL) {UKR, 32, 32, 128, 512, 4096, REL}

const rd_family_t rd_family_amx = {
    "amx", rd_amx_runnable,
    {[RD_CT_BF16TILE] = RD_AMX_BF16_DESC(rd_amx_bf16, rd_amx_release),
     [RD_CT_U8S8TILE] = RD_AMX_U8S8_DESC(rd_amx_u8s8, rd_amx_release)},
    0, {{NULL, 0, 0}},
};
const rd_family_t rd_family_amx_twin = {
    "amx-twin", rd_always,
    {[RD_CT_BF16TILE] = RD_AMX_BF16_DESC(rd_amxtwin_bf16, rd_twin_release),
     [RD_CT_U8S8TILE] = RD_AMX_U8S8_DESC(rd_amxtwin_u8s8, rd_twin_release)},
    1, {{NULL, 0, 0}},
};

#else /* no x86 kernels */

const char *
rd_amx_unavailable(void)
{
    return "not an x86-64 build";
}

void
rd_amx_simulate_refusal(int err)
{
    (void)err;
}

void
rd_amx_twin_state(int *held, long *strays)
{
    *held = 0;
    *strays = 0;
}

#endif /* RD_HAVE_X86_KERNELS */
