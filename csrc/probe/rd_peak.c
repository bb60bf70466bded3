/*
 * Peak probes: how many GFLOP/s one thread sustains with an instruction,
 * timed over independent chains that keep every pipe busy.  The benchmarks
 * state the kernels' speed as a fraction of these; the kernels never call
 * them.
 *
 *   "avx2"   : 12 chains of 256-bit float32 FMAs (the AVX2 6x16 kernel's ceiling)
 *   "avx512" : 24 chains of 512-bit float32 FMAs (the AVX-512 12x32 kernel's ceiling)
 *   "avx512_bf16": 16 chains of vdpbf16ps (64 flops each: 16 lanes x 2 products x 2)
 *   "avx512_vnni": 16 chains of 512-bit vpdpbusd (128 int8 ops each: 16 x 4 x 2)
 *   "avx_vnni"   : 12 chains of 256-bit vpdpbusd (64 ops each)
 *   "amx_bf16"   : 4 accumulator tiles of TDPBF16PS (16384 flops each)
 *   "amx_int8"   : 4 accumulator tiles of TDPBUSD (32768 ops each)
 *   "neon"       : 24 chains of fmla by element (8 flops each)
 *   "neon_bf16"  : 24 chains of BFMMLA (2 x 2 x 4 products: 32 flops each)
 *   "neon_dot"   : 24 chains of UDOT by element (32 int8 ops each)
 *   "neon_i8mm"  : 24 chains of USMMLA (2 x 2 x 8 products: 64 ops each)
 * (0 where the CPU, or for AMX the OS, does not run the instruction.)
 */
#include "rd_frame.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double
rd_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#if defined(RD_HAVE_X86_KERNELS) || defined(RD_HAVE_ARM_KERNELS)
/* The rate of the bfloat16 dot instruction (probe `dot`) over that of the
 * float32 FMAs (`fma`), in flops: one thread, each probe run for a
 * millisecond (whole chunks of `chunk` iterations), best of five rounds
 * after both have run once (the vector unit awake, their code and data
 * paged in).  Single chunks of a fraction of a millisecond, best of three,
 * read 0.7-1.5 where the sustained ratio is 1.7 (an instrumented build,
 * measured), and their decision flipped.  About 12 ms, once a process.
 * rd_bf16dot_vs_fma of each architecture. */
static double
rd_dot_over_fma(double (*fma)(double, long), double (*dot)(double, long), long chunk)
{
    double f_best = 0.0, d_best = 0.0;
    (void)fma(0.0, chunk);
    (void)dot(0.0, chunk);
    for (int round = 0; round < 5; round++) {
        const double f = fma(1e-3, chunk), d = dot(1e-3, chunk);
        f_best = f > f_best ? f : f_best;
        d_best = d > d_best ? d : d_best;
    }
    return f_best > 0.0 ? d_best / f_best : 0.0;
}
#endif

#ifdef RD_HAVE_X86_KERNELS
#include <immintrin.h>

#define CHAINS4(X) X(0) X(1) X(2) X(3)
#define CHAINS12(X) CHAINS4(X) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/* Distinct starting values: identical chains would be merged into one by
 * the compiler, and the probe would time a single chain.  The chains are
 * summed at the end so that the loop cannot be removed. */
#define RD_PROBE(NAME, TARGET, V, SET1, FMA, ADD, STOREU, LANES, PER_STEP, DECL, STEP) \
__attribute__((target(TARGET))) static double                               \
NAME(double seconds, long chunk)                                            \
{                                                                           \
    CHAINS12(DECL)                                                          \
    const V mul = SET1(0.9999999f), add = SET1(1e-7f);                      \
    long iters = 0;                                                         \
    double t0 = rd_now(), t1;                                               \
    do {                                                                    \
        for (long i = 0; i < chunk; i++) {                                  \
            CHAINS12(STEP)                                                  \
        }                                                                   \
        iters += chunk;                                                     \
        t1 = rd_now();                                                      \
    } while (t1 - t0 < seconds);                                            \
    V s = SET1(0.0f);                                                       \
    CHAINS12(SUM)                                                           \
    float sink[LANES];                                                      \
    STOREU(sink, s);                                                        \
    volatile float keep = sink[0];                                          \
    (void)keep;                                                             \
    return (double)iters * (PER_STEP) * 2.0 * (LANES) / (t1 - t0) / 1e9;    \
}

