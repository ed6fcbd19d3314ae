/* The CUDA backend (the kernels/ .cu files) is a shared library, libmitaseg_cuda.so,
 * loaded on first use: a CPU run maps no CUDA runtime, cuBLAS or cuDNN and
 * pays none of their start-up time or memory. Every extern "C" function of
 * the backend has a stub here with the same name and signature (the headers
 * included below make the compiler check each one) that loads the library
 * once, then calls the real function. The library resolves ms_error and the
 * other engine functions it uses from the program, which exports them
 * (CMakeLists.txt), so there is one error message per thread.
 *
 * Where it is looked for: $MITASEG_CUDA_LIB when set, else next to the
 * program (the build folder), else by its plain name (the loader's search
 * path: an installed layout). When it cannot be loaded, a status-returning
 * call fails with MS_ERR_UNSUPPORTED and one line naming the library and
 * why (so --device auto falls back to the CPU saying so), size queries
 * return 0 and the rest do nothing. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention_full.h"
#include "conv.h"
#include "cuda_ctx.h"
#include "elementwise.h"
#include "layernorm.h"
#include "linear.h"
#include "mita.h"
#include "pool.h"
#include "resize.h"

/* For the benchmarks only (bench/bench_gpu_attention.c declares them). */
void *cuda_ctx_stream(ms_cuda_ctx *cu);
void mita_cuda_profile(float *stage_ms /* (8) or NULL */);

#define MS_CUDA_LIB_NAME "libmitaseg_cuda.so"

