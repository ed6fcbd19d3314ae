/* The CUDA execution layer's scheduler and runtime (see cuda_emu.h). */
/* _longjmp between fiber stacks: the fortified longjmp would refuse it */
#undef _FORTIFY_SOURCE
#include "cuda_emu.h"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <string>
#include <vector>

/* Bounds of the __shared__ statics (the linker defines them for a section
 * named like an identifier; weak: no kernel with static shared memory). */
extern "C" char __start_ms_emu_shared[] __attribute__((weak));
extern "C" char __stop_ms_emu_shared[] __attribute__((weak));

/* AddressSanitizer is told about each stack switch (fiber annotations). */
#if defined(__SANITIZE_ADDRESS__)
#define MS_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MS_EMU_ASAN 1
#endif
#endif
#ifdef MS_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace ms_emu {

enum thread_st { ST_READY, ST_BARRIER, ST_WARP, ST_DONE };

/* One fiber per thread index, kept across blocks and launches: it runs the
 * kernel body once per block (fiber_main). */
struct thread_state {
    jmp_buf jb;   /* where it waits */
    bool started; /* false: (re)start it from fiber_main */
    void *fake;   /* AddressSanitizer's fake stack */
    dim3 idx;
    int lin, lane, warp;
    thread_st st;
    const char *file; /* where it waits */
    int line;
    char kind; /* warp collective */
    unsigned mask;
    uint64_t value, result;
    int param, width;
};

/* Enough for the kernels' per-thread arrays (2 KB at d = 256) under
 * AddressSanitizer too; pages are only touched as used. */
static const size_t STACK_BYTES = 512 * 1024;

static const int MAX_THREADS = 1024;
static thread_state g_threads[MAX_THREADS];
static int g_nt; /* threads of the current block */
static char *g_stacks[MAX_THREADS];
static jmp_buf g_sched_jb;
static void *g_sched_fake;
static const void *g_sched_bottom; /* the scheduler's stack (for ASan) */
static size_t g_sched_size;
static thread_state *g_cur;
const dim3 *g_thread_idx;
dim3 g_block_idx, g_block_dim, g_grid_dim;
static void (*g_fn)(void *);
static void *g_arg;
static void *g_dyn;
static const char *g_kernel = "";
static bool g_failing;
static std::string g_failure; /* the last launch failure */
static cudaError_t g_last_error = cudaSuccess;
static uint64_t g_seed, g_rng;
static bool g_seeded;
static size_t g_optin = 232448; /* 227 KB: H100/H200 */
static std::map<const void *, int> g_max_dyn;

/* ---- random orders ---- */

