/*
 * What the AMX family (kernels/rd_amx.c) and its twin (kernels/rd_amx_twin.c)
 * share: their blocking.
 */
#ifndef RD_AMX_H
#define RD_AMX_H

/* Blocking: a 32 x 32 block (four accumulator tiles, the most eight tiles
 * allow beside two of A and two of B).  KC keeps a B micro-panel in L1
 * (bfloat16: 256 steps x 32 columns = 16 KiB; int8: 512 steps, 16 KiB)
 * beside the A micro-panel being read, MC = 128 rows of A (64-128 KiB) in
 * L2, NC = 4096 columns.  Chosen from the tile facts (SPEC section 6), not
 * measured here: the tuner's candidates (KC / 2, KC / 4, ...) and the plan
 * table take a measured blocking per shape class. */
#define RD_AMX_BF16_DESC(UKR, REL) {UKR, 32, 32, 128, 256, 4096, REL}
#define RD_AMX_U8S8_DESC(UKR, REL) {UKR, 32, 32, 128, 512, 4096, REL}

#endif /* RD_AMX_H */
