/*
 * aarch64 features: the kernel's hardware capability words on Linux
 * (getauxval; bit numbers of <asm/hwcap.h>, given here where an older
 * header lacks them), sysctlbyname("hw.optional.arm.FEAT_*") on macOS.
 * NEON (Advanced SIMD) is in every aarch64 core.  Elsewhere (another OS)
 * only NEON is assumed.
 */
#include "rd_cpu.h"

#if defined(__aarch64__)

#if defined(__linux__)
#include <sys/auxv.h>

/* AT_HWCAP */
#define RD_HWCAP_ASIMD (1ul << 1)
#define RD_HWCAP_ASIMDDP (1ul << 20)
#define RD_HWCAP_SVE (1ul << 22)
/* AT_HWCAP2 */
#define RD_HWCAP2_SVE2 (1ul << 1)
#define RD_HWCAP2_I8MM (1ul << 13)
#define RD_HWCAP2_BF16 (1ul << 14)
#define RD_HWCAP2_SME (1ul << 23)

void
rd_cpu_detect_arm(rd_cpu_t *c)
{
    const unsigned long h1 = getauxval(AT_HWCAP);
#ifdef AT_HWCAP2
    const unsigned long h2 = getauxval(AT_HWCAP2);
#else
    const unsigned long h2 = 0;
#endif
    c->neon = (h1 & RD_HWCAP_ASIMD) != 0;
    c->dotprod = c->neon && (h1 & RD_HWCAP_ASIMDDP) != 0;
    c->sve = (h1 & RD_HWCAP_SVE) != 0;
    c->sve2 = c->sve && (h2 & RD_HWCAP2_SVE2) != 0;
    c->i8mm = c->neon && (h2 & RD_HWCAP2_I8MM) != 0;
    c->bf16 = c->neon && (h2 & RD_HWCAP2_BF16) != 0;
    c->sme = (h2 & RD_HWCAP2_SME) != 0;
}

#elif defined(__APPLE__)
#include <stddef.h>
#include <sys/sysctl.h>

static int
rd_sysctl_flag(const char *name)
{
    int v = 0;
    size_t size = sizeof v;
    return sysctlbyname(name, &v, &size, NULL, 0) == 0 && v != 0;
}

void
rd_cpu_detect_arm(rd_cpu_t *c)
{
    c->neon = 1;
    c->dotprod = rd_sysctl_flag("hw.optional.arm.FEAT_DotProd");
    c->bf16 = rd_sysctl_flag("hw.optional.arm.FEAT_BF16");
    c->i8mm = rd_sysctl_flag("hw.optional.arm.FEAT_I8MM");
    c->sme = rd_sysctl_flag("hw.optional.arm.FEAT_SME");
}

#else

void
rd_cpu_detect_arm(rd_cpu_t *c)
{
    c->neon = 1;
}

#endif

#else

void
rd_cpu_detect_arm(rd_cpu_t *c)
{
    (void)c;
}

#endif
