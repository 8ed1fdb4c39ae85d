// The judge's own kernels: compare a candidate's output with the float64 reference, count bytes
// that differ (run-twice races, mutated inputs) and bytes that left a fill pattern (guards).
// Compiled once with `nvcc -ptx -arch=sm_90 judge.cu -o judge.ptx` and shipped as PTX, so the
// worker needs no NVRTC at run time. These run after the candidate's launch has completed.

// dtype codes: 0 fp32, 1 bf16, 2 fp16, 3 int32, 4 int64
__device__ __forceinline__ double load_as_double(const void* p, long long i, int dtype) {
    if (dtype == 0) return (double)((const float*)p)[i];
    if (dtype == 1) {
        unsigned int bits = ((unsigned int)((const unsigned short*)p)[i]) << 16;
        return (double)__uint_as_float(bits);
    }
    if (dtype == 2) {
        unsigned short h = ((const unsigned short*)p)[i];
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return (double)f;
    }
    if (dtype == 3) return (double)((const int*)p)[i];
    return (double)((const long long*)p)[i];
}

__device__ __forceinline__ bool is_finite(double x) { return isfinite(x); }

// stats layout (one slot = 8 doubles' worth of 8-byte words):
//  [0] sum (out-ref)^2   [1] sum ref^2   [2] max |out-ref| (as ordered bits)
//  [3] count non-finite where the reference is finite (or mismatching non-finite)
//  [4] count elementwise violations of |out-ref| <= atol + rtol*|ref|
//  [5] n - (index of the first bad element), 0 = none (atomicMax keeps the first)
extern "C" __global__ void judge_compare(const void* out, int dtype, const double* ref,
                                         long long n, double atol, double rtol,
                                         unsigned long long* stats) {
    double s_d2 = 0.0, s_r2 = 0.0, mx = 0.0;
    unsigned long long nonfinite = 0, bad = 0;
    long long first_bad = -1;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double o = load_as_double(out, i, dtype);
        double r = ref[i];
        if (!is_finite(r)) {
            bool same = (isnan(r) && isnan(o)) || (o == r);
            if (!same) { nonfinite++; if (first_bad < 0) first_bad = i; }
            continue;
        }
        if (!is_finite(o)) { nonfinite++; if (first_bad < 0) first_bad = i; continue; }
        double d = fabs(o - r);
        s_d2 += d * d;
        s_r2 += r * r;
        mx = fmax(mx, d);
        if (d > atol + rtol * fabs(r)) { bad++; if (first_bad < 0) first_bad = i; }
    }
    // warp reduction, then one atomic per warp (enough: the kernel is memory bound)
    for (int off = 16; off > 0; off >>= 1) {
        s_d2 += __shfl_down_sync(0xffffffff, s_d2, off);
        s_r2 += __shfl_down_sync(0xffffffff, s_r2, off);
        mx = fmax(mx, __shfl_down_sync(0xffffffff, mx, off));
        nonfinite += __shfl_down_sync(0xffffffff, nonfinite, off);
        bad += __shfl_down_sync(0xffffffff, bad, off);
        long long fb = __shfl_down_sync(0xffffffff, first_bad, off);
        if (fb >= 0 && (first_bad < 0 || fb < first_bad)) first_bad = fb;
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd((double*)&stats[0], s_d2);
        atomicAdd((double*)&stats[1], s_r2);
        atomicMax(&stats[2], (unsigned long long)__double_as_longlong(mx));  // mx >= 0
        atomicAdd(&stats[3], nonfinite);
        atomicAdd(&stats[4], bad);
        if (first_bad >= 0) atomicMax(&stats[5], (unsigned long long)(n - first_bad));
    }
}

// count[0] += number of bytes where a[i] != b[i]
extern "C" __global__ void judge_bytes_differ(const unsigned char* a, const unsigned char* b,
                                              long long n, unsigned long long* count) {
    unsigned long long c = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        c += (a[i] != b[i]);
    for (int off = 16; off > 0; off >>= 1) c += __shfl_down_sync(0xffffffff, c, off);
    if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}

// count[0] += number of bytes of p that are not `value`
extern "C" __global__ void judge_bytes_not(const unsigned char* p, long long n, int value,
                                           unsigned long long* count) {
    unsigned long long c = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        c += (p[i] != (unsigned char)value);
    for (int off = 16; off > 0; off >>= 1) c += __shfl_down_sync(0xffffffff, c, off);
    if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}

// The L2 flush before a timed run, by reading: n16 16-byte vectors of p, each loaded once. Every
// line the timed kernel could find in the L2 is evicted, and what is left behind is clean (a
// written flush leaves tens of MB of dirty lines that the next kernel pays to write back). The
// loads are XOR-folded and the fold is stored only when it equals a value no flush buffer
// contents give in practice, so the compiler must keep every load and the store never happens.
extern "C" __global__ void judge_read_flush(const uint4* p, long long n16,
                                            unsigned long long* sink) {
    unsigned int a = 0, b = 0, c = 0, d = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride) {
        uint4 v = p[i];
        a ^= v.x; b ^= v.y; c ^= v.z; d ^= v.w;
    }
    unsigned long long fold = ((unsigned long long)(a ^ c) << 32) | (unsigned long long)(b ^ d);
    if (fold == 0x9E3779B97F4A7C15ull) atomicAdd(sink, 1ull);
}

// Keep the stream busy for `ns` nanoseconds (one thread, the global timer). Queued ahead of a
// timed run's L2 flush, it covers the host's time to enqueue the flush, the start event and the
// entrant: a baseline called through Python (torch eager, torch.compile, Triton) spends tens to
// hundreds of microseconds on the host before its kernels reach the stream, and without the
// hold the GPU sits idle inside the timed interval for that long. Our own launches take a few
// microseconds on the host, but every entrant gets the same protocol.
extern "C" __global__ void judge_hold(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(256);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

// A byte mover with an operator's traffic, the ceiling for its mix of reads and writes (the
// buffers and counts as in mix.cuh; n the largest count). A copy reads one byte per byte
// written; SiLU-mul reads two, cross-entropy reads nearly only, and HBM moves reads faster than
// writes, so such operators can outrun a copy of the same bytes. One 16-byte vector per thread,
// one tile of 256 vectors per block, as many blocks as tiles (Session._launch_mix): on the H200
// this layout moved every suite operator's bytes fastest of those bench/mover.py times (a
// grid-stride loop in one wave of resident blocks, with one or four vectors per step, reached
// only 93-98% of the copy ceiling at one or two reads per write; two or four vectors per thread
// per tile 97-99%; bench/results/2026-12-03-h200-mover/).
#include "mix.cuh"

extern "C" __global__ void judge_mix(const uint4* a, long long na, const uint4* b, long long nb,
                                     const uint4* c, long long nc, const uint4* d, long long nd,
                                     uint4* y, long long ny, uint4* z, long long nz, long long n) {
    // mix_step guards every load and store by its buffer's count, so no guard by n here
    mix_step<1>(a, na, b, nb, c, nc, d, nd, y, ny, z, nz,
                (long long)blockIdx.x * blockDim.x + threadIdx.x, blockDim.x);
}
