/*
 * The CPU's features, read once per process in a way every compiler takes:
 * cpuid and xgetbv on x86-64 (each instruction set only where the OS also
 * saves its registers), getauxval(AT_HWCAP, AT_HWCAP2) on Linux aarch64,
 * sysctlbyname("hw.optional.arm.FEAT_*") on macOS.  One file per
 * architecture (cpu/rd_cpu_x86.c, cpu/rd_cpu_arm.c) fills the table; the
 * kernels' runnable() checks, the packing routines and build_info() read
 * it, and nothing else asks the CPU.
 */
#ifndef RD_CPU_H
#define RD_CPU_H

/* 1 where the CPU has the instruction set and the OS runs it, else 0.  The
 * fields of the other architecture stay 0. */
typedef struct {
    /* x86-64 */
    int avx, avx2, fma, f16c;
    int avx512f, avx512bw, avx512_bf16, avx512_vnni, avx_vnni;
    int amx_tile, amx_bf16, amx_int8;   /* the CPU's bits; the OS's grant is
                                           rd_amx_unavailable()'s to ask */
    /* aarch64 */
    int neon;                           /* every aarch64 core */
    int dotprod;                        /* FEAT_DotProd: SDOT, UDOT */
    int bf16;                           /* FEAT_BF16: BFDOT, BFMMLA */
    int i8mm;                           /* FEAT_I8MM: SMMLA, USMMLA, SUDOT */
    int sve, sve2, sme;
} rd_cpu_t;

/* The features of this CPU (detected on first use; thread-safe). */
const rd_cpu_t *rd_cpu(void);

/* The features build_info() reports on this architecture, in order:
 * names[i] and values[i] for i < the count returned (at most `most`). */
int rd_cpu_list(const char **names, int *values, int most);

/* The architecture's own detection (cpu/rd_cpu_x86.c, cpu/rd_cpu_arm.c):
 * fills the fields it knows, leaves the others 0. */
void rd_cpu_detect_x86(rd_cpu_t *c);
void rd_cpu_detect_arm(rd_cpu_t *c);

#endif /* RD_CPU_H */
