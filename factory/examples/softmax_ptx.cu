// Source of softmax_ptx.ptx (the customer uploads only the PTX). Regenerate with:
//   nvcc -ptx -arch=sm_90 -o softmax_ptx.ptx softmax_ptx.cu
// A naive row softmax: one block of 128 threads per row, three passes over the row (max, sum of
// exponentials, write), shared-memory tree reductions, accurate expf. Correct, deliberately slow.
#include <cuda_bf16.h>

__device__ float block_reduce(float* buf, float v, bool is_max) {
    buf[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float o = buf[threadIdx.x + s];
            buf[threadIdx.x] = is_max ? fmaxf(buf[threadIdx.x], o) : buf[threadIdx.x] + o;
        }
        __syncthreads();
    }
    float r = buf[0];
    __syncthreads();
    return r;
}

extern "C" __global__ void softmax_naive(const __nv_bfloat16* x, __nv_bfloat16* y,
                                         unsigned int n_cols) {
    __shared__ float buf[128];
    const __nv_bfloat16* xr = x + (size_t)blockIdx.x * n_cols;
    __nv_bfloat16* yr = y + (size_t)blockIdx.x * n_cols;

    float m = -INFINITY;
    for (unsigned int i = threadIdx.x; i < n_cols; i += blockDim.x)
        m = fmaxf(m, __bfloat162float(xr[i]));
    m = block_reduce(buf, m, true);

    float s = 0.0f;
    for (unsigned int i = threadIdx.x; i < n_cols; i += blockDim.x)
        s += expf(__bfloat162float(xr[i]) - m);
    s = block_reduce(buf, s, false);

    for (unsigned int i = threadIdx.x; i < n_cols; i += blockDim.x)
        yr[i] = __float2bfloat16(expf(__bfloat162float(xr[i]) - m) / s);
}
