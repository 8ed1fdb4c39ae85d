// Row kernels fed by Hopper's bulk-copy engine: an experiment beside the generator's row kernels,
// which load each row with 16-byte ld.global per thread. Here a persistent block keeps S rows in
// flight in shared memory: one thread asks the bulk-copy engine for a whole row
// (cp.async.bulk, completion counted in bytes on an mbarrier), every thread reads its part of the
// row from shared memory once the barrier's phase flips, and the stage is refilled with the row
// S steps ahead as soon as the block's reduction barrier shows that every thread has read it.
// Row-constant vectors (RMSNorm's weight) stay in registers for the block's whole life.
//
// Stores: `r` stores the outputs from registers with st.global.v4; `b` writes them back into the
// stage and asks the bulk-copy engine to store the row (cp.async.bulk ... bulk_group), waiting
// for that store to have read the stage before the stage is refilled.
//
// Entry points: bulk_<op>_t<T>k<K>s<S><r|b>, T threads per block, K 16-byte vectors per thread
// (the row is exactly T * K * 8 bf16), S stages. Arguments: RMSNorm (x, w, y, M, N), softmax
// (x, y, M, N); launched with a grid of at most M blocks and S * N * 2 bytes of dynamic shared
// memory. N must equal T * K * 8; the host checks it.
// Compiled with `nvcc -ptx -arch=sm_90 bulkrows.cu -o bulkrows.ptx`.

#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t saddr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void bar_init(uint64_t* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(bar)));
}

__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred done;\n"
        "WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra WAIT_%=;\n}" ::"r"(saddr(bar)),
        "r"(parity)
        : "memory");
}

// One thread: expect `bytes` on the barrier and start the copy of a row into the stage.
__device__ __forceinline__ void row_load(void* stage, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic reads before it
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(bar)),
                 "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(saddr(stage)),
        "l"(src), "r"(bytes), "r"(saddr(bar))
        : "memory");
}

__device__ __forceinline__ void row_store(void* dst, const void* stage, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
                 "r"(saddr(stage)), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

__device__ __forceinline__ void unpack(uint4 v, float f[8]) {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint4 pack(const float f[8]) {
    uint32_t u[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
        u[i] = *reinterpret_cast<uint32_t*>(&h);
    }
    return make_uint4(u[0], u[1], u[2], u[3]);
}

template <int T>
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < T / 32; ++i) s += red[i];
    return s;
}

template <int T>
__device__ __forceinline__ float block_max(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = -INFINITY;
#pragma unroll
    for (int i = 0; i < T / 32; ++i) s = fmaxf(s, red[i]);
    return s;
}

enum { RMS = 0, SOFTMAX = 1 };