/* FN(return type, name, parameters, arguments, value when not loaded) */
#define MS_CUDA_FUNCS(FN)                                                                        \
    FN(ms_status, cuda_ctx_init, (ms_cuda_ctx **out, int device_index), (out, device_index),    \
       (*out = NULL, cuda_unavailable()))                                                        \
    FN(ms_status, cuda_ctx_use, (ms_cuda_ctx *cu), (cu), cuda_unavailable())                     \
    FN(ms_status, cuda_ctx_forget_weights, (ms_cuda_ctx *cu), (cu), cuda_unavailable())          \
    FN(const char *, cuda_ctx_name, (const ms_cuda_ctx *cu), (cu), "none")                      \
    FN(void *, cuda_ctx_stream, (ms_cuda_ctx *cu), (cu), NULL)                                   \
    FN(ms_status, cuda_copy_h2d, (ms_cuda_ctx *cu, void *dst, const void *src, size_t bytes),    \
       (cu, dst, src, bytes), cuda_unavailable())                                                \
    FN(ms_status, cuda_copy_d2h, (ms_cuda_ctx *cu, void *dst, const void *src, size_t bytes),    \
       (cu, dst, src, bytes), cuda_unavailable())                                                \
    FN(ms_status, cuda_fill_bytes, (ms_cuda_ctx *cu, void *dst, int value, size_t bytes),        \
       (cu, dst, value, bytes), cuda_unavailable())                                              \
    FN(ms_status, cuda_query_device,                                                             \
       (int i, char *name, int *cc_major, int *cc_minor, size_t *total_bytes),                   \
       (i, name, cc_major, cc_minor, total_bytes), cuda_unavailable())                           \
    FN(ms_status, cuda_sync, (ms_cuda_ctx *cu), (cu), cuda_unavailable())                        \
    FN(ms_status, cuda_arena_alloc_storage, (uint8_t **out, size_t bytes), (out, bytes),         \
       (*out = NULL, cuda_unavailable()))                                                        \
    FN(size_t, attention_full_cuda_scratch_bytes, (int n, int c, int heads), (n, c, heads), 0)   \
    FN(ms_status, attention_full_cuda,                                                           \
       (ms_backend *be, float *out, const float *qkv, int n, int c, int heads, void *ws),        \
       (be, out, qkv, n, c, heads, ws), cuda_unavailable())                                      \
    FN(size_t, conv2d_cuda_scratch_bytes,                                                        \
       (int ci, int h, int wd, int co, int kh, int kw, int stride, int pad, bool fp32),          \
       (ci, h, wd, co, kh, kw, stride, pad, fp32), 0)                                            \
    FN(ms_status, conv2d_cuda,                                                                   \
       (ms_backend *be, float *out, const float *in, const float *w, const float *b, int ci,     \
        int h, int wd, int co, int kh, int kw, int stride, int pad, ms_act act, void *ws),       \
       (be, out, in, w, b, ci, h, wd, co, kh, kw, stride, pad, act, ws), cuda_unavailable())     \
    FN(size_t, conv_transpose2x2_cuda_scratch_bytes, (int ci, int h, int wd, int co, bool fp32), \
       (ci, h, wd, co, fp32), 0)                                                                 \
    FN(ms_status, conv_transpose2x2_cuda,                                                        \
       (ms_backend *be, float *out, const float *in, const float *w, const float *b, int ci,     \
        int h, int wd, int co, ms_act act, void *ws),                                            \
       (be, out, in, w, b, ci, h, wd, co, act, ws), cuda_unavailable())                          \
    FN(ms_status, add_cuda,                                                                      \
       (ms_backend *be, float *out, const float *a, const float *b, size_t n),                   \
       (be, out, a, b, n), cuda_unavailable())                                                   \
    FN(ms_status, window_add_cuda,                                                               \
       (ms_backend *be, float *acc, const float *win, int c, int h, int w, int wh, int ww,       \
        int y0, int x0, bool first),                                                             \
       (be, acc, win, c, h, w, wh, ww, y0, x0, first), cuda_unavailable())                       \
    FN(ms_status, window_average_cuda,                                                           \
       (ms_backend *be, float *acc, int c, int h, int w, int wh, int ww, int sh, int sw),        \
       (be, acc, c, h, w, wh, ww, sh, sw), cuda_unavailable())                                   \
    FN(ms_status, transpose_cuda, (ms_backend *be, float *out, const float *in, int rows,        \
                                   int cols),                                                    \
       (be, out, in, rows, cols), cuda_unavailable())                                            \
    FN(ms_status, softmax_rows_cuda, (ms_backend *be, float *x, int rows, int cols),             \
       (be, x, rows, cols), cuda_unavailable())                                                  \
    FN(ms_status, crop_cuda,                                                                     \
       (ms_backend *be, float *out, const float *in, int c, int h, int w, int ho, int wo),       \
       (be, out, in, c, h, w, ho, wo), cuda_unavailable())                                       \
    FN(ms_status, argmax_cuda, (ms_backend *be, uint8_t *out, const float *in, int c, int h,     \
                                int w),                                                          \
       (be, out, in, c, h, w), cuda_unavailable())                                               \
    FN(ms_status, normalize_pad_cuda,                                                            \
       (ms_backend *be, float *out, const float *in, int h, int w, int hp, int wp,               \
        const float mean[3], const float stdv[3]),                                               \
       (be, out, in, h, w, hp, wp, mean, stdv), cuda_unavailable())                              \
    FN(ms_status, layernorm_cuda,                                                                \
       (ms_backend *be, float *out, const float *in, const float *w, const float *b, int n,      \
        int c, float eps),                                                                       \
       (be, out, in, w, b, n, c, eps), cuda_unavailable())                                       \
    FN(size_t, linear_cuda_scratch_bytes, (int n, int cin, bool fp32), (n, cin, fp32), 0)        \
    FN(ms_status, linear_cuda,                                                                   \
       (ms_backend *be, float *out, const float *in, const float *w, const float *b, int n,      \
        int cin, int cout, ms_act act, bool residual, void *ws),                                 \
       (be, out, in, w, b, n, cin, cout, act, residual, ws), cuda_unavailable())                 \
    FN(size_t, mita_cuda_scratch_bytes,                                                          \
       (int hp, int wp, int ncls, int c, int heads, int gh, int gw, int k),                      \
       (hp, wp, ncls, c, heads, gh, gw, k), 0)                                                   \
    FN(ms_status, mita_cuda,                                                                     \
       (ms_backend *be, float *out, const float *qkv, int hp, int wp, int ncls, int c,           \
        int heads, int gh, int gw, int k, bool shared_scale_d, const ms_mita_record *rec,        \
        void *ws),                                                                               \
       (be, out, qkv, hp, wp, ncls, c, heads, gh, gw, k, shared_scale_d, rec, ws),               \
       cuda_unavailable())                                                                       \
    FN(ms_status, adaptive_avgpool_cuda,                                                         \
       (ms_backend *be, float *out, const float *in, int c, int h, int w, int gh, int gw),       \
       (be, out, in, c, h, w, gh, gw), cuda_unavailable())                                       \
    FN(ms_status, maxpool2x2_cuda, (ms_backend *be, float *out, const float *in, int c, int h,   \
                                    int w),                                                      \
       (be, out, in, c, h, w), cuda_unavailable())                                               \
    FN(ms_status, resize_bilinear_cuda,                                                          \
       (ms_backend *be, float *out, const float *in, int c, int h, int w, int ho, int wo,        \
        int y_begin, int y_end, double scale_h, double scale_w),                                 \
       (be, out, in, c, h, w, ho, wo, y_begin, y_end, scale_h, scale_w), cuda_unavailable())     \
    FN(ms_status, resize_bicubic_cuda,                                                           \
       (ms_backend *be, float *out, const float *in, int c, int h, int w, int ho, int wo),       \
       (be, out, in, c, h, w, ho, wo), cuda_unavailable())