/* AVX2: one chain per index */
#define DECL2(i) __m256 x##i = _mm256_set1_ps(1.0f + 0.01f * (i));
#define STEP2(i) x##i = _mm256_fmadd_ps(x##i, mul, add);
#define SUM(i) s = ADD_(s, x##i);
#define ADD_ _mm256_add_ps
RD_PROBE(rd_peak_avx2, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps,
         _mm256_storeu_ps, 8, 12.0, DECL2, STEP2)
#undef ADD_
#undef SUM

/* AVX-512: two chains per index */
#define DECL512(i) __m512 x##i = _mm512_set1_ps(1.0f + 0.01f * (i)), \
                          y##i = _mm512_set1_ps(1.5f + 0.01f * (i));
#define STEP512(i) x##i = _mm512_fmadd_ps(x##i, mul, add); y##i = _mm512_fmadd_ps(y##i, mul, add);
#define SUM(i) s = _mm512_add_ps(s, _mm512_add_ps(x##i, y##i));
RD_PROBE(rd_peak_avx512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps,
         _mm512_storeu_ps, 16, 24.0, DECL512, STEP512)
#undef SUM

/* Dot-product instructions: each chain acc = dot(acc, x, y) with constant
 * operands (the values do not matter to the timing; the int32 sums wrap),
 * `OPS` operations an instruction; the chains are summed into one lane
 * vector at the end so that none can be removed. */
#define RD_DOT_PROBE(NAME, TARGET, V, ZERO, DOT, ADD, OPS, DECL, X, Y, CHAINS) \
__attribute__((target(TARGET))) static double                               \
NAME(double seconds, long chunk)                                            \
{                                                                           \
    CHAINS(DECL)                                                            \
    const V x = X, y = Y;                                                   \
    long iters = 0;                                                         \
    double t0 = rd_now(), t1;                                               \
    do {                                                                    \
        for (long i = 0; i < chunk; i++) {                                  \
            CHAINS(DSTEP)                                                   \
        }                                                                   \
        iters += chunk;                                                     \
        t1 = rd_now();                                                      \
    } while (t1 - t0 < seconds);                                            \
    V s = ZERO;                                                             \
    CHAINS(DSUM)                                                            \
    int32_t sink[sizeof(V) / 4];                                            \
    memcpy(sink, &s, sizeof sink);                                          \
    volatile int32_t keep = sink[0];                                        \
    (void)keep;                                                             \
    return (double)iters * (double)(OPS) / (t1 - t0) / 1e9;                 \
}

#define CHAINS16(X) CHAINS12(X) X(12) X(13) X(14) X(15)
#define DSTEP(i) z##i = DOT_(z##i, x, y);
#define DSUM(i) s = ADD_(s, z##i);

#define DECL_BF(i) __m512 z##i = _mm512_set1_ps(0.01f * (float)(i));
#define DOT_(acc, a, b) _mm512_dpbf16_ps(acc, (__m512bh)(a), (__m512bh)(b))
#define ADD_ _mm512_add_ps
RD_DOT_PROBE(rd_peak_bf16, "avx512f,avx512bf16", __m512, _mm512_setzero_ps(), DOT_, ADD_,
             16.0 * 64.0, DECL_BF, _mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f), CHAINS16)
#undef DOT_
#undef ADD_

/* (the instruction with its accumulator tied, as the kernels write it) */
__attribute__((target("avx512f,avx512vnni"))) static inline __m512i
rd_vnni512_step(__m512i acc, __m512i a, __m512i b)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

