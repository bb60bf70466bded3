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
#if defined(__GNUC__) && defined(__aarch64__)
#define RD_HAVE_ARM_KERNELS 1
#endif

/* The CPU's features (cpu/rd_cpu.h): what every runnable() check reads. */
#include "cpu/rd_cpu.h"

/* A function compiled for AVX-512F, AVX2 and the baseline, the widest the
 * CPU runs bound at load time (an ELF ifunc): for the conversion and copy
 * loops of the packing and narrowing, whose results do not depend on the
 * clone.  Elsewhere (Mach-O has no ifunc) the baseline alone. */
#if defined(RD_HAVE_X86_KERNELS) && defined(__ELF__) && !defined(RD_NO_CLONES)
#define RD_WIDEST_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define RD_WIDEST_CLONES
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
    /* float32 values read as bfloat16: each rounded to nearest even while
     * packed (jax's DotAlgorithmPreset.BF16_BF16_F32 on float32 inputs) */
    RD_F32_AS_BF16 = 6,
    /* float4_e2m1fn values (1 sign, 2 exponent bits of bias 1, 1 mantissa
     * bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), two a byte, the
     * low nibble first.  An operand of this dtype is addressed in nibbles:
     * its pointer is the nibble address (twice the byte address) and its
     * strides count nibbles, so that the framework moves through it as
     * through any other operand (rd_dtype_size 1); only the packing
     * routines that read it turn the address back into a byte and a
     * nibble (rd_f4_at).  Read with its scales only. */
    RD_F4E2M1 = 7,
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
    /* Dot-product compute types: an instruction that multiplies pairs or
     * quads of narrow values and adds them into a float32 / int32 lane.
     * Only families whose CPU has the instruction (or its exact emulated
     * twin, when forced) serve them; the portable family does not, and a
     * product they cannot serve takes the widening types above.
     *
     * BF16DP: bfloat16 x bfloat16 with float32 accumulation (vdpbf16ps):
     * A and B packed as bfloat16 k-pairs, each pair step adding to the
     * accumulator first the product of the odd (upper) elements, then of
     * the even ones, each step rounded to nearest even, denormal inputs and
     * results flushed to zero (the instruction's arithmetic). */
    RD_CT_BF16DP = 7,
    /* U8S8: int8 x int8 quantized operands (RD_I8 with scales and integral
     * zero points on both sides), exact int32 sums of k-quads (vpdpbusd:
     * unsigned bytes of A times signed bytes of B): A packed as a + 128,
     * the shift and the zero points taken back from row and column sums
     * kept after the panels; the same int32 sums, and so the same results
     * bit for bit, as RD_CT_I8I32 with the same KC. */
    RD_CT_U8S8 = 8,
    /* Tile types (Intel AMX): the arithmetic of a matrix unit that
     * multiplies a 16-row tile of A by a tile of B per instruction.  B is
     * packed as the dot types above pack it (bfloat16 k-pairs, int8
     * k-quads with their trailer), so weights prepacked for one are read by
     * the other; A is packed row after row (a tile loads 16 rows of it with
     * the row pitch as stride).
     *
     * BF16TILE: bfloat16 x bfloat16 into float32 (TDPBF16PS).  The
     * instruction's order of additions inside a tile is not documented and
     * matches no simple model (SPEC, measured): its results are held to an
     * error bound, and to the exact value where every partial sum is exact.
     * U8S8TILE: int8 x int8 (TDPBUSD, A + 128 unsigned times B signed), the
     * trailers and epilogue of RD_CT_U8S8: the same int32 sums, and so the
     * same results bit for bit, as RD_CT_U8S8 and RD_CT_I8I32 with the same
     * KC. */
    RD_CT_BF16TILE = 9,
    RD_CT_U8S8TILE = 10,
    /* float32 arithmetic on prepacked 4-bit weights (float4_e2m1fn values
     * with power-of-two scales: MXFP4): B panels keep 4 bits a weight and
     * one byte (an e8m0 exponent) a column per scale run; the micro-kernel
     * decodes each value exactly (a 16-entry table) and multiplies it by
     * its scale, exactly, before the products of the float32 contract: the
     * results equal RD_CT_F32's on the dequantized weights bit for bit.
     * A is packed as RD_CT_F32 packs it. */
    RD_CT_F32_F4W = 11,
    /* Matrix-multiply-accumulate types (Arm's FEAT_I8MM / FEAT_BF16
     * MMLA instructions: a 2 x 8 (int8) or 2 x 4 (bfloat16) block of A
     * times the transpose of a 2 x 8 / 2 x 4 block of B into a 2 x 2 block
     * of C per 128-bit register).  A and B are packed in blocks of 8
     * (int8) or 4 (bfloat16) steps of the contraction (k_unit), each row
     * (column) of a block contiguous, so that one 16-byte load is the
     * operand of an instruction: two rows of A, or two columns of B.
     *
     * U8S8MMA: int8 x int8 (USMMLA: A + 128 unsigned times B signed), the
     * trailers, sums and epilogue of RD_CT_U8S8, and so its results bit for
     * bit.  BF16MMA: bfloat16 x bfloat16 (BFMMLA, which adds a row's pairs
     * in order as BFDOT does: RD_CT_BF16DP's arithmetic on Arm). */
    RD_CT_U8S8MMA = 12,
    RD_CT_BF16MMA = 13,
    /* float32 arithmetic on prepacked int4 weights (values in [-8, 7] with
     * float scales and zero points, any tiling): B panels keep 4 bits a
     * weight, RD_CT_F32_F4W's nibble order, each micro-panel followed by
     * RD_CT_F32_I8W's trailer; the micro-kernel widens each value exactly
     * and computes (w - z) * s before its products: RD_CT_F32_I8W's results
     * on the same weights held one a byte, bit for bit, at half the bytes. */
    RD_CT_F32_I4W = 14,
    /* 4-bit weights times int8 rows on the int8 dot products (w4a8): B
     * panels keep 4 bits a weight in k-quads, decoded in the micro-kernel
     * by a 16-entry table into int8 values, each micro-panel followed by
     * the runs of its scales within the scale tiles along k (no column
     * sums, no zero points: the blocks are not cut at the tiles, so that a
     * panel streams whole); A packed as RD_CT_U8S8's A.  Per run, the
     * exact int32 sums and the epilogue of RD_CT_U8S8 with zero points 0,
     * the runs added into C in order: the same results, bit for bit, as
     * RD_CT_U8S8 on the same int8 values with its blocks cut at the tiles.
     * U8S8_I4: int4 values in [-8, 7], float scales.
     * U8S8_F4: MXFP4, each float4_e2m1fn value v taken as the int8 2v
     * (exact: 2v is an integer in [-12, 12]) with the scale 2^(e - 128),
     * half its e8m0 scale 2^(e - 127), held as the exponent byte e. */
    RD_CT_U8S8_I4 = 15,
    RD_CT_U8S8_F4 = 16,
    RD_CT_COUNT
} rd_ctype_t;

