/* The AVX2 few-row kernels (rd_avx2_few.c), for rd_avx2.c's family. */
#ifndef RD_AVX2_FEW_H
#define RD_AVX2_FEW_H

#include "rd_kernel.h"

#define RD_FEW_PROTO(NAME)                                                  \
    void NAME(rd_int kc, const void *a, const void *b, size_t bstep, void *c, \
              rd_int rs_c, rd_int cs_c, int m, rd_int n, int mode);
RD_FEW_PROTO(rd_few_avx2_i8w)
RD_FEW_PROTO(rd_few_avx2_f8w)
RD_FEW_PROTO(rd_few_avx2_f4w)
RD_FEW_PROTO(rd_few_avx2_i4w)
#undef RD_FEW_PROTO

#endif /* RD_AVX2_FEW_H */
