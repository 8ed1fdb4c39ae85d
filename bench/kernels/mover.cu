// Byte movers laid out one tile per block, to compare with the worker's judge_mix (a grid-stride
// loop in one wave of resident blocks), which moves RMSNorm's and SiLU-mul's bytes at only
// 93-98% of the copy ceiling on the H200 while the row kernels reach 100-104%
// (bench/results/2026-12-03-h200-mover/). Same arguments as judge_mix: up to four inputs and
// two outputs as (pointer, count of 16-byte vectors), unused ones null with a count of 0, then
// n, the largest count. Block b moves vectors [b * 256 * V, (b + 1) * 256 * V): thread t takes
// b * 256 * V + u * 256 + t for u < V (each u a coalesced 4 KB), all loads before any store.
// Launched with ceil(n / (256 * V)) blocks of 256 threads, as many as there are tiles.
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

MOVER(1)
MOVER(2)
MOVER(4)