static void ensure_seed()
{
    if (g_seeded) return;
    const char *e = getenv("MS_EMU_SEED");
    g_seed = e && *e ? strtoull(e, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    g_rng = g_seed;
    g_seeded = true;
}

uint64_t seed()
{
    ensure_seed();
    return g_seed;
}

void set_seed(uint64_t s)
{
    g_seed = g_rng = s;
    g_seeded = true;
}

static uint64_t next_rand() /* splitmix64 */
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

template <class T>
static void shuffle(std::vector<T> &v)
{
    for (size_t i = v.size(); i > 1; i--) std::swap(v[i - 1], v[next_rand() % i]);
}

/* ---- failures ---- */

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void to_scheduler() __attribute__((noreturn));

/* Records the first failure of the launch; from a fiber, never returns (the
 * scheduler abandons the block). */
static void fail(const char *fmt, ...)
{
    if (!g_failing) {
        char msg[768];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        char full[1200];
        snprintf(full, sizeof full, "cuda_emu: kernel %s, block (%u,%u,%u): %s [MS_EMU_SEED=%llu]",
                 g_kernel, g_block_idx.x, g_block_idx.y, g_block_idx.z, msg,
                 (unsigned long long)g_seed);
        fprintf(stderr, "%s\n", full);
        g_failure = full;
        g_failing = true;
    }
    if (g_cur) to_scheduler();
}

const char *last_failure() { return g_failure.c_str(); }

static std::vector<launch_record> g_launches;
const std::vector<launch_record> &launches() { return g_launches; }
void clear_launches() { g_launches.clear(); }

void set_smem_optin(size_t bytes) { g_optin = bytes; }

/* ---- fibers ----
 * A fiber starts once (makecontext + swapcontext on its own stack) and then
 * loops over blocks; switches are _setjmp/_longjmp (no system call, unlike
 * swapcontext's signal mask), announced to AddressSanitizer. */

static void asan_start(void **fake, const void *bottom, size_t size)
{
#ifdef MS_EMU_ASAN
    __sanitizer_start_switch_fiber(fake, bottom, size);
#endif
}

static void asan_finish(void *fake, const void **bottom, size_t *size)
{
#ifdef MS_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, bottom, size);
#endif
}

/* The current fiber waits; the scheduler runs. */
static void yield()
{
    thread_state *t = g_cur;
    if (!_setjmp(t->jb)) {
        asan_start(&t->fake, g_sched_bottom, g_sched_size);
        _longjmp(g_sched_jb, 1);
    }
    asan_finish(t->fake, NULL, NULL);
}

/* A failure: the current fiber is abandoned (restarted when next needed). */
static void to_scheduler()
{
    g_cur->started = false;
    asan_start(NULL, g_sched_bottom, g_sched_size);
    _longjmp(g_sched_jb, 1);
}

static void fiber_main()
{
    asan_finish(NULL, &g_sched_bottom, &g_sched_size);
    for (;;) {
        g_fn(g_arg);
        g_cur->st = ST_DONE;
        yield(); /* resumed for the next block */
    }
}

/* Runs thread i until it waits or ends its block. */
static void switch_to(int i)
{
    thread_state *t = &g_threads[i];
    if (!_setjmp(g_sched_jb)) {
        asan_start(&g_sched_fake, g_stacks[i], STACK_BYTES);
        if (!t->started) {
            static ucontext_t from, to;
            t->started = true;
            getcontext(&to);
            to.uc_stack.ss_sp = g_stacks[i];
            to.uc_stack.ss_size = STACK_BYTES;
            to.uc_link = NULL; /* fiber_main never returns */
            makecontext(&to, fiber_main, 0);
            swapcontext(&from, &to); /* comes back through g_sched_jb */
        }
        _longjmp(t->jb, 1);
    }
    asan_finish(g_sched_fake, NULL, NULL);
}

void *dyn_shared() { return g_dyn; }

void syncthreads(const char *file, int line)
{
    g_cur->st = ST_BARRIER;
    g_cur->file = file;
    g_cur->line = line;
    yield();
}

static const char *kind_name(char k)
{
    switch (k) {
    case 'b': return "__ballot_sync";
    case 'a': return "__any_sync";
    case 'l': return "__all_sync";
    case 'd': return "__shfl_down_sync";
    case 'u': return "__shfl_up_sync";
    case 'x': return "__shfl_xor_sync";
    case 's': return "__syncwarp";
    default: return "__shfl_sync";
    }
}

static int warp_lanes(int warp) /* lanes that exist in this warp */
{
    int n = (int)(size_t)g_nt - warp * 32;
    return n < 32 ? n : 32;
}

uint64_t warp_op(char kind, unsigned mask, uint64_t value, int param, int width, const char *file,
                 int line)
{
    thread_state *t = g_cur;
    int nl = warp_lanes(t->warp);
    unsigned exist = nl == 32 ? 0xFFFFFFFFu : (1u << nl) - 1u;
    if (!(mask >> t->lane & 1u))
        fail("thread %d (lane %d of warp %d) calls %s at %s:%d with mask %08x, which leaves it out",
             t->lin, t->lane, t->warp, kind_name(kind), file, line, mask);
    if (mask & ~exist)
        fail("%s at %s:%d: mask %08x names lanes that do not exist (warp %d has %d)",
             kind_name(kind), file, line, mask, t->warp, nl);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("%s at %s:%d: width %d", kind_name(kind), file, line, width);
    t->st = ST_WARP;
    t->kind = kind;
    t->mask = mask;
    t->value = value;
    t->param = param;
    t->width = width;
    t->file = file;
    t->line = line;
    yield();
    return t->result;
}

/* Source lane of a shuffle, or -1 for "own value". */
static int shfl_src(const thread_state &t)
{
    int w = t.width, lane = t.lane, seg = lane / w * w;
    switch (t.kind) {
    case 'd': return lane % w + t.param < w ? lane + t.param : -1;
    case 'u': return lane % w >= t.param ? lane - t.param : -1;
    case 'x': {
        int s = lane ^ t.param;
        return s / w > lane / w || s > 31 ? -1 : s;
    }
    default: return seg + ((t.param % w) + w) % w;
    }
}

/* A lane arrived at a warp collective: complete it when every lane of its
 * mask is there; fail when one never can be. Returns whether it completed
 * (its lanes are then ready). */
static bool warp_try_complete(int i, std::vector<int> &ready)
{
    const thread_state &t = g_threads[(size_t)i];
    const int base = t.warp * 32;
    for (int l = 0; l < 32; l++) {
        if (!(t.mask >> l & 1u)) continue;
        const thread_state &o = g_threads[(size_t)base + l];
        switch (o.st) {
        case ST_READY: return false; /* not there yet */
        case ST_DONE:
            fail("%s at %s:%d (mask %08x, warp %d): lane %d has exited without arriving",
                 kind_name(t.kind), t.file, t.line, t.mask, t.warp, l);
            return false;
        case ST_BARRIER:
            fail("%s at %s:%d (mask %08x, warp %d): lane %d waits at __syncthreads %s:%d instead",
                 kind_name(t.kind), t.file, t.line, t.mask, t.warp, l, o.file, o.line);
            return false;
        case ST_WARP:
            if (o.kind != t.kind || o.file != t.file || o.line != t.line || o.mask != t.mask) {
                fail("warp %d: lane %d is at %s %s:%d mask %08x, lane %d at %s %s:%d mask %08x",
                     t.warp, t.lane, kind_name(t.kind), t.file, t.line, t.mask, l,
                     kind_name(o.kind), o.file, o.line, o.mask);
                return false;
            }
        }
    }
    unsigned ballot = 0;
    for (int l = 0; l < 32; l++)
        if ((t.mask >> l & 1u) && g_threads[(size_t)base + l].value) ballot |= 1u << l;
    for (int l = 0; l < 32; l++) {
        if (!(t.mask >> l & 1u)) continue;
        thread_state &o = g_threads[(size_t)base + l];
        switch (o.kind) {
        case 'b': o.result = ballot; break;
        case 'a': o.result = ballot != 0; break;
        case 'l': o.result = ballot == t.mask; break;
        case 's': o.result = 0; break;
        default: {
            int s = shfl_src(o);
            if (s >= 0 && !(t.mask >> s & 1u)) {
                fail("%s at %s:%d (mask %08x, warp %d): lane %d reads lane %d, not in the mask",
                     kind_name(o.kind), o.file, o.line, o.mask, o.warp, l, s);
                return false;
            }
            o.result = s < 0 ? o.value : g_threads[(size_t)base + s].value;
        }
        }
        o.st = ST_READY;
        ready.push_back(base + l);
    }
    return true;
}

/* Nothing can run and some lanes wait at a warp collective: say why (a lane
 * of the mask exited, waits at a barrier or at another collective). */
static void describe_stuck()
{
    std::vector<int> none;
    for (int i = 0; i < g_nt && !g_failing; i++)
        if (g_threads[i].st == ST_WARP) warp_try_complete(i, none);
    if (!g_failing) fail("deadlock");
}

static void run_block()
{
    const int nt = g_nt;
    std::vector<int> ready;
    for (int i = 0; i < nt; i++) {
        thread_state &t = g_threads[(size_t)i];
        t.idx = dim3((unsigned)i % g_block_dim.x, (unsigned)i / g_block_dim.x % g_block_dim.y,
                     (unsigned)i / (g_block_dim.x * g_block_dim.y));
        t.lin = i;
        t.lane = i % 32;
        t.warp = i / 32;
        t.st = ST_READY;
        t.file = "";
        t.line = 0;
        ready.push_back(i);
    }
    shuffle(ready);
    while (!g_failing) {
        if (ready.empty()) {
            int done = 0, bar = -1;
            bool stuck = false;
            for (int i = 0; i < nt; i++) {
                const thread_state &t = g_threads[(size_t)i];
                if (t.st == ST_DONE) done++;
                else if (t.st == ST_WARP) stuck = true;
                else if (bar < 0) bar = i;
            }
            if (done == nt) return;
            if (stuck) {
                describe_stuck();
                return;
            }
            const thread_state &b = g_threads[(size_t)bar];
            if (done > 0) {
                fail("__syncthreads at %s:%d waits for %d threads that have exited", b.file,
                     b.line, done);
                return;
            }
            for (int i = 0; i < nt; i++) {
                thread_state &t = g_threads[(size_t)i];
                if (t.file != b.file || t.line != b.line) {
                    fail("threads %d and %d wait at different barriers: __syncthreads %s:%d and "
                         "%s:%d",
                         bar, i, b.file, b.line, t.file, t.line);
                    return;
                }
            }
            for (int i = 0; i < nt; i++) {
                g_threads[(size_t)i].st = ST_READY;
                ready.push_back(i);
            }
            shuffle(ready);
            continue;
        }
        int i = ready.back();
        ready.pop_back();
        g_cur = &g_threads[(size_t)i];
        g_thread_idx = &g_cur->idx;
        switch_to(i);
        g_cur = NULL;
        if (g_failing) return;
        if (g_threads[(size_t)i].st == ST_WARP && warp_try_complete(i, ready)) shuffle(ready);
    }
}

static cudaError_t config_error(cudaError_t e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static cudaError_t config_error(cudaError_t e, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g_failure = std::string("cuda_emu: kernel ") + g_kernel + ": " + msg;
    fprintf(stderr, "%s\n", g_failure.c_str());
    return e;
}

void launch(const char *name, const void *key, dim3 grid, dim3 block, size_t smem,
            void (*fn)(void *), void *arg)
{
    ensure_seed();
    g_kernel = name;
    g_failure.clear();
    g_launches.push_back(launch_record{name, grid, block, smem});
    const unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
    const unsigned long long nb = (unsigned long long)grid.x * grid.y * grid.z;
    cudaError_t e = cudaSuccess;
    if (nt < 1 || nt > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
        e = config_error(cudaErrorInvalidConfiguration, "block (%u,%u,%u)", block.x, block.y,
                         block.z);
    else if (nb < 1 || grid.x > 0x7FFFFFFFu || grid.y > 65535 || grid.z > 65535)
        e = config_error(cudaErrorInvalidConfiguration, "grid (%u,%u,%u)", grid.x, grid.y, grid.z);
    else {
        auto it = g_max_dyn.find(key);
        size_t lim = it == g_max_dyn.end() ? 48 * 1024 : (size_t)it->second;
        if (smem > lim)
            e = config_error(cudaErrorInvalidValue,
                             "%zu bytes of dynamic shared memory, the limit is %zu (raise it "
                             "with cudaFuncSetAttribute)",
                             smem, lim);
    }
    if (e != cudaSuccess) {
        g_last_error = e;
        return;
    }
    for (unsigned long long i = 0; i < nt; i++) {
        if (g_stacks[i]) continue;
        void *p = mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            fprintf(stderr, "cuda_emu: mmap of a fiber stack failed\n");
            abort();
        }
        mprotect(p, (size_t)sysconf(_SC_PAGESIZE), PROT_NONE); /* overflow guard */
        g_stacks[i] = (char *)p;
    }
    g_nt = (int)nt;
    g_block_dim = block;
    g_grid_dim = grid;
    g_fn = fn;
    g_arg = arg;
    g_failing = false;
    /* exactly the requested size: AddressSanitizer sees an overrun */
    g_dyn = malloc(smem ? smem : 1);
    std::vector<unsigned long long> order(nb);
    for (unsigned long long b = 0; b < nb; b++) order[b] = b;
    shuffle(order);
    for (unsigned long long b : order) {
        g_block_idx = dim3((unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
                           (unsigned)(b / ((unsigned long long)grid.x * grid.y)));
        if (__start_ms_emu_shared)
            memset(__start_ms_emu_shared, 0xFF,
                   (size_t)(__stop_ms_emu_shared - __start_ms_emu_shared));
        memset(g_dyn, 0xFF, smem);
        run_block();
        if (g_failing) break;
    }
    free(g_dyn);
    g_dyn = NULL;
    if (g_failing) {
        g_last_error = cudaErrorLaunchFailure;
        /* the block's fibers stopped inside the kernel: start them afresh */
        for (int i = 0; i < g_nt; i++) g_threads[i].started = false;
    }
}

} // namespace ms_emu

using namespace ms_emu;

/* ---- runtime ---- */

cudaError_t cudaGetLastError()
{
    cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    default: return "cudaErrorLaunchFailure";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    if (e == cudaSuccess) return "no error";
    if (e == cudaErrorMemoryAllocation) return "out of memory";
    return g_failure.empty() ? "error" : g_failure.c_str();
}

cudaError_t cudaDriverGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev)
{
    if (dev != 0) return cudaErrorInvalidValue;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CUDA emulation on the CPU");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 4;
    p->sharedMemPerBlockOptin = g_optin;
    p->totalGlobalMem = (size_t)1 << 32;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : cudaErrorInvalidValue; }

static char g_stream_obj;
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned)
{
    *s = (cudaStream_t)&g_stream_obj;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    *free_b = *total_b = (size_t)1 << 32;
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t)
{
    memset(p, v, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t)
{
    memcpy(dst, src, bytes);
    return cudaSuccess;
}

static char g_event_obj;
cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = (cudaEvent_t)&g_event_obj;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t)
{
    *ms = 0.0f;
    return cudaSuccess;
}

