/*
 * Packing: where the operands' storage dtypes become the packed element
 * types of a compute type, and where their strides (transposed, negative,
 * broadcast) are resolved, so that the micro-kernels see nothing but
 * contiguous panels.  The table below says which routine packs what; a
 * compute type with another packed layout (k-pairs interleaved for a
 * bfloat16 dot product, say) adds its routines and its rows here.
 */
#include "rd_frame.h"

/* Keep gcc from turning the short fixed-width copies into calls to memmove. */
#pragma GCC optimize("no-tree-loop-distribute-patterns")

#define RD_SRC float
#define RD_DST float
#define RD_FN(x) rd_pack_s_s_##x
#include "rd_pack_impl.h"
#undef RD_SRC
#undef RD_DST
#undef RD_FN

#define RD_SRC double
#define RD_DST double
#define RD_FN(x) rd_pack_d_d_##x
#include "rd_pack_impl.h"
#undef RD_SRC
#undef RD_DST
#undef RD_FN

/* float32 operands of a float64 product: widened exactly while packing */
#define RD_SRC float
#define RD_DST double
#define RD_FN(x) rd_pack_s_d_##x
#include "rd_pack_impl.h"
#undef RD_SRC
#undef RD_DST
#undef RD_FN

/* [compute type][storage dtype][A, B] */
static const rd_pack_t rd_pack_table[RD_CT_COUNT][RD_DTYPE_COUNT][2] = {
    [RD_CT_F32] = {
        [RD_F32] = {rd_pack_s_s_pack, rd_pack_s_s_pack},
    },
    [RD_CT_F64] = {
        [RD_F32] = {rd_pack_s_d_pack, rd_pack_s_d_pack},
        [RD_F64] = {rd_pack_d_d_pack, rd_pack_d_d_pack},
    },
};

rd_pack_t
rd_packer(rd_ctype_t ct, rd_dtype_t src, int which)
{
    if ((unsigned)ct >= RD_CT_COUNT || (unsigned)src >= RD_DTYPE_COUNT || (which != 0 && which != 1))
        return NULL;
    return rd_pack_table[ct][src][which];
}