typedef struct {
    const char *name;       /* "float32", "float64" */
    size_t a_size, b_size;  /* bytes of a packed-A / packed-B element */
    size_t c_size;          /* bytes of an output element */
    int k_unit;             /* the packed contraction is padded to a multiple */
    size_t scale_size;      /* bytes per row of the scales that follow each
                               packed micro-panel (0: none) */
    int b_nibbles;          /* 1: B panels hold two values a byte (b_size 1
                               then counts two elements) */
    size_t b_scale_size;    /* bytes a column of the row of scales after
                               each B micro-panel, where not scale_size
                               (0: scale_size) */
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
 *
 * RD_CT_F32_F4W (float32 A as RD_CT_F32, NR even):
 *   b : NR/2 bytes a step: B[p][j] is the low nibble of byte
 *       b[p*NR/2 + j] for j < NR/2, the high nibble of b[p*NR/2 + j - NR/2]
 *       otherwise (a float4_e2m1fn code); then at byte NR*kc/2 the
 *       rd_qtrailer_t (zp 0) and for run r, at RD_F4RUN(r, NR) bytes past
 *       its start, uint8 e[NR]: the scale of column j is 2^(e[j] - 127)
 *       (e 0: 2^-127, a float32 subnormal; 255 never occurs).
 *   For step p of run r:  B[p][j] = e2m1(code) * 2^(e[j] - 127), exact
 *   (infinite past FLT_MAX, as the float32 product is), then the products
 *   and sums of the float32 contract.
 *
 * RD_CT_F32_I4W (float32 A as RD_CT_F32, NR even):
 *   b : NR/2 bytes a step, the codes of RD_CT_F32_F4W's order (column j's
 *       in the low nibble of byte b[p*NR/2 + j] for j < NR/2, in the high
 *       nibble of b[p*NR/2 + j - NR/2] otherwise), each the two's complement
 *       4-bit value (code ^ 8) - 8; then at byte NR*kc/2 RD_CT_F32_I8W's
 *       trailer (runs of scales, and zero points with zp).
 *   For step p of run r:  B[p][j] = (value - z[j]) * s[j], rounded to
 *   float32, then the products and sums of the float32 contract.
 *
 * RD_CT_BF16DP (k_unit 2): with kp = kc rounded up to even,
 *   a : bfloat16 A[i][p] = a[(p/2)*2*MR + 2*i + p%2] (uint16 bits),
 *   b : bfloat16 B[p][j] = b[(p/2)*2*NR + 2*j + p%2], odd kc padded with 0,
 *   per pair q, in order q = 0, 1, ...:
 *     acc = fma(A[i][2q+1], B[2q+1][j], acc);  acc = fma(A[i][2q], B[2q][j], acc)
 *   in float32 with denormal operands and results read and written as 0
 *   (vdpbf16ps; its twin computes the same with FTZ and DAZ set), then
 *   C (+)= acc as the float32 contract does.
 *
 * RD_CT_U8S8 (k_unit 4, scale_size 12): with kq = kc rounded up to a
 *   multiple of 4,
 *   a : uint8 A[i][p] + 128 at a[(p/4)*4*MR + 4*i + p%4] (A int8, padding
 *       steps the byte 0), then at byte MR*kq the row trailer: int32 ra[MR]
 *       (sum over the block's kc steps of A[i][p]), float sa[MR], int32
 *       za[MR] (scale and integral zero point of each row for the block)
 *   b : int8 B[p][j] at b[(p/4)*4*NR + 4*j + p%4] (padding steps 0), then
 *       int32 cb[NR] (column sums), float sb[NR], int32 zb[NR]
 *   S[i][j] = sum_p (A+128)[i][p] B[p][j] (vpdpbusd, modulo 2^32; a kernel
 *   summing (A+128) (B+128) instead takes 128 (ra[i] + 128 kc) back out,
 *   the padding bytes adding nothing), then
 *   t = S - (128 + za[i]) cb[j] - (ra[i] - kc za[i]) zb[j]
 *     = sum_p (A[i][p] - za[i]) (B[p][j] - zb[j])   (mod 2^32: exact when
 *   that sum fits int32, as it does for kc <= RD_I32_KC_MAX), and
 *   C[i][j] (+)= (float)t * (sa[i] * sb[j]): RD_CT_I8I32's epilogue.
 *
 * RD_CT_BF16TILE (k_unit 2): with kp = kc rounded up to even,
 *   a : bfloat16 A[i][p] = a[i*kp + p], row after row (padding 0),
 *   b : as RD_CT_BF16DP's (k-pairs, NR columns a pair row),
 *   acc = C (mode RD_ADD) or 0, then acc += the products of the block,
 *   32 steps of the contraction per tile instruction, in the instruction's
 *   arithmetic (float32 sums, round to nearest even, denormal inputs and
 *   results as 0; the order inside an instruction unspecified), C = acc.
 *   Its twin sums step after step (p = 0, 1, ...), one correctly rounded
 *   fused multiply-add each, with the same flushing.
 *
 * RD_CT_U8S8TILE (k_unit 4, scale_size 12): with kq = kc rounded up to a
 *   multiple of 4, A row after row, each row followed by its own trailer:
 *   row i at byte i*(kq + 12): uint8 A[i][p] + 128 at p (padding any), then
 *   int32 ra, float sa, int32 za of the row; b as RD_CT_U8S8's.  The sums
 *   S and the epilogue are RD_CT_U8S8's.
 *
 * RD_CT_U8S8MMA (k_unit 8, scale_size 12): with k8 = kc rounded up to a
 *   multiple of 8,
 *   a : uint8 A[i][p] + 128 at a[(p/8)*8*MR + 8*i + p%8] (padding bytes 0),
 *       then at byte MR*k8 the row trailer of RD_CT_U8S8 (ra, sa, za);
 *   b : int8 B[p][j] at b[(p/8)*8*NR + 8*j + p%8] (padding 0), then at byte
 *       NR*k8 the column trailer of RD_CT_U8S8 (cb, sb, zb);
 *   the sums S and the epilogue are RD_CT_U8S8's.
 *
 * RD_CT_BF16MMA (k_unit 4): with k4 = kc rounded up to a multiple of 4,
 *   a : bfloat16 A[i][p] = a[(p/4)*4*MR + 4*i + p%4] (padding 0),
 *   b : bfloat16 B[p][j] = b[(p/4)*4*NR + 4*j + p%4] (padding 0),
 *   per pair q in order: acc = BFDotAdd(acc, pair q of A's row, of B's
 *   column) (kernels/rd_dot_arith.h), then C (+)= acc.
 *
 * RD_CT_U8S8_I4 / RD_CT_U8S8_F4 (k_unit 4, A's scale_size 12, NR even):
 *   with kq = kc rounded up to a multiple of 4,
 *   a : RD_CT_U8S8's (A + 128 in k-quads, then ra, sa, za; za is 0 here);
 *   b : 2*NR bytes a quad q, byte t < 2*NR holding in its low nibble the
 *       code of B[4q + t%4][t/4] and in its high nibble that of
 *       B[4q + t%4][NR/2 + t/4] (padding steps code 0); then at byte
 *       NR*kq/2 the rd_qtrailer_t of the block's runs (zp 0; every run but
 *       the last a whole number of quads) and per run r the scales of the
 *       columns: I4: float sb[NR] at RD_QRUN(r, NR, 0); F4: uint8 e[NR] at
 *       RD_F4RUN(r, NR), the scale sb[j] = 2^(e[j] - 128) (exact in
 *       float32: 2^-128 at e 0).
 *   The value of a code c: I4: (c ^ 8) - 8; F4: 2 * e2m1(c) (the tables
 *   rd_i4_values / rd_e2m1_values, doubled: rd_w4a8_value).  Padding
 *   columns have code 0 and scale 0 (I4) or e 0 (F4).
 *   Per run r in order: S[i][j] = the exact sum over its steps of
 *   A[i][p] B[p][j], then C[i][j] (+)= (float)S * (sa[i] * sb[j]), run 0
 *   stored (or added, for RD_ADD), the later runs added: RD_CT_U8S8's
 *   results on the same values with zero points 0 and its blocks cut at
 *   the runs.  (The AVX-512 kernels sum (A + 128) B and take 128 times
 *   the column sums of the run back out, or sum A (B + 128) and take 128
 *   times the row's sum back out.)
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

/* Bytes from an RD_CT_F32_F4W trailer's start to run r's exponents. */
#define RD_F4RUN(r, NR) ((size_t)sizeof(rd_qtrailer_t) + (size_t)(r) * (size_t)(NR))

/* The values of the int4 codes 0-15 (two's complement, RD_CT_F32_I4W). */
static const float rd_i4_values[16] = {
    0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f,
    -8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f, -2.0f, -1.0f,
};

/* The values of the float4_e2m1fn codes 0-15, and the float32 of an e8m0
 * scale exponent (2^(e - 127); e 0 is the subnormal 2^-127). */
static const float rd_e2m1_values[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

static inline float
rd_e8m0_to_float(unsigned e)
{
    union { unsigned u; float f; } v;
    v.u = e == 0 ? 0x00400000u : e << 23;
    return v.f;
}

/* The e8m0 exponent of a power-of-two float32 scale in [2^-127, 2^127]
 * (rd_e8m0_to_float's inverse; 0.0f, a padding column's, gives 0). */
static inline unsigned
rd_float_to_e8m0(float s)
{
    union { float f; unsigned u; } v;
    v.f = s;
    return v.u == 0x00400000u ? 0u : v.u >> 23;
}

static inline rd_int
rd_qruns(rd_int first, rd_int tile, rd_int kc)
{
    return kc <= first ? 1 : 1 + (kc - first + tile - 1) / tile;
}

/* The first step of run r of a block whose trailer is h (from the block's
 * start), and the end of that run in a block of kc steps. */
static inline rd_int
rd_qrun_start(const rd_qtrailer_t *h, rd_int r)
{
    return r == 0 ? 0 : h->first + (r - 1) * h->tile;
}

static inline rd_int
rd_qrun_end(const rd_qtrailer_t *h, rd_int r, rd_int kc)
{
    const rd_int end = rd_qrun_start(h, r + 1);
    return end < kc ? end : kc;
}

/* Whether the B trailers of compute type ct hold e8m0 exponent bytes (the
 * 4-bit float layouts), not float scales. */
static inline int
rd_ctype_e8m0(int ct)
{
    return ct == RD_CT_F32_F4W || ct == RD_CT_U8S8_F4;
}

enum { RD_STORE = 0, RD_ADD = 1, RD_STREAM = 2 };

typedef void (*rd_ukr_t)(rd_int kc, const void *a, const void *b, void *c,
                         rd_int rs_c, rd_int cs_c, int m, int n, int mode);

/* A streaming micro-kernel: C (+)= A B as the contract above, but B is
 * read where it lies instead of from a packed panel: float32 B[p][j] =
 * b[p*ldb + j] for j < n only (the columns past n are never read, so a
 * strip at the right edge of the operand is safe), with A packed in panels
 * of its own MR rows and strips of up to its own NR columns.  Every element
 * is summed as the packed kernels sum it (p = 0, 1, ... from zero, one
 * fused or unfused multiply-add per step as the family's float32 kernel
 * does), so the results are theirs bit for bit; what changes is that no
 * pass copies B: for groups of a few rows, where packing B costs as much
 * as the products, and for decoding, where B is read once. */
typedef void (*rd_sukr_t)(rd_int kc, const void *a, const void *b, rd_int ldb, void *c,
                          rd_int rs_c, rd_int cs_c, int m, int n, int mode);
typedef struct {
    rd_sukr_t ukr;
    int mr, nr;
} rd_sukr_desc_t;

/* A few-row kernel: the products of one packed A panel with at most `mr`
 * valid rows (m) and n columns of prepacked B, its micro-panels of the
 * family's NR columns `bstep` bytes apart (the last one cut at n), in one
 * call: C (+)= A B, each element what `main` (the family's micro-kernel of
 * the same compute type) gives it panel after panel, bit for bit.  What
 * changes is the order of independent work: with one to four rows, a
 * panel at a time leaves each column's chain of dependent multiply-adds as
 * the bound (their latency, not the memory); several panels at once overlap
 * those chains, and each B vector is decoded once for all the rows.  For
 * decoding (a few rows an expert), where every weight is read once.  (The
 * families take 3-4 rows here for quantized panels, whose decoding makes
 * the micro-kernel's 4-row body slower, where measured.) */
typedef void (*rd_fukr_t)(rd_int kc, const void *a, const void *b, size_t bstep, void *c,
                          rd_int rs_c, rd_int cs_c, int m, rd_int n, int mode);
typedef struct {
    rd_fukr_t ukr;
    int mr;         /* the most rows it takes */
    rd_ukr_t main;  /* the micro-kernel whose results it gives */
    rd_int kmax;    /* the longest contraction block it takes (0: any) */
} rd_fukr_desc_t;

/* One micro-kernel with its register block and default cache blocking:
 * MC x KC block of packed A (L2), KC x NC panel of packed B (L3), and a
 * KC x NR micro-panel of B (L1).  ukr == NULL: the family has none for
 * that compute type. */
typedef struct {
    rd_ukr_t ukr;
    int mr, nr;
    rd_int mc, kc, nc;
    /* NULL, or what a thread that ran ukr calls once its share of a call's
     * work is done (a matrix unit's tiles returned to the OS's init state) */
    void (*release)(void);
} rd_ukr_desc_t;

/* A kernel family: the micro-kernels one instruction set provides. */
typedef struct {
    const char *name;                  /* "ref", "avx2", "avx512" */
    int (*runnable)(void);             /* whether this CPU has its instructions */
    rd_ukr_desc_t types[RD_CT_COUNT];  /* indexed by rd_ctype_t */
    int twin;                          /* 1: the exact emulation of another
                                          family's instruction, runnable more
                                          widely, never chosen automatically */
    rd_sukr_desc_t stream[RD_CT_COUNT];  /* streaming kernels (ukr NULL: none) */
    rd_fukr_desc_t few[RD_CT_COUNT];     /* few-row kernels on prepacked B (ukr NULL: none) */
} rd_family_t;

/* Whether compute type ct is a dot-product type (served only by families
 * with the instruction; the portable family has no kernel for it). */
static inline int
rd_ctype_optional(int ct)
{
    return ct == RD_CT_BF16DP || ct == RD_CT_U8S8 || ct == RD_CT_BF16TILE || ct == RD_CT_U8S8TILE
           || ct == RD_CT_U8S8MMA || ct == RD_CT_BF16MMA || ct == RD_CT_U8S8_I4 || ct == RD_CT_U8S8_F4;
}

/* The type whose B panels a dot-product type reads (the tile types read
 * those of the vector dot types), else ct itself. */
static inline int
rd_ctype_layout(int ct)
{
    return ct == RD_CT_BF16TILE ? RD_CT_BF16DP : ct == RD_CT_U8S8TILE ? RD_CT_U8S8 : ct;
}

/* Whether compute type ct multiplies int8 values into exact int32 sums with
 * RD_CT_U8S8's trailers (B laid out for the int8 dot or MMLA products). */
static inline int
rd_ctype_int8_dot(int ct)
{
    return rd_ctype_layout(ct) == RD_CT_U8S8 || ct == RD_CT_U8S8MMA || ct == RD_CT_U8S8_I4 || ct == RD_CT_U8S8_F4;
}

/* Bytes a column of the row of scales after each B micro-panel of ct. */
static inline size_t
rd_b_scale_size(int ct)
{
    return rd_ctypes[ct].b_scale_size ? rd_ctypes[ct].b_scale_size : rd_ctypes[ct].scale_size;
}

/* Whether compute type ct reads 4-bit B panels with int8 rows (w4a8). */
static inline int
rd_ctype_w4a8(int ct)
{
    return ct == RD_CT_U8S8_I4 || ct == RD_CT_U8S8_F4;
}

/* The int8 value of a 4-bit code of a w4a8 compute type's B (rd_kernel.h,
 * RD_CT_U8S8_I4 / RD_CT_U8S8_F4). */
static inline int
rd_w4a8_value(int ct, unsigned code)
{
    return ct == RD_CT_U8S8_F4 ? (int)(2.0f * rd_e2m1_values[code & 15]) : (int)((code & 15) ^ 8) - 8;
}

/* The families compiled in, most preferred first, NULL-terminated
 * (config/rd_config.c). */
extern const rd_family_t *const rd_families[];

/* A run of memory this thread's driver will read soon (the next block of B
 * it packs): the float32 micro-kernels request one cache line of it per
 * contraction step, so that reading it from memory overlaps their
 * arithmetic instead of stalling the packing that follows.  next advances
 * as lines are requested; next == end: nothing to fetch. */
typedef struct {
    const char *next, *end;
} rd_ahead_t;
extern __thread rd_ahead_t rd_ahead;

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
