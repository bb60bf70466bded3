/*
 * The twins of the dot-product families: micro-kernels in plain C that
 * compute what each native kernel's instruction computes (rd_kernel.h's
 * contracts, kernels/rd_dot_arith.h's arithmetic), with the native
 * kernel's register block, packed layout and blocking
 * (kernels/rd_dot_blocking.h).  They are compiled on every architecture and
 * run on every CPU, chosen only by name, so that the packing, the edges
 * and the epilogues of every dot family are tested wherever the suite runs
 * (x86-64 or aarch64), and each native kernel is held to its twin bit for
 * bit wherever the CPU has its instruction.
 *
 *   "avx512-bf16-twin"  RD_CT_BF16DP, 12 x 32, vdpbf16ps's arithmetic
 *   "neon-bf16-twin"    RD_CT_BF16MMA, 12 x 8, BFMMLA's (Arm BFDotAdd)
 *   "avx512-vnni-twin"  RD_CT_U8S8, 12 x 32
 *   "avx-vnni-twin"     RD_CT_U8S8, 6 x 16
 *   "neon-i8mm-twin"    RD_CT_U8S8MMA, 12 x 8 (USMMLA)
 *   "neon-dot-twin"     RD_CT_U8S8, 12 x 8 (UDOT)
 *
 * Speed is not their purpose: each lane step is scalar code.
 */
#include "rd_kernel.h"
#include "rd_dot_arith.h"
#include "rd_dot_blocking.h"

#include <stdint.h>
#include <string.h>

/* bfloat16 k-pairs (RD_CT_BF16DP): A[i][p] = a[(p/2)*2*MR + 2i + p%2],
 * B[p][j] = b[(p/2)*2*NR + 2j + p%2], the pairs of the contraction in
 * order into float32 accumulators from zero, each pair by STEP(acc, a_lo,
 * a_hi, b_lo, b_hi) (bfloat16 bits), then C (+)= acc. */
#define RD_BF16_TWIN(NAME, MR, NR, STEP)                                     \
static void NAME(rd_int kc, const void *a_, const void *b_, void *c,        \
                 rd_int rs_c, rd_int cs_c, int m, int n, int mode)          \
{                                                                           \
    const uint16_t *a = (const uint16_t *)a_, *b = (const uint16_t *)b_;    \
    const rd_int pairs = (kc + 1) / 2;                                      \
    float acc[MR][NR];                                                      \
    memset(acc, 0, sizeof acc);                                             \
    for (rd_int q = 0; q < pairs; q++) {                                    \
        const uint16_t *ap = a + q * 2 * (MR), *bp = b + q * 2 * (NR);      \
        for (int i = 0; i < m; i++)                                         \
            for (int j = 0; j < n; j++)                                     \
                acc[i][j] = STEP(acc[i][j], ap[2 * i], ap[2 * i + 1], bp[2 * j], bp[2 * j + 1]); \
    }                                                                       \
    rd_s_store_edge(&acc[0][0], NR, (float *)c, rs_c, cs_c, m, n, mode == RD_ADD ? RD_ADD : RD_STORE); \
}

/* vdpbf16ps: the odd (upper) elements' product first, then the even ones'. */
static inline float
rd_vdpbf16_pair(float acc, uint16_t a_lo, uint16_t a_hi, uint16_t b_lo, uint16_t b_hi)
{
    acc = rd_vdpbf16_step(acc, rd_bf16_daz(a_hi), rd_bf16_daz(b_hi));
    return rd_vdpbf16_step(acc, rd_bf16_daz(a_lo), rd_bf16_daz(b_lo));
}

RD_BF16_TWIN(rd_bf16dot_twin_12x32, 12, 32, rd_vdpbf16_pair)

/* RD_CT_U8S8's epilogue of the sums S (rows ld apart): t = S - (128 + za)
 * cb - (ra - kc za) zb, C (+)= (float)t * (sa * sb), with A's row trailer
 * (MR rows) at ta and B's column trailer (NR columns) at tb. */
