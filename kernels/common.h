/* kernels/: the ops mitaseg is built from. Each op has a CPU reference in
 * <op>.c and a CUDA twin in <op>.cu; ops.h declares the backend-neutral
 * dispatchers that backbone/ and decoder/ call. This header holds what every
 * op shares: status codes, error messages, check macros, arenas, backends. */
#ifndef MS_COMMON_H
#define MS_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Scalar helpers shared by CPU ops and CUDA kernels, so CPU tests cover the
 * arithmetic the kernels run. */
#if defined(__CUDACC__)
#define MS_HD __host__ __device__ __forceinline__
#else
#define MS_HD static inline
#endif

/* The bits of a float, in host and device code alike. */
MS_HD uint32_t ms_float_bits(float x)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

/* The float with the given bits. */
MS_HD float ms_bits_float(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

typedef enum {
    MS_OK = 0,
    MS_ERR_IO,          /* file missing, unreadable, write failed */
    MS_ERR_FORMAT,      /* malformed or lying file */
    MS_ERR_ARG,         /* bad argument or size */
    MS_ERR_OOM,         /* host or device allocation failed */
    MS_ERR_CUDA,        /* CUDA, cuBLAS or cuDNN failure */
    MS_ERR_UNSUPPORTED  /* valid but not supported here (no GPU, ...) */
} ms_status;

/* Library code never prints: it records one message per thread and returns a
 * status; app/ shows it. */
ms_status ms_error(ms_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefixes the current message: "ctx: previous message". */
ms_status ms_error_prefix(ms_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
const char *ms_last_error(void);
void ms_clear_error(void);
/* dst = src cut to size - 1 bytes, every byte outside printable ASCII as
 * '?': a user's string (an environment variable) safe to show. */
void ms_copy_printable(char *dst, size_t size, const char *src);

/* Propagate a non-OK status. */
#define MS_TRY(call)                                   \
    do {                                               \
        ms_status ms_try_st_ = (call);                 \
        if (ms_try_st_ != MS_OK) return ms_try_st_;    \
    } while (0)

/* Checked allocation: reports the call, file and line. */
#define MS_CHECK_ALLOC(ptr, bytes)                                               \
    do {                                                                         \
        if ((ptr) == NULL)                                                       \
            return ms_error(MS_ERR_OOM, "out of memory: %s (%zu bytes) at %s:%d", \
                            #ptr, (size_t)(bytes), __FILE__, __LINE__);          \
    } while (0)

/* Elements below which a memory-bound CPU loop runs on the calling thread
 * alone (`if` clauses): a team's start costs a wake-up per thread, tens of
 * microseconds under libgomp's passive wait in a VM, more than such a
 * loop takes (a 1000x1000 image in 16-pixel tiles, 2 threads, passive:
 * 28 s before the guards). MS_PAR_MIN_TOKENS: the same for attention. */
#define MS_PAR_MIN 32768
#define MS_PAR_MIN_TOKENS 32

void *ms_malloc(size_t bytes);          /* 64-byte aligned, NULL on failure */
void *ms_calloc(size_t n, size_t size); /* 64-byte aligned, zeroed, overflow-checked */
void ms_free(void *p);

/* Overflow-checked size products; false when the product overflows. */
bool ms_mul_size(size_t *out, size_t a, size_t b);

typedef enum { MS_DEVICE_CPU = 0, MS_DEVICE_CUDA = 1 } ms_device;

/* A bump arena: one for weights, one for activations. In sizing mode nothing
 * is allocated and only the high-water mark is tracked, so the engine can
 * size the activation arena with a dry run at the first image of a size. */
typedef struct {
    uint8_t *base;    /* host or device memory, owned */
    size_t cap;
    size_t used;
    size_t high;      /* high-water mark */
    ms_device device;
    bool sizing;
} ms_arena;

ms_status arena_init(ms_arena *a, size_t bytes, ms_device device);
void arena_free(ms_arena *a);
void arena_begin_sizing(ms_arena *a); /* frees storage, counts from zero */
/* 256-byte aligned; NULL (with message set) when the arena is exhausted.
 * In sizing mode returns a non-NULL dummy that must not be dereferenced. */
void *arena_alloc(ms_arena *a, size_t bytes);
static inline size_t arena_mark(const ms_arena *a) { return a->used; }
static inline void arena_reset(ms_arena *a, size_t mark) { a->used = mark; }

/* Where ops run. dry_run: ops return MS_OK without touching memory (sizing). */
typedef struct {
    ms_device device;
    int threads;          /* CPU threads (OpenMP + OpenBLAS) */
    bool dry_run;
    bool fp32;            /* CUDA: FP32 GEMMs (verification); else FP16/BF16 tensor cores */
    bool tc_round;        /* CPU: round GEMM operands as CUDA's tensor-core mode does
                           * (BF16 for linear and conv_transpose2x2, TF32 for conv2d,
                           * FP32 accumulation), to compare against it; verification only */
    ms_arena *scratch;    /* temporary buffers for ops, from the activation arena */
    void *cuda;           /* ms_cuda_ctx *, see kernels/cuda_ctx.h */
} ms_backend;

void backend_set_threads(ms_backend *be, int threads);
/* OpenMP's team size is a per-thread setting: makes be->threads the calling
 * thread's, for a run on another thread than backend_set_threads's (a
 * batch worker, the viewer's). */
void backend_use_threads(const ms_backend *be);

/* Whether this machine has an NVIDIA GPU, judged without CUDA: the kernel
 * driver lists one (/proc/driver/nvidia/gpus, /dev/nvidia0), or
 * $MS_EXPECT_GPU=1 says so (the device scripts set it when nvidia-smi sees
 * one). With a GPU present, a test that cannot use it must fail, not skip. */
bool ms_gpu_present(void);

#ifdef __cplusplus
}
#endif
#endif
