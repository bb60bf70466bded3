/*
 * Result buffers: 64-byte aligned (the kernels stream whole cache lines
 * into them), and large ones kept for reuse once their array is gone.
 *
 * A fresh block of hundreds of megabytes is new memory to the OS, which
 * zeroes every page on its first touch: for tgmm's [g, k, n] output with
 * small groups that zeroing takes longer than the products themselves.  A
 * block returned here is kept while the idle blocks stay under the cache
 * limit, and the next request of about its size gets it back with its
 * pages already mapped.  Oldest idle blocks go first when the limit is
 * reached.
 *
 * Not thread-safe: the binding calls these with the GIL held.
 */
#include "rd_frame.h"

#include <stdint.h>
#include <stdlib.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define RD_POOL_SLOTS 16
/* Blocks from this size on are kept (smaller ones are cheap to fault in and
 * malloc recycles them anyway) and get 2 MiB alignment for huge pages. */
#define RD_POOL_MIN_BYTES ((size_t)4 << 20)
#define RD_HUGE_ALIGN ((size_t)2 << 20)

typedef struct {
    void *p;
    size_t bytes;
    unsigned long long stamp;
} rd_block_t;

static rd_block_t rd_idle[RD_POOL_SLOTS];
static int rd_nidle = 0;
static size_t rd_idle_bytes = 0;
static size_t rd_pool_limit = RD_BUFFER_CACHE_DEFAULT;
static unsigned long long rd_clock = 0;

static void
rd_drop_idle(int i)
{
    free(rd_idle[i].p);
    rd_idle_bytes -= rd_idle[i].bytes;
    rd_idle[i] = rd_idle[--rd_nidle];
}

/* Free the oldest idle blocks until `extra` more bytes (and one more
 * block) fit under the limit. */
static void
rd_trim(size_t extra)
{
    while (rd_nidle > 0 && (rd_idle_bytes + extra > rd_pool_limit || rd_nidle == RD_POOL_SLOTS)) {
        int old = 0;
        for (int i = 1; i < rd_nidle; i++)
            if (rd_idle[i].stamp < rd_idle[old].stamp)
                old = i;
        rd_drop_idle(old);
    }
}

void *
rd_buffer_take(size_t bytes, size_t *got)
{
    if (bytes == 0)
        bytes = 1;
    /* the smallest idle block that holds `bytes` without wasting more than
     * a quarter of it */
    int best = -1;
    for (int i = 0; i < rd_nidle; i++) {
        size_t b = rd_idle[i].bytes;
        if (b >= bytes && b - bytes <= bytes / 4 && (best < 0 || b < rd_idle[best].bytes))
            best = i;
    }
    if (best >= 0) {
        void *p = rd_idle[best].p;
        *got = rd_idle[best].bytes;
        rd_idle_bytes -= *got;
        rd_idle[best] = rd_idle[--rd_nidle];
        return p;
    }
    int large = bytes >= RD_POOL_MIN_BYTES;
    size_t align = large ? RD_HUGE_ALIGN : (size_t)RD_ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, align, bytes) != 0)
        return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (large)
        (void)madvise(p, bytes / RD_HUGE_ALIGN * RD_HUGE_ALIGN, MADV_HUGEPAGE);
#endif
    *got = bytes;
    return p;
}

void
rd_buffer_give(void *p, size_t bytes)
{
    if (p == NULL)
        return;
    if (bytes < RD_POOL_MIN_BYTES || bytes > rd_pool_limit) {
        free(p);
        return;
    }
    rd_trim(bytes);
    rd_idle[rd_nidle].p = p;
    rd_idle[rd_nidle].bytes = bytes;
    rd_idle[rd_nidle].stamp = ++rd_clock;
    rd_nidle++;
    rd_idle_bytes += bytes;
}

size_t
rd_buffer_cache_limit(size_t limit)
{
    size_t previous = rd_pool_limit;
    if (limit != SIZE_MAX) {
        rd_pool_limit = limit;
        rd_trim(0);
    }
    return previous;
}

size_t
rd_buffer_cache_idle(void)
{
    return rd_idle_bytes;
}