static void
rd_u8s8_twin_finish(const uint32_t *sum, int ld, const char *ta, int MR, const char *tb, int NR, rd_int kc,
                    float *c, rd_int rs_c, rd_int cs_c, int m, int n, int mode)
{
    float out[12 * 32];
    for (int i = 0; i < m; i++) {
        int32_t ra, za;
        float sa;
        memcpy(&ra, ta + 4 * i, 4);
        memcpy(&sa, ta + 4 * (MR + i), 4);
        memcpy(&za, ta + 4 * (2 * MR + i), 4);
        const uint32_t u = 128u + (uint32_t)za, v = (uint32_t)ra - (uint32_t)kc * (uint32_t)za;
        for (int j = 0; j < n; j++) {
            int32_t cb, zb;
            float sb;
            memcpy(&cb, tb + 4 * j, 4);
            memcpy(&sb, tb + 4 * (NR + j), 4);
            memcpy(&zb, tb + 4 * (2 * NR + j), 4);
            const uint32_t t = sum[i * ld + j] - u * (uint32_t)cb - v * (uint32_t)zb;
            out[i * NR + j] = (float)(int32_t)t * (sa * sb);
        }
    }
    rd_s_store_edge(out, NR, c, rs_c, cs_c, m, n, mode == RD_ADD ? RD_ADD : RD_STORE);
}

/* int8 k-quads (RD_CT_U8S8): A + 128 as unsigned bytes at
 * a[(p/4)*4*MR + 4i + p%4] with the row trailer (int32 ra, float sa, int32
 * za) after MR*kq bytes, B signed at b[(p/4)*4*NR + 4j + p%4] with its
 * column trailer (int32 cb, float sb, int32 zb); S = sum of the products
 * modulo 2^32, t = S - (128 + za) cb - (ra - kc za) zb, and
 * C (+)= (float)t * (sa * sb). */
#define RD_U8S8_TWIN(NAME, MR, NR)                                           \
static void NAME(rd_int kc, const void *a_, const void *b_, void *c,        \
                 rd_int rs_c, rd_int cs_c, int m, int n, int mode)          \
{                                                                           \
    const uint8_t *a = (const uint8_t *)a_;                                 \
    const int8_t *b = (const int8_t *)b_;                                   \
    const rd_int kq = (kc + 3) / 4 * 4;                                     \
    uint32_t sum[MR][NR];                                                   \
    memset(sum, 0, sizeof sum);                                             \
    for (rd_int p = 0; p < kq; p += 4) {                                    \
        const uint8_t *ap = a + p * (MR);                                   \
        const int8_t *bp = b + p * (NR);                                    \
        for (int i = 0; i < m; i++)                                         \
            for (int j = 0; j < n; j++)                                     \
                for (int t = 0; t < 4; t++)                                 \
                    sum[i][j] += (uint32_t)((int32_t)ap[4 * i + t] * (int32_t)bp[4 * j + t]); \
    }                                                                       \
    rd_u8s8_twin_finish(&sum[0][0], NR, (const char *)a_ + (MR) * kq, MR, (const char *)b_ + (NR) * kq, NR, kc, \
                        (float *)c, rs_c, cs_c, m, n, mode);                \
}

RD_U8S8_TWIN(rd_u8s8dot_twin_12x32, 12, 32)
RD_U8S8_TWIN(rd_u8s8dot_twin_6x16, 6, 16)
RD_U8S8_TWIN(rd_u8s8dot_twin_12x8, 12, 8)

/* The MMLA types (rd_kernel.h): A and B in blocks of 4 (bfloat16) or 8
 * (int8) steps; the bfloat16 pairs in order by BFDotAdd (BFMMLA's bits),
 * the int8 sums and epilogue RD_CT_U8S8's. */
