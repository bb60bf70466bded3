/*
 * x86-64 features from cpuid and xgetbv (Intel SDM vol. 2, CPUID; vol. 1,
 * 13.3): an instruction set counts only where the CPU has it AND the OS
 * saves its registers (XCR0: bits 1-2 the SSE and AVX state, 5-7 the
 * AVX-512 state).  Any compiler with <cpuid.h> (gcc, clang, Apple clang)
 * builds it; no compiler-specific feature strings.
 */
#include "rd_cpu.h"

#if defined(__x86_64__) || defined(__i386__)

#include <cpuid.h>

static unsigned long long
rd_xcr0(void)
{
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

#define RD_BIT(x, n) (((x) >> (n)) & 1u)

void
rd_cpu_detect_x86(rd_cpu_t *c)
{
    unsigned a = 0, b = 0, cx = 0, d = 0;
    const unsigned top = __get_cpuid_max(0, 0);
    if (top < 1)
        return;
    __cpuid(1, a, b, cx, d);
    const int osxsave = (int)RD_BIT(cx, 27);
    const unsigned long long xcr0 = osxsave ? rd_xcr0() : 0;
    const int os_avx = (xcr0 & 0x6u) == 0x6u;
    const int os_avx512 = os_avx && (xcr0 & 0xe0u) == 0xe0u;
    c->avx = os_avx && RD_BIT(cx, 28);
    c->fma = c->avx && RD_BIT(cx, 12);
    c->f16c = c->avx && RD_BIT(cx, 29);
    if (top < 7)
        return;
    __cpuid_count(7, 0, a, b, cx, d);
    const unsigned max_sub = a;
    c->avx2 = c->avx && RD_BIT(b, 5);
    c->avx512f = os_avx512 && RD_BIT(b, 16);
    c->avx512bw = c->avx512f && RD_BIT(b, 30);
    c->avx512_vnni = c->avx512f && RD_BIT(cx, 11);
    c->amx_bf16 = (int)RD_BIT(d, 22);
    c->amx_tile = (int)RD_BIT(d, 24);
    c->amx_int8 = (int)RD_BIT(d, 25);
    if (max_sub >= 1) {
        __cpuid_count(7, 1, a, b, cx, d);
        c->avx_vnni = c->avx2 && RD_BIT(a, 4);
        c->avx512_bf16 = c->avx512f && RD_BIT(a, 5);
    }
}

#else

void
rd_cpu_detect_x86(rd_cpu_t *c)
{
    (void)c;
}

#endif