cudaError_t ms_emu_func_set_attribute(const void *fn, cudaFuncAttribute a, int v)
{
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || (size_t)v > g_optin)
        return cudaErrorInvalidValue;
    g_max_dyn[fn] = v;
    return cudaSuccess;
}

/* ---- cuBLAS ---- */

static char g_blas_obj;
cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = (cublasHandle_t)&g_blas_obj;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(other)";
    }
}

/* The emulation calls itself cuBLAS 13.0.0 and cuDNN 9.0.0. */
cublasStatus_t cublasGetProperty(libraryPropertyType t, int *v)
{
    *v = t == MAJOR_VERSION ? 13 : 0;
    return CUBLAS_STATUS_SUCCESS;
}

size_t cudnnGetVersion() { return CUDNN_VERSION; }

static float bf16_round(float x) /* round to nearest even, as the tensor cores' inputs */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return x;
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&x, &u, 4);
    return x;
}

static float load(const void *p, cudaDataType_t t, long long i, bool round16)
{
    if (t == CUDA_R_16BF) {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float x;
        memcpy(&x, &u, 4);
        return x;
    }
    float x = ((const float *)p)[i];
    return round16 ? bf16_round(x) : x;
}

/* Column-major C = alpha op(A) op(B) + beta C per batch entry, as cuBLAS
 * (beta = 0: C is not read). Sums in k order, in FP32. */
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *a, cudaDataType_t at,
                                          int lda, long long sa, const void *b, cudaDataType_t bt,
                                          int ldb, long long sb, const void *beta, void *c,
                                          cudaDataType_t ct, int ldc, long long sc, int batch,
                                          cublasComputeType_t comp, cublasGemmAlgo_t)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < (ta == CUBLAS_OP_N ? m : k) || lda < 1 || ldb < (tb == CUBLAS_OP_N ? k : n) ||
        ldb < 1 || ldc < m || ldc < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (ct != CUDA_R_32F || (comp != CUBLAS_COMPUTE_32F && comp != CUBLAS_COMPUTE_32F_FAST_16BF))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (comp == CUBLAS_COMPUTE_32F_FAST_16BF && (at != CUDA_R_32F || bt != CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool r16 = comp == CUBLAS_COMPUTE_32F_FAST_16BF;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    for (int q = 0; q < batch; q++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0.0f;
                for (int p = 0; p < k; p++) {
                    long long ia =
                        ta == CUBLAS_OP_N ? i + (long long)p * lda : p + (long long)i * lda;
                    long long ib =
                        tb == CUBLAS_OP_N ? p + (long long)j * ldb : j + (long long)p * ldb;
                    acc += load(a, at, q * sa + ia, r16) * load(b, bt, q * sb + ib, r16);
                }
                float *cp = (float *)c + q * sc + i + (long long)j * ldc;
                *cp = be == 0.0f ? al * acc : al * acc + be * *cp;
            }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *a, cudaDataType_t at,
                            int lda, const void *b, cudaDataType_t bt, int ldb, const void *beta,
                            void *c, cudaDataType_t ct, int ldc, cublasComputeType_t comp,
                            cublasGemmAlgo_t algo)
{
    return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, a, at, lda, 0, b, bt, ldb, 0,
                                      beta, c, ct, ldc, 0, 1, comp, algo);
}

