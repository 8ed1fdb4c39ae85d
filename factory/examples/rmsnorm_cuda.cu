// A customer's RMSNorm, as it might arrive: correct but slow on purpose.
// One block of 256 threads per row; each thread walks the row with a stride, the block sums the
// squares with a plain shared-memory tree (no warp shuffles), then every thread scales its
// elements. bf16 in and out, fp32 compute.
#include <cuda_bf16.h>

extern "C" __global__ void rmsnorm_naive(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                         __nv_bfloat16* y, unsigned int n_cols, float eps) {
    __shared__ float partial[256];
    const unsigned int row = blockIdx.x;
    const __nv_bfloat16* xr = x + (size_t)row * n_cols;
    __nv_bfloat16* yr = y + (size_t)row * n_cols;

    float sum_sq = 0.0f;
    for (unsigned int i = threadIdx.x; i < n_cols; i += blockDim.x) {
        float v = __bfloat162float(xr[i]);
        sum_sq += v * v;
    }
    partial[threadIdx.x] = sum_sq;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    const float inv_rms = rsqrtf(partial[0] / (float)n_cols + eps);

    for (unsigned int i = threadIdx.x; i < n_cols; i += blockDim.x) {
        float v = __bfloat162float(xr[i]) * inv_rms * __bfloat162float(w[i]);
        yr[i] = __float2bfloat16(v);
    }
}