static void
rd_bf16mmla_twin_12x8(rd_int kc, const void *a_, const void *b_, void *c, rd_int rs_c, rd_int cs_c,
                      int m, int n, int mode)
{
    enum { MR = 12, NR = 8 };
    const uint16_t *a = (const uint16_t *)a_, *b = (const uint16_t *)b_;
    const rd_int pairs = (kc + 1) / 2;
    float acc[MR][NR];
    memset(acc, 0, sizeof acc);
    for (rd_int q = 0; q < pairs; q++) {
        const rd_int p = 2 * q;   /* X[i][p] at x[(p/4)*4*R + 4i + p%4] */
        const uint16_t *ap = a + (p / 4) * 4 * MR + p % 4, *bp = b + (p / 4) * 4 * NR + p % 4;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                acc[i][j] = rd_bfdotadd(acc[i][j], ap[4 * i], ap[4 * i + 1], bp[4 * j], bp[4 * j + 1]);
    }
    rd_s_store_edge(&acc[0][0], NR, (float *)c, rs_c, cs_c, m, n, mode == RD_ADD ? RD_ADD : RD_STORE);
}

static void
rd_u8s8mmla_twin_12x8(rd_int kc, const void *a_, const void *b_, void *c, rd_int rs_c, rd_int cs_c,
                      int m, int n, int mode)
{
    enum { MR = 12, NR = 8 };
    const uint8_t *a = (const uint8_t *)a_;
    const int8_t *b = (const int8_t *)b_;
    const rd_int k8 = (kc + 7) / 8 * 8;
    uint32_t sum[MR][NR];
    memset(sum, 0, sizeof sum);
    for (rd_int p = 0; p < k8; p++) {
        const uint8_t *ap = a + (p / 8) * 8 * MR + p % 8;
        const int8_t *bp = b + (p / 8) * 8 * NR + p % 8;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                sum[i][j] += (uint32_t)((int32_t)ap[8 * i] * (int32_t)bp[8 * j]);
    }
    rd_u8s8_twin_finish(&sum[0][0], NR, (const char *)a_ + MR * k8, MR, (const char *)b_ + NR * k8, NR, kc,
                        (float *)c, rs_c, cs_c, m, n, mode);
}

/* The w4a8 types (RD_CT_U8S8_I4, RD_CT_U8S8_F4): A + 128 in int8 k-quads
 * with U8S8's row trailer, B 4-bit k-quads (byte t of a quad's 2 NR holds
 * column t/4 in its low nibble, NR/2 + t/4 in its high one, step t%4),
 * then the rd_qtrailer_t of its runs and their scales; per run, S = the
 * sum of A B (exact) and C (+)= (float)S * (sa * sb) (the first run stored
 * or added as mode says, the later ones added), the scale of an F4 column
 * 2^(e - 128). */
static void
rd_w4a8_twin(int ct, int NR, rd_int kc, const void *a_, const void *b_, void *c, rd_int rs_c, rd_int cs_c, int m,
             int n, int mode)
{
    enum { MR = 12, NRMAX = 32 };
    const uint8_t *a = (const uint8_t *)a_, *b = (const uint8_t *)b_;
    const rd_int kq = (kc + 3) / 4 * 4;
    const char *tb = (const char *)b_ + NR / 2 * kq;
    float sa[MR];
    memcpy(sa, (const char *)a_ + MR * kq + 4 * MR, sizeof sa);
    rd_qtrailer_t h;
    memcpy(&h, tb, sizeof h);
    rd_int p = 0;
    for (rd_int r = 0; p < kc; r++) {
        const rd_int end = rd_qrun_end(&h, r, kc);
        uint32_t sum[MR][NRMAX];
        memset(sum, 0, sizeof sum);
        for (; p < end; p++) {
            const uint8_t *ap = a + p / 4 * 4 * MR + p % 4, *bp = b + p / 4 * 2 * NR + p % 4;
            for (int j = 0; j < n; j++) {
                const unsigned byte = bp[4 * (j % (NR / 2))];
                const int v = rd_w4a8_value(ct, j < NR / 2 ? byte : byte >> 4);
                for (int i = 0; i < m; i++)
                    sum[i][j] += (uint32_t)(((int32_t)ap[4 * i] - 128) * v);
            }
        }
        float acc[MR][NRMAX];
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                float sb;
                if (ct == RD_CT_U8S8_F4)
                    sb = rd_e8m0_to_float(((const uint8_t *)tb)[RD_F4RUN(r, NR) + (size_t)j]) * 0.5f;
                else
                    memcpy(&sb, tb + RD_QRUN(r, NR, 0) + 4 * (size_t)j, sizeof sb);
                acc[i][j] = (float)(int32_t)sum[i][j] * (sa[i] * sb);
            }
        rd_s_store_edge(&acc[0][0], NRMAX, (float *)c, rs_c, cs_c, m, n,
                        r > 0 || mode == RD_ADD ? RD_ADD : RD_STORE);
    }
}

