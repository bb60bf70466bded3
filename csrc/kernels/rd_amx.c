/*
 * AMX tile micro-kernels (Intel Sapphire Rapids and later), written once
 * over the tile operations (kernels/rd_amx_body.h) and compiled twice:
 * here with the instructions (family "amx", where the CPU has AMX and the
 * OS grants the process its tile state), and in kernels/rd_amx_twin.c with
 * their emulation in plain C (family "amx-twin", compiled on every
 * architecture, runnable on every CPU, chosen only by name), so that the
 * packing, the chunking of the contraction, the edges and the epilogues
 * are tested everywhere.
 *
 *   rd_amx_bf16 / rd_amxtwin_bf16  (RD_CT_BF16TILE, 32 x 32): TDPBF16PS
 *   rd_amx_u8s8 / rd_amxtwin_u8s8  (RD_CT_U8S8TILE, 32 x 32): TDPBUSD
 *
 * The tile state, as Linux requires it:
 *   - the process asks once for permission to use it (arch_prctl
 *     ARCH_REQ_XCOMP_PERM for XTILEDATA; without it the first tile
 *     instruction raises SIGILL).  A CPU without AMX, an OS that does not
 *     enable its state or a refused request leaves the family not runnable,
 *     and rd_amx_unavailable() says which;
 *   - the tile configuration (palette 1, eight tiles of 16 rows x 64 bytes)
 *     is per thread: a kernel loads it when its thread has not yet
 *     (TENTER), so every OpenMP worker, and a thread some other library
 *     started, configures itself before its first tile operation;
 *   - the driver calls the descriptor's release hook on each thread that
 *     ran a tile kernel once its share of the call is done: TILERELEASE
 *     returns the state to its initial one, so no configuration outlives a
 *     call (the next call loads it again, a few dozen cycles).
 *
 * The twin's arithmetic: int8 exactly as the instruction (products of
 * unsigned and signed bytes summed in int32, modulo 2^32).  bfloat16: the
 * instruction's order of additions inside a tile is not documented and
 * matches none of the simple models measured (SPEC), so the twin takes the
 * order of Intel's pseudocode: per pair the even element's product, then
 * the odd one's, each added with one rounding to nearest even (a fused
 * multiply-add: the products of bfloat16 values are exact), denormal
 * inputs (and a denormal accumulator) read as 0 and denormal results
 * flushed to 0.  Native and twin then agree bit for bit wherever every
 * partial sum is exact, and both stay within the error bound of a float32
 * sum elsewhere.
 */
#include "rd_frame.h"
#include "rd_amx.h"

#ifdef RD_HAVE_X86_KERNELS

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ------------------------------------------------------------ the OS */

#define RD_ARCH_REQ_XCOMP_PERM 0x1023
#define RD_XFEATURE_XTILEDATA 18

static pthread_once_t rd_amx_once = PTHREAD_ONCE_INIT;
static int rd_amx_ok = 0;
static char rd_amx_why[160] = "";

/* The permission request: the system call, or (rd_amx_simulate_refusal,
 * for tests) a refusal with a chosen errno. */
static int rd_amx_refusal = 0;

#ifdef SYS_arch_prctl
static long
rd_amx_request(void)
{
    if (rd_amx_refusal != 0) {
        errno = rd_amx_refusal;
        return -1;
    }
    return syscall(SYS_arch_prctl, RD_ARCH_REQ_XCOMP_PERM, RD_XFEATURE_XTILEDATA);
}
#endif

static void
rd_amx_probe(void)
{
    const rd_cpu_t *cpu = rd_cpu();
    const int tile = cpu->amx_tile, bf16 = cpu->amx_bf16, int8 = cpu->amx_int8;
    if (!tile || !bf16 || !int8) {
        snprintf(rd_amx_why, sizeof rd_amx_why, "the CPU has no AMX (cpuid: AMX-TILE %d, AMX-BF16 %d, AMX-INT8 %d)",
                 tile, bf16, int8);
        return;
    }
    if (!cpu->avx512bw) {
        snprintf(rd_amx_why, sizeof rd_amx_why, "the CPU has AMX but not AVX-512F/BW");
        return;
    }
    /* the OS enables the tile state in XCR0 (bits 17: TILECFG, 18: TILEDATA) */
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) {
        snprintf(rd_amx_why, sizeof rd_amx_why, "the OS does not enable the AMX tile state (XCR0 = 0x%x)", lo);
        return;
    }
