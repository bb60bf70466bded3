/*
 * The configuration that binds the kernel library together: the compute
 * types, and the table of micro-kernel families, most preferred first.
 * Automatic selection takes, per compute type, the first family in this
 * table whose CPU check passes and that has a kernel for that type, so a
 * family that serves only some types (a bfloat16 dot-product kernel, say)
 * is one more row and the others keep serving the rest.
 */
#include "rd_frame.h"

const rd_ctype_desc_t rd_ctypes[RD_CT_COUNT] = {
    /* name, bytes of a packed A / packed B / output element, k_unit, bytes a row
     * of A's scales (and B's, unless the last field says), 4-bit B, bytes a
     * column of B's scales where not A's (0: as A's) */
    [RD_CT_F32] = {"float32", sizeof(float), sizeof(float), sizeof(float), 1, 0, 0, 0},
    [RD_CT_F64] = {"float64", sizeof(double), sizeof(double), sizeof(double), 1, 0, 0, 0},
    [RD_CT_F32_BF16W] = {"float32-bfloat16w", sizeof(float), 2, sizeof(float), 1, 0, 0, 0},
    [RD_CT_F32_F16W] = {"float32-float16w", sizeof(float), 2, sizeof(float), 1, 0, 0, 0},
    /* int16 k-pairs, each micro-panel followed by one float scale a row */
    [RD_CT_I8I32] = {"int8-int32", 2, 2, sizeof(float), 2, sizeof(float), 0, 0},
    /* one-byte B panels of prepacked quantized weights, each micro-panel
     * followed by its rd_qtrailer_t and scales (not counted here: the
     * trailer's size depends on the block, see rd_prepack) */
    [RD_CT_F32_I8W] = {"float32-int8w", sizeof(float), 1, sizeof(float), 1, 0, 0, 0},
    [RD_CT_F32_F8W] = {"float32-float8w", sizeof(float), 1, sizeof(float), 1, 0, 0, 0},
    /* bfloat16 k-pairs (vdpbf16ps) */
    [RD_CT_BF16DP] = {"bfloat16-dot", 2, 2, sizeof(float), 2, 0, 0, 0},
    /* int8 k-quads (vpdpbusd), each micro-panel followed by an int32 sum,
     * a float scale and an int32 zero point a row */
    [RD_CT_U8S8] = {"int8-dot", 1, 1, sizeof(float), 4, 12, 0, 0},
    /* AMX tiles: A row after row (int8: each row followed by its sum, scale
     * and zero point), B as the two types above */
    [RD_CT_BF16TILE] = {"bfloat16-tile", 2, 2, sizeof(float), 2, 0, 0, 0},
    [RD_CT_U8S8TILE] = {"int8-tile", 1, 1, sizeof(float), 4, 12, 0, 0},
    /* 4-bit B panels (two values a byte), each micro-panel followed by its
     * rd_qtrailer_t and one e8m0 exponent a column per scale run */
    [RD_CT_F32_F4W] = {"float32-float4w", sizeof(float), 1, sizeof(float), 1, 0, 1, 0},
    [RD_CT_F32_I4W] = {"float32-int4w", sizeof(float), 1, sizeof(float), 1, 0, 1, 0},
    /* Arm's MMLA types: blocks of 8 int8 / 4 bfloat16 steps (int8: each
     * micro-panel followed by the trailers of int8-dot) */
    [RD_CT_U8S8MMA] = {"int8-mmla", 1, 1, sizeof(float), 8, 12, 0, 0},
    [RD_CT_BF16MMA] = {"bfloat16-mmla", 2, 2, sizeof(float), 4, 0, 0, 0},
    /* w4a8: int8 k-quads of A with the int8-dot row trailer, 4-bit k-quads
     * of B, each micro-panel followed by one scale a column (a float; an
     * e8m0 exponent byte for MXFP4) */
    [RD_CT_U8S8_I4] = {"int8-int4-dot", 1, 1, sizeof(float), 4, 12, 1, sizeof(float)},
    [RD_CT_U8S8_F4] = {"int8-mxfp4-dot", 1, 1, sizeof(float), 4, 12, 1, 1},
};

const size_t rd_dtype_size[RD_DTYPE_COUNT] = {
    [RD_F32] = sizeof(float),
    [RD_F64] = sizeof(double),
    [RD_F16] = 2,
    [RD_BF16] = 2,
    [RD_I8] = 1,
    [RD_F8E4M3] = 1,
    [RD_F32_AS_BF16] = sizeof(float),
    [RD_F4E2M1] = 1,    /* one nibble: 4-bit operands are addressed in nibbles */
};

const char *const rd_dtype_names[RD_DTYPE_COUNT] = {
    [RD_F32] = "float32",
    [RD_F64] = "float64",
    [RD_F16] = "float16",
    [RD_BF16] = "bfloat16",
    [RD_I8] = "int8",
    [RD_F8E4M3] = "float8_e4m3fn",
    [RD_F32_AS_BF16] = "float32 as bfloat16",
    [RD_F4E2M1] = "float4_e2m1fn",
};

extern const rd_family_t rd_family_ref;
/* the twins (plain C: every architecture) */
extern const rd_family_t rd_family_avx512_bf16_twin, rd_family_avx512_vnni_twin, rd_family_avx_vnni_twin;
extern const rd_family_t rd_family_amx_twin;
extern const rd_family_t rd_family_neon_bf16_twin, rd_family_neon_i8mm_twin, rd_family_neon_dot_twin;
#ifdef RD_HAVE_X86_KERNELS
extern const rd_family_t rd_family_avx2;
extern const rd_family_t rd_family_avx512;
extern const rd_family_t rd_family_avx512_bf16, rd_family_avx512_vnni, rd_family_avx_vnni;
extern const rd_family_t rd_family_amx;
#endif
#ifdef RD_HAVE_ARM_KERNELS
extern const rd_family_t rd_family_neon, rd_family_neon_bf16, rd_family_neon_i8mm, rd_family_neon_dot;
#endif

/* The dot-product families come first: each serves only its own compute
 * type, and the float families serve the rest.  The twins come last but
 * the portable one; they are chosen only by name, and every build has all
 * of them, whatever its architecture. */
const rd_family_t *const rd_families[] = {
#ifdef RD_HAVE_X86_KERNELS
    &rd_family_amx,
    &rd_family_avx512_bf16,
    &rd_family_avx512_vnni,
    &rd_family_avx_vnni,
    &rd_family_avx512,
    &rd_family_avx2,
#endif
#ifdef RD_HAVE_ARM_KERNELS
    &rd_family_neon_bf16,
    &rd_family_neon_i8mm,
    &rd_family_neon_dot,
    &rd_family_neon,
#endif
    &rd_family_avx512_bf16_twin,
    &rd_family_avx512_vnni_twin,
    &rd_family_avx_vnni_twin,
    &rd_family_amx_twin,
    &rd_family_neon_bf16_twin,
    &rd_family_neon_i8mm_twin,
    &rd_family_neon_dot_twin,
    &rd_family_ref,
    NULL,
};
