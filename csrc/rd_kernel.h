/*
 * raggeddot kernel library: the contract between the micro-kernels, the
 * packing routines and the framework that drives them (BLIS's split).
 * Nothing here includes Python.h; only the files under py/ talk to CPython.
 *
 * Conventions
 *   - Sizes, offsets and strides are rd_int (ptrdiff_t, 64-bit on the
 *     platforms we build for).  Strides are in elements, not bytes.
 *   - A matrix X with strides (rs, cs) holds X[i][j] at x[i*rs + j*cs].
 *   - Kernels take already-validated arguments and never check them.
 *
 * Adding a micro-kernel family: one file under kernels/ that defines its
 * micro-kernels and an rd_family_t describing them, and one row in the
 * table of config/rd_config.c.  Nothing else names it.
 */
#ifndef RD_KERNEL_H
#define RD_KERNEL_H

#include <stddef.h>

typedef ptrdiff_t rd_int;

/* Alignment of the packing buffers and result blocks, in bytes. */
#define RD_ALIGN 64

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define RD_HAVE_X86_KERNELS 1
#endif

/* ------------------------------------------------------------------ types
 *
 * Storage dtypes: what an operand holds in memory.  The packing routines
 * convert them into the packed element type of a compute type (IEEE
 * binary16 and bfloat16 are 16-bit patterns widened exactly to float32).
 * int8 and float8_e4m3fn (ml_dtypes') hold quantized values, read only
 * with their scales (rd_scales_t): dequantized while packed.
 */
typedef enum {
    RD_F32 = 0, RD_F64 = 1, RD_F16 = 2, RD_BF16 = 3,
    RD_I8 = 4, RD_F8E4M3 = 5,
    RD_DTYPE_COUNT
} rd_dtype_t;

/*
 * Compute types: one packed-A element type, one packed-B element type, an
 * accumulator and an output element type, with the granularity of the
 * contraction in the packed panels (k_unit: 1 for plain floats; 2 where a
 * kernel consumes k-pairs, 4 for k-quads).  The micro-kernels of a family
 * are listed per compute type.
 */
typedef enum {
    RD_CT_F32 = 0,
    RD_CT_F64 = 1,
    /* float32 arithmetic on 16-bit B panels, widened in the micro-kernel:
     * for weights that stream from memory (few rows per group), where
     * reading and packing them as float32 would double their bytes.
     * BF16W packs each NR-wide row of B in halves interleaved (position 2j
     * holds column j, 2j+1 column NR/2 + j), so that one shift and one
     * mask widen a vector of pairs; F16W keeps the columns in order. */
    RD_CT_F32_BF16W = 2,
    RD_CT_F32_F16W = 3,
    /* exact integer products of int8 x int8 quantized operands (RD_I8 with
     * scales on both sides): A and B packed as int16 k-pairs, the products
     * of each pair summed into int32 (vpmaddwd: |pair| <= 2 * 255 * 255, no
     * saturation), the int32 sum of one KC block converted to float32 once
     * and multiplied by the scales of its rows and columns (the packing
     * keeps each KC block within one scale block of the contraction; see
     * the contract below).  float32 output. */
    RD_CT_I8I32 = 4,
    /* float32 arithmetic on prepacked quantized weights (rd_prepack of an
     * int8 / int4-in-int8 or float8_e4m3fn rhs with its scales): B panels
     * keep one byte a weight, each micro-panel followed by the scales (and
     * zero points) of its columns (RD_QTRAILER below); the micro-kernel
     * widens each B vector exactly and computes (w - z) * s per column
     * before its products, the value the per-call dequantizing packing
     * writes, so the results equal those of RD_CT_F32 on the dequantized
     * weights bit for bit.  A is packed as RD_CT_F32 packs it. */
    RD_CT_F32_I8W = 5,
    RD_CT_F32_F8W = 6,
    RD_CT_COUNT
} rd_ctype_t;

typedef struct {
    const char *name;       /* "float32", "float64" */
    size_t a_size, b_size;  /* bytes of a packed-A / packed-B element */
    size_t c_size;          /* bytes of an output element */
    int k_unit;             /* the packed contraction is padded to a multiple */
    size_t scale_size;      /* bytes per row of the scales that follow each
                               packed micro-panel (0: none) */
} rd_ctype_desc_t;

/* The longest contraction an RD_CT_I8I32 micro-kernel sums in int32: pair
 * sums of values in [-255, 255] (int8 less an int8 zero point) are at most
 * 130050 in magnitude, so 16384 pairs stay below 2^31. */
#define RD_I32_KC_MAX ((rd_int)32768)

extern const rd_ctype_desc_t rd_ctypes[RD_CT_COUNT];

