/*
 * The table of CPU features (cpu/rd_cpu.h), detected once: the first
 * caller fills a private copy and publishes it; a racing caller fills its
 * own, with the same values, so no lock is needed.
 */
#include "rd_cpu.h"

#include <string.h>

static rd_cpu_t rd_cpu_table;
static int rd_cpu_ready = 0;

const rd_cpu_t *
rd_cpu(void)
{
    if (!__atomic_load_n(&rd_cpu_ready, __ATOMIC_ACQUIRE)) {
        rd_cpu_t c;
        memset(&c, 0, sizeof c);
        rd_cpu_detect_x86(&c);
        rd_cpu_detect_arm(&c);
        rd_cpu_table = c;
        __atomic_store_n(&rd_cpu_ready, 1, __ATOMIC_RELEASE);
    }
    return &rd_cpu_table;
}

int
rd_cpu_list(const char **names, int *values, int most)
{
    const rd_cpu_t *c = rd_cpu();
    int n = 0;
#define RD_LIST(key, field)                                                  \
    if (n < most) {                                                         \
        names[n] = key;                                                     \
        values[n] = c->field;                                               \
        n++;                                                                \
    }
#if defined(__x86_64__) || defined(__i386__)
    RD_LIST("avx2", avx2)
    RD_LIST("fma", fma)
    RD_LIST("f16c", f16c)
    RD_LIST("avx512f", avx512f)
    RD_LIST("avx512_bf16", avx512_bf16)
    RD_LIST("avx512_vnni", avx512_vnni)
    RD_LIST("avx_vnni", avx_vnni)
#elif defined(__aarch64__)
    RD_LIST("neon", neon)
    RD_LIST("dotprod", dotprod)
    RD_LIST("bf16", bf16)
    RD_LIST("i8mm", i8mm)
    RD_LIST("sve", sve)
    RD_LIST("sve2", sve2)
    RD_LIST("sme", sme)
#endif
#undef RD_LIST
    (void)c;
    return n;
}