__attribute__((target("avx2"))) static inline __m256i
rd_vnni256_step(__m256i acc, __m256i a, __m256i b)
{
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    return acc;
}

#define DECL_VNNI(i) __m512i z##i = _mm512_set1_epi32(i);
#define DOT_ rd_vnni512_step
#define ADD_ _mm512_add_epi32
RD_DOT_PROBE(rd_peak_vnni512, "avx512f,avx512vnni", __m512i, _mm512_setzero_si512(), DOT_, ADD_,
             16.0 * 128.0, DECL_VNNI, _mm512_set1_epi8(3), _mm512_set1_epi8(-5), CHAINS16)
#undef DOT_
#undef ADD_

#define DECL_VNNI256(i) __m256i z##i = _mm256_set1_epi32(i);
#define DOT_ rd_vnni256_step
#define ADD_ _mm256_add_epi32
RD_DOT_PROBE(rd_peak_vnni256, "avx2", __m256i, _mm256_setzero_si256(), DOT_, ADD_,
             12.0 * 64.0, DECL_VNNI256, _mm256_set1_epi8(3), _mm256_set1_epi8(-5), CHAINS12)
#undef DOT_
#undef ADD_
/* AMX: four independent accumulator tiles (0-3), each += tile 4 . tile 6
 * per instruction (TDPBF16PS: 16 x 16 x 32 multiply-adds, 16384 flops;
 * TDPBUSD: 16 x 16 x 64, 32768 ops), the configuration loaded for the run
 * and released after it. */
static const struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} rd_probe_tilecfg = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0},
                      {16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0}};

#define RD_AMX_PROBE(NAME, INSN, OPS)                                       \
static double                                                               \
NAME(double seconds)                                                        \
{                                                                           \
    static const uint8_t ones[16 * 64] __attribute__((aligned(64))) = {0};  \
    const long chunk = 1L << 14;                                            \
    long iters = 0;                                                         \
    __asm__ volatile("ldtilecfg %0" : : "m"(rd_probe_tilecfg) : "memory");  \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm4" : : "r"(ones), "r"(64L) : "memory"); \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm6" : : "r"(ones), "r"(64L) : "memory"); \
    __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::); \
    double t0 = rd_now(), t1;                                               \
    do {                                                                    \
        for (long i = 0; i < chunk; i++)                                    \
            __asm__ volatile(INSN " %%tmm6, %%tmm4, %%tmm0\n\t"              \
                             INSN " %%tmm6, %%tmm4, %%tmm1\n\t"              \
                             INSN " %%tmm6, %%tmm4, %%tmm2\n\t"              \
                             INSN " %%tmm6, %%tmm4, %%tmm3" ::);            \
        iters += chunk;                                                     \
        t1 = rd_now();                                                      \
    } while (t1 - t0 < seconds);                                            \
    __asm__ volatile("tilerelease" ::: "memory");                           \
    return (double)iters * 4.0 * (OPS) / (t1 - t0) / 1e9;                   \
}
RD_AMX_PROBE(rd_peak_amx_bf16, "tdpbf16ps", 16384.0)
RD_AMX_PROBE(rd_peak_amx_int8, "tdpbusd", 32768.0)

double
rd_bf16dot_vs_fma(void)
{
    return rd_cpu()->avx512_bf16 ? rd_dot_over_fma(rd_peak_avx512, rd_peak_bf16, 1L << 13) : 0.0;
}
#elif defined(RD_HAVE_ARM_KERNELS)
#include <arm_neon.h>

#include "kernels/rd_neon_insn.h"

#define CHAINS12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define CHAINS24(X) CHAINS12(X) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)

/* The timed loop of a probe: 24 independent chains (the kernels' 24
 * accumulators) of STEP, `ops` operations an instruction; the chains are
 * summed at the end (SUM) so that none can be removed. */