/* PROC(name, parameters, arguments, what to do when not loaded) */
#define MS_CUDA_PROCS(PROC)                                                                      \
    PROC(mita_cuda_profile, (float *stage_ms), (stage_ms), (void)0)                              \
    PROC(cuda_query_versions, (ms_cuda_versions *v), (v), versions_unavailable(v))

/* FREE(name, parameters, arguments): frees what the backend made, so does
 * nothing, and loads nothing, when it was never loaded (a CPU run's
 * cuda_ctx_free(NULL)) */
#define MS_CUDA_FREES(FREE)                                                                      \
    FREE(cuda_ctx_free, (ms_cuda_ctx *cu), (cu))                                                 \
    FREE(cuda_arena_free_storage, (uint8_t *p), (p))

static struct {
#define FIELD_FN(ret, name, params, args, fail) ret(*name) params;
#define FIELD_PROC(name, params, args, fail) void(*name) params;
#define FIELD_FREE(name, params, args) void(*name) params;
    MS_CUDA_FUNCS(FIELD_FN)
    MS_CUDA_PROCS(FIELD_PROC)
    MS_CUDA_FREES(FIELD_FREE)
#undef FIELD_FN
#undef FIELD_FREE
#undef FIELD_PROC
} g_cuda;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_bool g_loaded;
static char g_why[512]; /* why it did not load */

static void set_why(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_why, sizeof g_why, fmt, ap);
    va_end(ap);
}

static void cuda_load(void)
{
    char path[PATH_MAX + 32];
    const char *env = getenv("MITASEG_CUDA_LIB");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else {
        /* next to the program when it is there, else the search path */
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        snprintf(path, sizeof path, "%s", MS_CUDA_LIB_NAME);
        if (n > 0) {
            exe[n] = '\0';
            char *slash = strrchr(exe, '/');
            if (slash) {
                slash[1] = '\0';
                char here[PATH_MAX + 32];
                snprintf(here, sizeof here, "%s%s", exe, MS_CUDA_LIB_NAME);
                if (access(here, F_OK) == 0) snprintf(path, sizeof path, "%s", here);
            }
        }
    }
    /* RTLD_NOW: a missing symbol fails here, with a message, not mid-run */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        set_why("cannot load the CUDA backend %s: %s", path, dlerror());
        return;
    }
    void *sym;
#define LOAD(name)                                                                               \
    if (!(sym = dlsym(lib, #name))) {                                                            \
        set_why("the CUDA backend %s lacks %s (another version?)", path, #name);         \
        dlclose(lib);                                                                            \
        return;                                                                                  \
    }                                                                                            \
    memcpy(&g_cuda.name, &sym, sizeof sym); /* object to function pointer (POSIX) */
#define LOAD_FN(ret, name, params, args, fail) LOAD(name)
#define LOAD_PROC(name, params, args, fail) LOAD(name)
#define LOAD_FREE(name, params, args) LOAD(name)
    MS_CUDA_FUNCS(LOAD_FN)
    MS_CUDA_PROCS(LOAD_PROC)
    MS_CUDA_FREES(LOAD_FREE)
#undef LOAD_FN
#undef LOAD_FREE
#undef LOAD_PROC
#undef LOAD
    g_loaded = true;
}

static bool cuda_loaded(void)
{
    pthread_once(&g_once, cuda_load);
    return g_loaded;
}

static ms_status cuda_unavailable(void) { return ms_error(MS_ERR_UNSUPPORTED, "%s", g_why); }

static void versions_unavailable(ms_cuda_versions *v)
{
    memset(v, 0, sizeof *v);
    v->devices = -1;
    snprintf(v->device_error, sizeof v->device_error, "%s", g_why);
}

#define STUB_FN(ret, name, params, args, fail)                                                   \
    ret name params { return cuda_loaded() ? g_cuda.name args : fail; }
#define STUB_PROC(name, params, args, fail)                                                      \
    void name params                                                                             \
    {                                                                                            \
        if (cuda_loaded())                                                                       \
            g_cuda.name args;                                                                    \
        else                                                                                     \
            fail;                                                                                \
    }
MS_CUDA_FUNCS(STUB_FN)
MS_CUDA_PROCS(STUB_PROC)
#define STUB_FREE(name, params, args)                                                            \
    void name params                                                                             \
    {                                                                                            \
        if (atomic_load(&g_loaded)) g_cuda.name args;                                            \
    }
MS_CUDA_FREES(STUB_FREE)
