/* The NEON kernels of the w4a8 types (rd_neon_w4a8.c), for the family
 * "neon-dot" (rd_neon_dot.c). */
#ifndef RD_NEON_W4A8_H
#define RD_NEON_W4A8_H

#include "rd_kernel.h"

void rd_w4a8_neon_i4(rd_int kc, const void *a, const void *b, void *c, rd_int rs_c, rd_int cs_c, int m, int n,
                     int mode);
void rd_w4a8_neon_f4(rd_int kc, const void *a, const void *b, void *c, rd_int rs_c, rd_int cs_c, int m, int n,
                     int mode);
void rd_w4a8_few_neon_i4(rd_int kc, const void *a, const void *b, size_t bstep, void *c, rd_int rs_c,
                         rd_int cs_c, int m, rd_int n, int mode);
void rd_w4a8_few_neon_f4(rd_int kc, const void *a, const void *b, size_t bstep, void *c, rd_int rs_c,
                         rd_int cs_c, int m, rd_int n, int mode);

#endif /* RD_NEON_W4A8_H */
