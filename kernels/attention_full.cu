/* Full attention on the GPU, flash-style: one block per (128-query chunk,
 * head); key/value tiles are staged in shared memory and every thread runs
 * its query's online softmax over them (osm_query_keys, the same per-query
 * code as MiTA's routed kernel, in kernels/mita_cuda_math.h). The (n, n)
 * scores never exist. FP32 CUDA cores in both backend modes (a comparison
 * baseline; a tensor-core version would be ~10x faster at large n). */
#include "attention_full.h"
#include "cuda_check.h"
#include "mita_cuda_math.h"

#define FLASH_QB 128
#define FLASH_KT 64

template <int DT>
__global__ void __launch_bounds__(FLASH_QB)
    flash_kernel(float *out /* (n, c) */, const float *qkv /* (n, 3c) */, int n, int c, int d_rt,
                 int kt, float s)
{
    const int d = DT > 0 ? DT : d_rt;
    MS_SHARED_DYN(float, smem);
    float *ks = smem, *vs = smem + (size_t)kt * d;
    const int h = blockIdx.y, tid = threadIdx.x;
    const int qi = blockIdx.x * FLASH_QB + tid;
    const size_t c3 = 3 * (size_t)c;
    float q[DT > 0 ? DT : MS_MITA_DMAX], acc[DT > 0 ? DT : MS_MITA_DMAX];
    float mx, l;
    osm_init(&mx, &l, acc, d);
    if (qi < n) {
        const float *qr = qkv + (size_t)qi * c3 + (size_t)h * d;
        MS_UNROLL
        for (int i = 0; i < d; i++) q[i] = qr[i];
    }
    for (int k0 = 0; k0 < n; k0 += kt) {
        int nt = min(kt, n - k0);
        __syncthreads();
        for (int i = tid; i < nt * d; i += FLASH_QB) {
            int j = i / d, ch = i - j * d;
            const float *row = qkv + (size_t)(k0 + j) * c3 + (size_t)h * d + ch;
            ks[i] = row[c];
            vs[i] = row[2 * (size_t)c];
        }
        __syncthreads();
        if (qi < n) osm_query_keys(&mx, &l, acc, q, ks, vs, nt, d, s);
    }
    if (qi < n) osm_finish(out + (size_t)qi * c + (size_t)h * d, NULL, mx, l, mx, 0.0f, acc, d);
}

extern "C" size_t attention_full_cuda_scratch_bytes(int n, int c, int heads) { return 0; }

template <int DT>
static ms_status launch_flash(ms_cuda_ctx *cu, float *out, const float *qkv, int n, int c,
                              int heads, int d, int kt, size_t smem)
{
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(flash_kernel<DT>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)((n + FLASH_QB - 1) / FLASH_QB), (unsigned)heads);
    MS_LAUNCH(flash_kernel<DT>, grid, FLASH_QB, smem, cu->stream)(out, qkv, n, c, d, kt,
        mita_scale(d));
    CUDA_CHECK_LAUNCH("flash_kernel");
    return MS_OK;
}

extern "C" ms_status attention_full_cuda(ms_backend *be, float *out, const float *qkv, int n,
                                         int c, int heads, void *ws)
{
    ms_cuda_ctx *cu = cuda_ctx_of(be);
    if (n <= 0) return MS_OK;
    const int d = heads > 0 ? c / heads : 0;
    if (heads <= 0 || d * heads != c)
        return ms_error(MS_ERR_ARG, "attention_full_cuda: c=%d not divisible by heads=%d", c,
                        heads);
    if (d > MS_MITA_DMAX)
        return ms_error(MS_ERR_UNSUPPORTED, "attention_full_cuda: head dim %d > %d", d,
                        MS_MITA_DMAX);
    if (heads > 65535 || (size_t)n * 3 * c > (size_t)INT32_MAX * 4)
        return ms_error(MS_ERR_UNSUPPORTED, "attention_full_cuda: sizes too large");
    int kt = n < FLASH_KT ? n : FLASH_KT;
    size_t smem = 2 * (size_t)kt * d * sizeof(float);
    if (d == 32) return launch_flash<32>(cu, out, qkv, n, c, heads, d, kt, smem);
    if (d == 64) return launch_flash<64>(cu, out, qkv, n, c, heads, d, kt, smem);
    if (d == 128) return launch_flash<128>(cu, out, qkv, n, c, heads, d, kt, smem);
    return launch_flash<0>(cu, out, qkv, n, c, heads, d, kt, smem);
}