template <int OP, int T, int K, int S, bool BULK_STORE>
__device__ __forceinline__ void bulk_rows(const uint4* __restrict__ x, const uint4* __restrict__ w,
                                          uint4* __restrict__ y, int m, int n) {
    extern __shared__ __align__(128) uint4 stages[];
    __shared__ __align__(8) uint64_t full[S];
    __shared__ float red[4][T / 32];  // four: two reductions per row, rows alternate
    const int t = threadIdx.x;
    const int v = n / 8;  // 16-byte vectors per row (= T * K)
    const uint32_t row_bytes = (uint32_t)n * 2u;
    if (t == 0) {
#pragma unroll
        for (int s = 0; s < S; ++s) bar_init(&full[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    float wf[K][8];
    if (OP == RMS) {
#pragma unroll
        for (int k = 0; k < K; ++k) unpack(__ldg(w + k * T + t), wf[k]);
    }
    if (t == 0) {
#pragma unroll
        for (int s = 0; s < S; ++s) {
            long long row = blockIdx.x + (long long)s * gridDim.x;
            if (row < m) row_load(stages + s * v, x + row * v, row_bytes, &full[s]);
        }
    }
    int it = 0;
    for (long long row = blockIdx.x; row < m; row += gridDim.x, ++it) {
        const int s = it % S;
        uint4* stage = stages + s * v;
        bar_wait(&full[s], (uint32_t)(it / S) & 1u);
        float f[K][8];
#pragma unroll
        for (int k = 0; k < K; ++k) unpack(stage[k * T + t], f[k]);
        float* r0 = red[(it & 1) * 2];
        float* r1 = red[(it & 1) * 2 + 1];
        float scale, shift = 0.f;
        if (OP == RMS) {
            float ss = 0.f;
#pragma unroll
            for (int k = 0; k < K; ++k)
#pragma unroll
                for (int i = 0; i < 8; ++i) ss = fmaf(f[k][i], f[k][i], ss);
            ss = block_sum<T>(ss, r0);
            scale = rsqrtf(ss / (float)n + 1e-6f);
        } else {
            float mx = -INFINITY;
#pragma unroll
            for (int k = 0; k < K; ++k)
#pragma unroll
                for (int i = 0; i < 8; ++i) mx = fmaxf(mx, f[k][i]);
            mx = block_max<T>(mx, r0);
            shift = mx * 1.4426950408889634f;
            float se = 0.f;
#pragma unroll
            for (int k = 0; k < K; ++k)
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    f[k][i] = exp2f(fmaf(f[k][i], 1.4426950408889634f, -shift));
                    se += f[k][i];
                }
            scale = 1.f / block_sum<T>(se, r1);
        }
        // Past the first reduction's barrier every thread has read the stage.
        const long long next = row + (long long)S * gridDim.x;
        if (!BULK_STORE && t == 0 && next < m) row_load(stage, x + next * v, row_bytes, &full[s]);
#pragma unroll
        for (int k = 0; k < K; ++k) {
            float o[8];
#pragma unroll
            for (int i = 0; i < 8; ++i)
                o[i] = OP == RMS ? f[k][i] * scale * wf[k][i] : f[k][i] * scale;
            if (BULK_STORE)
                stage[k * T + t] = pack(o);
            else
                y[row * v + k * T + t] = pack(o);
        }
        if (BULK_STORE) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            __syncthreads();
            if (t == 0) {
                row_store(y + row * v, stage, row_bytes);
                if (next < m) {
                    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
                    row_load(stage, x + next * v, row_bytes, &full[s]);
                }
            }
        }
    }
    if (BULK_STORE && t == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

#define RMS_ENTRY(T, K, S, TAG, B)                                                          \
    extern "C" __global__ void __launch_bounds__(T)                                        \
        bulk_rms_t##T##k##K##s##S##TAG(const uint4* x, const uint4* w, uint4* y, int m,    \
                                        int n) {                                           \
        bulk_rows<RMS, T, K, S, B>(x, w, y, m, n);                                          \
    }
#define SOFTMAX_ENTRY(T, K, S, TAG, B)                                                      \
    extern "C" __global__ void __launch_bounds__(T)                                        \
        bulk_softmax_t##T##k##K##s##S##TAG(const uint4* x, uint4* y, int m, int n) {       \
        bulk_rows<SOFTMAX, T, K, S, B>(x, nullptr, y, m, n);                                \
    }
#define BOTH_STORES(E, T, K, S) E(T, K, S, r, false) E(T, K, S, b, true)

BOTH_STORES(RMS_ENTRY, 256, 4, 2)
BOTH_STORES(RMS_ENTRY, 256, 4, 3)
BOTH_STORES(RMS_ENTRY, 256, 4, 4)
BOTH_STORES(RMS_ENTRY, 128, 4, 2)
BOTH_STORES(RMS_ENTRY, 128, 4, 4)
BOTH_STORES(RMS_ENTRY, 256, 2, 2)
BOTH_STORES(RMS_ENTRY, 256, 2, 4)
BOTH_STORES(SOFTMAX_ENTRY, 256, 4, 2)
BOTH_STORES(SOFTMAX_ENTRY, 256, 4, 3)
BOTH_STORES(SOFTMAX_ENTRY, 128, 4, 2)
BOTH_STORES(SOFTMAX_ENTRY, 128, 4, 4)

// The same persistent block without the bulk-copy engine: each thread loads its part of the row
// straight into registers (16-byte ld.global.nc), RMSNorm's weight held in registers, packed,
// for the block's life instead of re-read from L2 for every row. S = 1: one row at a time;
// S = 2: the block's next row is loaded into a second register buffer before this row is
// reduced and stored. Hint e: the rows' loads carry the L2 evict-last policy (as the
// generator's `el` loads), n: none. Entry points regrms_t<T>k<K>s<S><e|n>, registers capped for
// 1024 resident threads per SM (768 with the second buffer); no shared memory beyond the
// reduction's slots.
template <bool EL>
__device__ __forceinline__ uint4 row_ld(const uint4* p, uint64_t policy) {
    uint4 v;
    if (EL)
        asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p), "l"(policy));
    else
        v = __ldg(p);
    return v;
}

