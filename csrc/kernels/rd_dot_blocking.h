/*
 * The register blocks and cache blocking of the dot-product families,
 * shared by each native kernel file and by the twins (kernels/rd_dot_twins.c):
 * a twin has its native family's blocking, so the two sum the same blocks
 * of the contraction and give the same bits.
 */
#ifndef RD_DOT_BLOCKING_H
#define RD_DOT_BLOCKING_H

/* AVX-512 (kernels/rd_avx512_dot.c), measured on Zen4 (4096 x 2048 x 2048,
 * 2 threads): KC = 1024 steps for bfloat16 (a 64 KiB B micro-panel; 512
 * and 2048 ran within 3%), KC = 2048 for int8 (one block, one epilogue and
 * one store of each C tile for k <= 2048: 10-20% faster than 512).  A
 * product of int8-int32 with the same KC has the same block sums and so
 * the same results, bit for bit. */
#define RD_BF16_DESC(UKR) {UKR, 12, 32, 144, 1024, 4080, NULL}
#define RD_VNNI_KC 2048
#define RD_VNNI_DESC(UKR) {UKR, 12, 32, 144, RD_VNNI_KC, 4080, NULL}
/* AVX-VNNI (kernels/rd_avx_vnni.c): the AVX2 integer kernel's (MC 144, KC 512). */
#define RD_AVXVNNI_DESC(UKR) {UKR, 6, 16, 144, 512, 4080, NULL}
/* NEON (kernels/arm/): 12 rows x 8 columns, the float32 kernel's block; KC
 * as the AVX-512 families' (a 12 x 8 int8 block sums 2048 steps exactly in
 * int32; a bfloat16 micro-panel of 1024 steps is 16 KiB). */
#define RD_NEON_BF16_DESC(UKR) {UKR, 12, 8, 144, 1024, 4080, NULL}
#define RD_NEON_I8_DESC(UKR) {UKR, 12, 8, 144, 2048, 4080, NULL}

#endif /* RD_DOT_BLOCKING_H */