/* ---------------------------------------------------------- micro-kernels
 *
 * Micro-kernel contract (BLIS style).  A kernel has a fixed register block
 * of MR x NR (its family's descriptor says which).
 *
 *   a : packed A micro-panel, MR x kc, column after column:  A[i][p] = a[p*MR + i]
 *   b : packed B micro-panel, kc x NR, row after row:         B[p][j] = b[p*NR + j]
 *   c : the C tile, C[i][j] = c[i*rs_c + j*cs_c], of which only the leading
 *       m x n corner (m <= MR, n <= NR) is valid and may be touched.
 *   (elements of the compute type's packed-A, packed-B and output types)
 *
 *   mode == RD_STORE  :  C  = A B
 *   mode == RD_ADD    :  C += A B
 *   mode == RD_STREAM :  C  = A B with non-temporal stores, which write
 *       whole cache lines to memory without first reading them in (for
 *       large outputs that are written once and not read back soon).  Only
 *       full tiles whose rows are 64-byte aligned are streamed; a kernel
 *       treats any other tile, or the whole flag if it has no such stores,
 *       as RD_STORE.  The caller fences (rd_store_fence) before another
 *       thread reads the results.
 *
 * The product is accumulated in registers in the order p = 0, 1, ..., kc-1
 * (one fused or unfused multiply-add per step) starting from zero, and is
 * added to C once at the end.  Padding rows/columns of the panels are zero.
 *
 * RD_CT_I8I32 (k_unit 2, scale_size 4): with kp = kc rounded up to even,
 *   a : int16 A[i][p] = a[(p/2)*2*MR + 2*i + p%2], then float sa[MR] (the
 *       scale of each row for this block) at byte 2*MR*kp
 *   b : int16 B[p][j] = b[(p/2)*2*NR + 2*j + p%2], then float sb[NR]
 *   C[i][j] (+)= (float)(sum_p A[i][p] B[p][j]) * (sa[i] * sb[j]),
 *   the sum exact in int32 (kc <= RD_I32_KC_MAX): the integer part agrees
 *   bit for bit across families, the float32 epilogue within its roundings.
 *
 * RD_CT_F32_I8W / RD_CT_F32_F8W (float32 A as RD_CT_F32):
 *   b : one byte B[p][j] = b[p*NR + j] (an int8 value, or a float8_e4m3fn
 *       code that is not NaN), then at byte NR*kc the trailer rd_qtrailer_t:
 *       the block's contraction steps fall in scale tiles ("runs") of
 *       `first` steps, then `tile` steps each (the last one cut at kc); for
 *       run r the trailer holds float s[NR] (and with zp, float z[NR]) at
 *       RD_QRUN(r, NR, zp) bytes past its start.
 *   For step p of run r:  B[p][j] = (widen(b[p*NR + j]) - z[j]) * s[j]
 *   (z = 0 without zero points), rounded to float32 as written, then the
 *   products and sums of the float32 contract above.  widen is exact.
 */
typedef struct {
    int first;      /* steps of the first run (1 <= first <= kc) */
    int tile;       /* steps of every later run */
    int zp;         /* 1: each run has zero points after its scales */
    int pad;
} rd_qtrailer_t;

/* Bytes from a trailer's start to run r's scales; and of the whole trailer
 * of a kc-step block (NR columns). */
#define RD_QRUN(r, NR, zp) \
    ((size_t)sizeof(rd_qtrailer_t) + (size_t)(r) * (size_t)(NR) * sizeof(float) * ((zp) ? 2u : 1u))

static inline rd_int
rd_qruns(rd_int first, rd_int tile, rd_int kc)
{
    return kc <= first ? 1 : 1 + (kc - first + tile - 1) / tile;
}

enum { RD_STORE = 0, RD_ADD = 1, RD_STREAM = 2 };

typedef void (*rd_ukr_t)(rd_int kc, const void *a, const void *b, void *c,
                         rd_int rs_c, rd_int cs_c, int m, int n, int mode);

/* One micro-kernel with its register block and default cache blocking:
 * MC x KC block of packed A (L2), KC x NC panel of packed B (L3), and a
 * KC x NR micro-panel of B (L1).  ukr == NULL: the family has none for
 * that compute type. */
typedef struct {
    rd_ukr_t ukr;
    int mr, nr;
    rd_int mc, kc, nc;
} rd_ukr_desc_t;

/* A kernel family: the micro-kernels one instruction set provides. */
typedef struct {
    const char *name;                  /* "ref", "avx2", "avx512" */
    int (*runnable)(void);             /* whether this CPU has its instructions */
    rd_ukr_desc_t types[RD_CT_COUNT];  /* indexed by rd_ctype_t */
} rd_family_t;

/* The families compiled in, most preferred first, NULL-terminated
 * (config/rd_config.c). */
extern const rd_family_t *const rd_families[];

/* Order the non-temporal stores of this thread before its later stores
 * (a no-op where the kernels have none). */
static inline void
rd_store_fence(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__SSE__))
    __builtin_ia32_sfence();
#endif
}

/* Whether a C tile with rows of `row_bytes` apart starting at c can take
 * 64-byte non-temporal stores. */
static inline int
rd_stream_aligned(const void *c, rd_int row_bytes)
{
    return (((size_t)c | (size_t)row_bytes) & 63) == 0;
}

/* The edge path shared by every micro-kernel: write (or add) the valid
 * m x n corner of a register tile spilled to buf (row stride ldb) into C. */
#define RD_DEFINE_STORE_EDGE(NAME, T)                                        \
static inline void NAME(const T *buf, int ldb, T *c, rd_int rs_c,           \
                        rd_int cs_c, int m, int n, int mode)                \
{                                                                           \
    for (int i = 0; i < m; i++) {                                           \
        T *ci = c + i * rs_c;                                               \
        const T *bi = buf + i * ldb;                                        \
        if (mode == RD_ADD)                                                 \
            for (int j = 0; j < n; j++)                                     \
                ci[j * cs_c] += bi[j];                                      \
        else                                                                \
            for (int j = 0; j < n; j++)                                     \
                ci[j * cs_c] = bi[j];                                       \
    }                                                                       \
}
RD_DEFINE_STORE_EDGE(rd_s_store_edge, float)
RD_DEFINE_STORE_EDGE(rd_d_store_edge, double)

#endif /* RD_KERNEL_H */