#define RD_W4A8_TWIN(NAME, CT, NR)                                           \
static void NAME(rd_int kc, const void *a, const void *b, void *c, rd_int rs_c, rd_int cs_c, int m, int n, \
                 int mode)                                                  \
{                                                                           \
    rd_w4a8_twin(CT, NR, kc, a, b, c, rs_c, cs_c, m, n, mode);              \
}
RD_W4A8_TWIN(rd_w4a8_twin_i4_12x32, RD_CT_U8S8_I4, 32)
RD_W4A8_TWIN(rd_w4a8_twin_f4_12x32, RD_CT_U8S8_F4, 32)
RD_W4A8_TWIN(rd_w4a8_twin_i4_12x8, RD_CT_U8S8_I4, 8)
RD_W4A8_TWIN(rd_w4a8_twin_f4_12x8, RD_CT_U8S8_F4, 8)

static int
rd_twin_runnable(void)
{
    return 1;
}

#define RD_TWIN_FAMILY(VAR, NAME, CT, DESC)                                  \
const rd_family_t VAR = {NAME, rd_twin_runnable, {[CT] = DESC}, 1, {{NULL, 0, 0}}, {{NULL, 0, NULL, 0}}};

RD_TWIN_FAMILY(rd_family_avx512_bf16_twin, "avx512-bf16-twin", RD_CT_BF16DP,
               RD_BF16_DESC(rd_bf16dot_twin_12x32))
RD_TWIN_FAMILY(rd_family_neon_bf16_twin, "neon-bf16-twin", RD_CT_BF16MMA,
               RD_NEON_BF16_DESC(rd_bf16mmla_twin_12x8))
const rd_family_t rd_family_avx512_vnni_twin = {
    "avx512-vnni-twin", rd_twin_runnable,
    {[RD_CT_U8S8] = RD_VNNI_DESC(rd_u8s8dot_twin_12x32), [RD_CT_U8S8_I4] = RD_VNNI_DESC(rd_w4a8_twin_i4_12x32),
     [RD_CT_U8S8_F4] = RD_VNNI_DESC(rd_w4a8_twin_f4_12x32)},
    1, {{NULL, 0, 0}}, {{NULL, 0, NULL, 0}},
};
RD_TWIN_FAMILY(rd_family_avx_vnni_twin, "avx-vnni-twin", RD_CT_U8S8,
               RD_AVXVNNI_DESC(rd_u8s8dot_twin_6x16))
RD_TWIN_FAMILY(rd_family_neon_i8mm_twin, "neon-i8mm-twin", RD_CT_U8S8MMA,
               RD_NEON_I8_DESC(rd_u8s8mmla_twin_12x8))
const rd_family_t rd_family_neon_dot_twin = {
    "neon-dot-twin", rd_twin_runnable,
    {[RD_CT_U8S8] = RD_NEON_I8_DESC(rd_u8s8dot_twin_12x8), [RD_CT_U8S8_I4] = RD_NEON_I8_DESC(rd_w4a8_twin_i4_12x8),
     [RD_CT_U8S8_F4] = RD_NEON_I8_DESC(rd_w4a8_twin_f4_12x8)},
    1, {{NULL, 0, 0}}, {{NULL, 0, NULL, 0}},
};