#define RD_NEON_LOOP(STEP, SUM, ops)                                        \
    long iters = 0;                                                         \
    double t0 = rd_now(), t1;                                               \
    do {                                                                    \
        for (long i = 0; i < chunk; i++) {                                  \
            CHAINS24(STEP)                                                  \
        }                                                                   \
        iters += chunk;                                                     \
        t1 = rd_now();                                                      \
    } while (t1 - t0 < seconds);                                            \
    CHAINS24(SUM)                                                           \
    int32_t sink[4];                                                        \
    memcpy(sink, &s, sizeof sink);                                          \
    volatile int32_t keep = sink[0];                                        \
    (void)keep;                                                             \
    return (double)iters * 24.0 * (ops) / (t1 - t0) / 1e9;

/* fmla by element: 4 lanes x 2 flops */
#define FDECL(i) float32x4_t z##i = vdupq_n_f32(1.0f + 0.01f * (float)(i));
#define FSTEP(i) z##i = vfmaq_laneq_f32(z##i, x, y, 1);
#define FSUM(i) s = vaddq_f32(s, z##i);
static double
rd_peak_neon(double seconds, long chunk)
{
    const float32x4_t x = vdupq_n_f32(0.9999999f), y = vdupq_n_f32(1e-7f);
    float32x4_t s = vdupq_n_f32(0.0f);
    CHAINS24(FDECL)
    RD_NEON_LOOP(FSTEP, FSUM, 8.0)
}

/* BFMMLA (the neon-bf16 kernel's): 2 x 2 x 4 products, 32 flops */
#define BSTEP(i) RD_BFMMLA(z##i, x, y);
static double
rd_peak_neon_bf16(double seconds, long chunk)
{
    const uint16x8_t x = vdupq_n_u16(0x3f00), y = vdupq_n_u16(0x3e80);   /* 0.5, 0.25 */
    float32x4_t s = vdupq_n_f32(0.0f);
    CHAINS24(FDECL)
    RD_NEON_LOOP(BSTEP, FSUM, 32.0)
}

/* UDOT by element (neon-dot's): 4 lanes x 4 products x 2 ops; USMMLA
 * (neon-i8mm's): 2 x 2 x 8 products, 64 ops (int32 sums wrap) */
#define IDECL(i) int32x4_t z##i = vdupq_n_s32(i);
#define ISUM(i) s = vaddq_s32(s, z##i);
#define SSTEP(i) RD_UDOT(z##i, x, y, 1);
#define USTEP(i) RD_USMMLA(z##i, y, x);
static double
rd_peak_neon_dot(double seconds, long chunk)
{
    const uint8x16_t x = vdupq_n_u8(3), y = vdupq_n_u8(5);
    int32x4_t s = vdupq_n_s32(0);
    CHAINS24(IDECL)
    RD_NEON_LOOP(SSTEP, ISUM, 32.0)
}

static double
rd_peak_neon_i8mm(double seconds, long chunk)
{
    const int8x16_t x = vdupq_n_s8(3);
    const uint8x16_t y = vdupq_n_u8(5);
    int32x4_t s = vdupq_n_s32(0);
    CHAINS24(IDECL)
    RD_NEON_LOOP(USTEP, ISUM, 64.0)
}

/* BFMMLA's rate over fmla's, in flops (one thread, a fraction of a
 * millisecond of each, best of three rounds); 0 without FEAT_BF16.  The
 * runtime's automatic choice of the bfloat16 dot-product kernels follows
 * it, as on x86. */
double
rd_bf16dot_vs_fma(void)
{
    return rd_cpu()->bf16 ? rd_dot_over_fma(rd_peak_neon, rd_peak_neon_bf16, 1L << 12) : 0.0;
}
#else
double
rd_bf16dot_vs_fma(void)
{
    return 0.0;
}
#endif /* RD_HAVE_X86_KERNELS */

/* The names rd_peak_gflops takes, in the order of the enum */
static const char *const rd_isa_names[] = {"avx2", "avx512", "avx512_bf16", "avx512_vnni", "avx_vnni",
                                           "amx_bf16", "amx_int8", "neon", "neon_bf16", "neon_dot",
                                           "neon_i8mm"};
