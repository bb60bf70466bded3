/* The AVX-512 VNNI kernels of the w4a8 types (rd_avx512_w4a8.c), for the
 * family "avx512-vnni" (rd_avx512_dot.c). */
#ifndef RD_AVX512_W4A8_H
#define RD_AVX512_W4A8_H

#include "rd_dot_blocking.h"
#include "rd_kernel.h"

void rd_w4a8_avx512_i4(rd_int kc, const void *a, const void *b, void *c, rd_int rs_c, rd_int cs_c, int m, int n,
                       int mode);
void rd_w4a8_avx512_f4(rd_int kc, const void *a, const void *b, void *c, rd_int rs_c, rd_int cs_c, int m, int n,
                       int mode);
/* The longest contraction block the few-row kernels take (their copy of
 * A's quads lives on the stack): the family's KC. */
#define RD_W4_KMAX ((rd_int)RD_VNNI_KC)
/* The most rows they take (the descriptor's mr; A's panels hold 12). */
#define RD_W4_FEW_ROWS 8

void rd_w4a8_few_avx512_i4(rd_int kc, const void *a, const void *b, size_t bstep, void *c, rd_int rs_c,
                           rd_int cs_c, int m, rd_int n, int mode);
void rd_w4a8_few_avx512_f4(rd_int kc, const void *a, const void *b, size_t bstep, void *c, rd_int rs_c,
                           rd_int cs_c, int m, rd_int n, int mode);

#endif /* RD_AVX512_W4A8_H */