/* ---- cuBLASLt ---- */

static char g_lt_obj;
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = (cublasLtHandle_t)&g_lt_obj;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t,
                                        cudaDataType_t)
{
    *d = (cublasLtMatmulDesc_t)&g_lt_obj;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t,
                                              const void *, size_t)
{
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t, uint64_t,
                                          uint64_t, int64_t)
{
    *l = (cublasLtMatrixLayout_t)&g_lt_obj;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = (cublasLtMatmulPreference_t)&g_lt_obj;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t)
{
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t,
                                                    const void *, size_t)
{
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int,
                                              cublasLtMatmulHeuristicResult_t *, int *got)
{
    *got = 0; /* no fused algorithm: the caller falls back to cublasGemmEx */
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,
                              cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t,
                              const void *, const void *, cublasLtMatrixLayout_t, void *,
                              cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t,
                              cudaStream_t)
{
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

/* ---- cuDNN ---- */

static char g_dnn_obj;
cudnnStatus_t cudnnCreate(cudnnHandle_t *h)
{
    *h = (cudnnHandle_t)&g_dnn_obj;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnSetStream(cudnnHandle_t, cudaStream_t) { return CUDNN_STATUS_SUCCESS; }
const char *cudnnGetErrorString(cudnnStatus_t s)
{
    return s == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS"
                                     : "CUDNN_STATUS_NOT_SUPPORTED (not emulated)";
}