template <int T, int K, int S, bool EL>
__device__ __forceinline__ void reg_rms(const uint4* __restrict__ x, const uint4* __restrict__ w,
                                        uint4* __restrict__ y, int m, int n) {
    __shared__ float red[2][T / 32];
    const int t = threadIdx.x;
    const int v = n / 8;
    uint64_t policy = 0;
    if (EL) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    uint4 wr[K];
#pragma unroll
    for (int k = 0; k < K; ++k) wr[k] = __ldg(w + k * T + t);
    uint4 cur[K], nxt[K];
    long long row = blockIdx.x;
    if (S == 2 && row < m) {
#pragma unroll
        for (int k = 0; k < K; ++k) cur[k] = row_ld<EL>(x + row * v + k * T + t, policy);
    }
    for (int it = 0; row < m; row += gridDim.x, ++it) {
        const long long next = row + gridDim.x;
        if (S == 1) {  // this row's loads at the top: nothing stays live across the back edge
#pragma unroll
            for (int k = 0; k < K; ++k) cur[k] = row_ld<EL>(x + row * v + k * T + t, policy);
        } else if (next < m) {
#pragma unroll
            for (int k = 0; k < K; ++k) nxt[k] = row_ld<EL>(x + next * v + k * T + t, policy);
        }
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < K; ++k) {
            float f[8];
            unpack(cur[k], f);
#pragma unroll
            for (int i = 0; i < 8; ++i) ss = fmaf(f[i], f[i], ss);
        }
        const float scale = rsqrtf(block_sum<T>(ss, red[it & 1]) / (float)n + 1e-6f);
#pragma unroll
        for (int k = 0; k < K; ++k) {
            float f[8], wf[8], o[8];
            unpack(cur[k], f);  // unpacked again: the row stays packed across the reduction
            unpack(wr[k], wf);
#pragma unroll
            for (int i = 0; i < 8; ++i) o[i] = f[i] * scale * wf[i];
            y[row * v + k * T + t] = pack(o);
        }
        if (S == 2 && next < m) {
#pragma unroll
            for (int k = 0; k < K; ++k) cur[k] = nxt[k];
        }
    }
}

#define REGRMS_ENTRY(T, K, S, TAG, EL)                                                      \
    extern "C" __global__ void __launch_bounds__(T, (S == 1 ? 768 : 512) / T)              \
        bulk_regrms_t##T##k##K##s##S##TAG(const uint4* x, const uint4* w, uint4* y, int m,  \
                                           int n) {                                        \
        reg_rms<T, K, S, EL>(x, w, y, m, n);                                                \
    }
#define BOTH_HINTS(T, K, S) REGRMS_ENTRY(T, K, S, e, true) REGRMS_ENTRY(T, K, S, n, false)

BOTH_HINTS(256, 4, 1)
BOTH_HINTS(256, 4, 2)
BOTH_HINTS(128, 4, 1)
BOTH_HINTS(128, 4, 2)
