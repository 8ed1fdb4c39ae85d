// One step of a byte mover (judge_mix in judge.cu, the tiled layouts in bench/kernels/mover.cu):
// up to four inputs of na..nd 16-byte vectors are each read once and up to two outputs of ny, nz
// vectors each written once (an unused buffer has a count of 0). The step takes V vectors
// first, first + step, ..., issues all of their loads before it uses any (the memory-level
// parallelism a row kernel has with its chunks in flight), and stores a vector that depends on
// every load, so the compiler keeps them all.
#pragma once

__device__ __forceinline__ uint4 load_below(const uint4* p, long long np, long long i) {
    return i < np ? p[i] : make_uint4(0u, 0u, 0u, 0u);
}

__device__ __forceinline__ uint4 xor4(uint4 p, uint4 q) {
    return make_uint4(p.x ^ q.x, p.y ^ q.y, p.z ^ q.z, p.w ^ q.w);
}

template <int V>
__device__ __forceinline__ void mix_step(const uint4* a, long long na, const uint4* b,
                                         long long nb, const uint4* c, long long nc,
                                         const uint4* d, long long nd, uint4* y, long long ny,
                                         uint4* z, long long nz, long long first,
                                         long long step) {
    uint4 ta[V], tb[V], tc[V], td[V];
#pragma unroll
    for (int u = 0; u < V; ++u) {
        long long j = first + u * step;
        ta[u] = load_below(a, na, j);
        tb[u] = load_below(b, nb, j);
        tc[u] = load_below(c, nc, j);
        td[u] = load_below(d, nd, j);
    }
#pragma unroll
    for (int u = 0; u < V; ++u) {
        long long j = first + u * step;
        uint4 v = xor4(xor4(ta[u], tb[u]), xor4(tc[u], td[u]));
        v.x ^= (unsigned int)j;
        if (j < ny) y[j] = v;
        if (j < nz) z[j] = v;
    }
}