enum { RD_AVX2, RD_AVX512, RD_AVX512_BF16, RD_AVX512_VNNI, RD_AVX_VNNI, RD_AMX_BF16, RD_AMX_INT8,
       RD_NEON, RD_NEON_BF16, RD_NEON_DOT, RD_NEON_I8MM, RD_ISA_COUNT };

double
rd_peak_gflops(const char *isa, double seconds)
{
    int id = 0;
    while (id < RD_ISA_COUNT && strcmp(isa, rd_isa_names[id]) != 0)
        id++;
    if (id == RD_ISA_COUNT)
        return -1.0;
    const rd_cpu_t *c = rd_cpu();
    switch (id) {
#ifdef RD_HAVE_X86_KERNELS
    case RD_AVX2:
        return c->avx2 && c->fma ? rd_peak_avx2(seconds, 1L << 19) : 0.0;
    case RD_AVX512:
        return c->avx512f ? rd_peak_avx512(seconds, 1L << 19) : 0.0;
    case RD_AVX512_BF16:
        return c->avx512_bf16 ? rd_peak_bf16(seconds, 1L << 18) : 0.0;
    case RD_AVX512_VNNI:
        return c->avx512_vnni ? rd_peak_vnni512(seconds, 1L << 18) : 0.0;
    case RD_AVX_VNNI:
        return c->avx_vnni ? rd_peak_vnni256(seconds, 1L << 18) : 0.0;
    case RD_AMX_BF16:
        return rd_amx_unavailable() == NULL ? rd_peak_amx_bf16(seconds) : 0.0;
    case RD_AMX_INT8:
        return rd_amx_unavailable() == NULL ? rd_peak_amx_int8(seconds) : 0.0;
#elif defined(RD_HAVE_ARM_KERNELS)
    case RD_NEON:
        return c->neon ? rd_peak_neon(seconds, 1L << 18) : 0.0;
    case RD_NEON_BF16:
        return c->bf16 ? rd_peak_neon_bf16(seconds, 1L << 18) : 0.0;
    case RD_NEON_DOT:
        return c->dotprod ? rd_peak_neon_dot(seconds, 1L << 18) : 0.0;
    case RD_NEON_I8MM:
        return c->i8mm ? rd_peak_neon_i8mm(seconds, 1L << 18) : 0.0;
#endif
    default:   /* another architecture's instruction */
        (void)c;
        (void)seconds;
        return 0.0;
    }
}

/*
 * Read bandwidth: one thread's bytes per second reading `bytes` of its own
 * memory (allocated and written here, so the pages are its own and faulted
 * in before the clock starts), sweeping it until `seconds` have passed.
 * Eight independent sums keep enough loads in flight; the sums are returned
 * so that the reads cannot be removed.  What a weight-streaming product can
 * at best approach.
 */
RD_WIDEST_CLONES static uint64_t
rd_sweep(const uint64_t *restrict p, size_t words)
{
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 8 <= words; i += 8)
        for (int j = 0; j < 8; j++)
            s[j] += p[i + j];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

double
rd_read_gbps(size_t bytes, double seconds)
{
    size_t words = bytes / sizeof(uint64_t) / 8 * 8;
    uint64_t *p = NULL;
    if (words == 0 || posix_memalign((void **)&p, RD_ALIGN, words * sizeof(uint64_t)) != 0)
        return -1.0;
    for (size_t i = 0; i < words; i++)
        p[i] = i;
    volatile uint64_t keep = rd_sweep(p, words);   /* warm: TLB, pages */
    long sweeps = 0;
    double t0 = rd_now(), t1;
    do {
        keep += rd_sweep(p, words);
        sweeps++;
        t1 = rd_now();
    } while (t1 - t0 < seconds);
    (void)keep;
    free(p);
    return (double)sweeps * (double)(words * sizeof(uint64_t)) / (t1 - t0) / 1e9;
}