#ifdef SYS_arch_prctl
    if (rd_amx_request() != 0) {
        const int e = errno;
        /* ENOSPC: some thread's alternate signal stack (sigaltstack) is too
         * small for a signal frame that holds the tile state */
        snprintf(rd_amx_why, sizeof rd_amx_why, "the kernel refused the AMX tile state "
                 "(arch_prctl ARCH_REQ_XCOMP_PERM: %s%s)", strerror(e),
                 e == ENOSPC ? ": a thread's sigaltstack is too small for the tile state" : "");
        return;
    }
    rd_amx_ok = 1;
#else
    snprintf(rd_amx_why, sizeof rd_amx_why, "no arch_prctl system call on this OS");
#endif
    (void)hi;
}

const char *
rd_amx_unavailable(void)
{
    pthread_once(&rd_amx_once, rd_amx_probe);
    return rd_amx_ok ? NULL : rd_amx_why;
}

void
rd_amx_simulate_refusal(int err)
{
    pthread_once(&rd_amx_once, rd_amx_probe);
    rd_amx_refusal = err;
    rd_amx_ok = 0;
    rd_amx_why[0] = '\0';
    rd_amx_probe();
}

static int
rd_amx_runnable(void)
{
    return rd_amx_unavailable() == NULL;
}

/* Palette 1: eight tiles of 16 rows x 64 bytes (LDTILECFG's 64-byte block:
 * byte 0 the palette, bytes 16-31 colsb[8] as uint16, bytes 48-55 rows[8]). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} rd_tilecfg_t;

static const rd_tilecfg_t rd_tilecfg = {
    1, 0, {0},
    {64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0},
    {16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0},
};

/* ------------------------------------------------------ native tiles */

static __thread int rd_amx_loaded = 0;

/* (the tile instructions are inline assembly, which every assembler of
 * binutils >= 2.34 or clang takes: no compiler target for AMX, which gcc 10
 * does not know, is needed) */
#define RD_AMX_TARGET __attribute__((target("avx512f,avx512bw")))

RD_AMX_TARGET static inline void
rd_amx_enter(void)
{
    if (!rd_amx_loaded) {
        __asm__ volatile("ldtilecfg %0" : : "m"(rd_tilecfg) : "memory");
        rd_amx_loaded = 1;
    }
}

RD_AMX_TARGET static void
rd_amx_release(void)
{
    if (rd_amx_loaded) {
        __asm__ volatile("tilerelease" ::: "memory");
        rd_amx_loaded = 0;
    }
}

/* loads and stores that the compiler orders with the memory they touch */
#define TLOAD(t, p, s)                                                      \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t                        \
                     : : "r"((const void *)(p)), "r"((long)(s)) : "memory")
#define TSTORE(t, p, s)                                                     \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)"                    \
                     : : "r"((void *)(p)), "r"((long)(s)) : "memory")
#define TZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define TDPBF16(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define TDPBUSD(c, a, b) __asm__ volatile("tdpbusd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define TENTER() rd_amx_enter()
#define RD_TNAME(x) rd_amx_##x
#define RD_TTARGET RD_AMX_TARGET
#include "rd_amx_body.h"   /* (which undefines the macros above) */

/* ------------------------------------------------------------- families */

const rd_family_t rd_family_amx = {
    "amx", rd_amx_runnable,
    {[RD_CT_BF16TILE] = RD_AMX_BF16_DESC(rd_amx_bf16, rd_amx_release),
     [RD_CT_U8S8TILE] = RD_AMX_U8S8_DESC(rd_amx_u8s8, rd_amx_release)},
    0, {{NULL, 0, 0}}, {{NULL, 0, NULL, 0}},
};

#else /* no x86 kernels */

const char *
rd_amx_unavailable(void)
{
    return "not an x86-64 build";
}

void
rd_amx_simulate_refusal(int err)
{
    (void)err;
}

#endif /* RD_HAVE_X86_KERNELS */
