/* Errors, aligned allocation and host arenas shared by every module. */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "gemm.h"

#ifdef MS_HAVE_CUDA
ms_status cuda_arena_alloc_storage(uint8_t **out, size_t bytes);
void cuda_arena_free_storage(uint8_t *p);
#endif

static _Thread_local char ms_errbuf[1024];

ms_status ms_error(ms_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ms_errbuf, sizeof ms_errbuf, fmt, ap);
    va_end(ap);
    return st;
}

ms_status ms_error_prefix(ms_status st, const char *fmt, ...)
{
    char prev[sizeof ms_errbuf];
    char head[512];
    memcpy(prev, ms_errbuf, sizeof prev);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    snprintf(ms_errbuf, sizeof ms_errbuf, "%.500s: %.500s", head, prev);
    return st;
}

const char *ms_last_error(void) { return ms_errbuf[0] ? ms_errbuf : "unknown error"; }
void ms_clear_error(void) { ms_errbuf[0] = '\0'; }

void ms_copy_printable(char *dst, size_t size, const char *src)
{
    if (size == 0) return;
    size_t i = 0;
    for (; src[i] && i + 1 < size; i++) dst[i] = src[i] >= 0x20 && src[i] < 0x7f ? src[i] : '?';
    dst[i] = 0;
}

void *ms_malloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    if (bytes > SIZE_MAX - 63) return NULL;
    if (posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63) != 0) return NULL;
    return p;
}

void *ms_calloc(size_t n, size_t size)
{
    size_t bytes;
    if (!ms_mul_size(&bytes, n, size)) return NULL;
    void *p = ms_malloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

void ms_free(void *p) { free(p); }

bool ms_mul_size(size_t *out, size_t a, size_t b)
{
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}

ms_status arena_init(ms_arena *a, size_t bytes, ms_device device)
{
    memset(a, 0, sizeof *a);
    a->device = device;
    if (bytes == 0) return MS_OK;
    if (device == MS_DEVICE_CUDA) {
#ifdef MS_HAVE_CUDA
        MS_TRY(cuda_arena_alloc_storage(&a->base, bytes));
#else
        return ms_error(MS_ERR_UNSUPPORTED, "CUDA arena requested in a build without CUDA");
#endif
    } else {
        a->base = ms_malloc(bytes);
        if (!a->base)
            return ms_error(MS_ERR_OOM, "out of memory: arena of %zu bytes", bytes);
    }
    a->cap = bytes;
    return MS_OK;
}

void arena_free(ms_arena *a)
{
    if (!a) return;
    if (a->base) {
#ifdef MS_HAVE_CUDA
        if (a->device == MS_DEVICE_CUDA) cuda_arena_free_storage(a->base);
        else ms_free(a->base);
#else
        ms_free(a->base);
#endif
    }
    ms_device d = a->device;
    memset(a, 0, sizeof *a);
    a->device = d;
}

void arena_begin_sizing(ms_arena *a)
{
    arena_free(a);
    a->sizing = true;
}

void *arena_alloc(ms_arena *a, size_t bytes)
{
    static uint8_t dummy[256] __attribute__((aligned(256)));
    size_t start = (a->used + 255) & ~(size_t)255;
    if (start < a->used || bytes > SIZE_MAX - start) {
        ms_error(MS_ERR_OOM, "arena request of %zu bytes overflows", bytes);
        return NULL;
    }
    size_t end = start + bytes;
    if (a->sizing) {
        a->used = end;
        if (end > a->high) a->high = end;
        return dummy;
    }
    if (end > a->cap) {
        ms_error(MS_ERR_OOM, "arena exhausted: need %zu bytes, have %zu of %zu free",
                 bytes, a->cap - start < a->cap ? a->cap - start : 0, a->cap);
        return NULL;
    }
    a->used = end;
    if (end > a->high) a->high = end;
    return a->base + start;
}

void backend_set_threads(ms_backend *be, int threads)
{
    if (threads <= 0) threads = 0;
#ifdef _OPENMP
    if (threads <= 0) threads = omp_get_num_procs();
    omp_set_num_threads(threads);
#else
    if (threads <= 0) threads = 1;
#endif
    gemm_init_threads(); /* OpenBLAS single-threaded: see kernels/gemm.h */
    be->threads = threads;
}

void backend_use_threads(const ms_backend *be)
{
#ifdef _OPENMP
    if (be->threads > 0 && omp_get_max_threads() != be->threads) omp_set_num_threads(be->threads);
#else
    (void)be;
#endif
}

bool ms_gpu_present(void)
{
    const char *env = getenv("MS_EXPECT_GPU");
    if (env && env[0] == '1') return true;
    if (access("/dev/nvidia0", F_OK) == 0) return true;
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (!d) return false;
    bool any = false;
    for (struct dirent *e; !any && (e = readdir(d)) != NULL;) any = e->d_name[0] != '.';
    closedir(d);
    return any;
}
