// Byte movers in other layouts than the worker's judge_mix (gpuworker/kernels/judge.cu: one
// 16-byte vector per thread, one tile of 256 vectors per block), kept so that the comparison
// that chose judge_mix's layout can be run again (bench/results/2026-12-03-h200-mover/). Same
// arguments as judge_mix: up to four inputs and two outputs as (pointer, count of 16-byte
// vectors), unused ones null with a count of 0, then n, the largest count.
// - mover_tiled_v2, _v4: block b moves vectors [b * 256 * V, (b + 1) * 256 * V); thread t takes
//   b * 256 * V + u * 256 + t for u < V (each u a coalesced 4 KB), all loads before any store.
//   Launched with ceil(n / (256 * V)) blocks of 256 threads.
// - mover_gridstride_u4: judge_mix's first layout, a grid-stride loop of four vectors a grid
//   apart per step, launched as one wave of four resident 256-thread blocks per SM.
// Compiled with `nvcc -ptx -arch=sm_90 mover.cu -o mover.ptx`.

#include "../../gpuworker/kernels/mix.cuh"

#define MOVER(V)                                                                                \
    extern "C" __global__ void mover_tiled_v##V(                                                \
        const uint4* a, long long na, const uint4* b, long long nb, const uint4* c,             \
        long long nc, const uint4* d, long long nd, uint4* y, long long ny, uint4* z,           \
        long long nz, long long n) {                                                            \
        mix_step<V>(a, na, b, nb, c, nc, d, nd, y, ny, z, nz,                                   \
                    (long long)blockIdx.x * blockDim.x * V + threadIdx.x, blockDim.x);          \
    }

MOVER(2)
MOVER(4)

extern "C" __global__ void mover_gridstride_u4(const uint4* a, long long na, const uint4* b,
                                               long long nb, const uint4* c, long long nc,
                                               const uint4* d, long long nd, uint4* y,
                                               long long ny, uint4* z, long long nz, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 4 * stride)
        mix_step<4>(a, na, b, nb, c, nc, d, nd, y, ny, z, nz, i, stride);
}
