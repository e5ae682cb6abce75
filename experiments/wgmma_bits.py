"""Two facts the quantised GEMM's warpgroup-MMA kernels rely on (templates/kernels/quant_gemm.cu.j2, qg_tile_wgmma),
checked on the device (sm_90): is wgmma m64n24k16 (A from registers, B from shared memory) bit-identical to
mma.sync m16n8k16 over chains of k16 steps, and does the order of a k16 product's slots change its bits? Prints, per
chain length R and variant, the error against float64 and how many outputs differ from mma.sync in natural order
(wg_b swaps the descriptor's two byte offsets: the wrong layout, as a control).

    python experiments/wgmma_bits.py
"""
import numpy as np
from lucegen.runtime.device import Device
from lucegen.compile import compile_source

SRC = r'''
#include <cuda_bf16.h>
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// slot s of a 16-value step holds value perm(s): natural (P = 0) or lucegen's (P = 1: 2t, 2t+1 <- 4t, 4t+1; 2t+8, 2t+9 <- 4t+2, 4t+3)
__device__ __forceinline__ int perm(int s, int P) {
  if (!P) return s;
  const int hi = s >= 8, t = (s & 7) >> 1, e = s & 1;
  return 4 * t + 2 * hi + e;
}
__device__ __forceinline__ unsigned pair(const unsigned short* row, int k0, int s, int P) {
  return (unsigned)row[k0 + perm(s, P)] | ((unsigned)row[k0 + perm(s + 1, P)] << 16);
}
// A [blocks][64][K], B [blocks][24][K] (bf16 bits); out [blocks][K/16/R][64][24] f32
extern "C" __global__ void run_mma(const unsigned short* A, const unsigned short* B, float* out, int K, int R, int P) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const unsigned short* a_blk = A + (size_t)blockIdx.x * 64 * K;
  const unsigned short* b_blk = B + (size_t)blockIdx.x * 24 * K;
  float* o = out + (size_t)blockIdx.x * (K / 16 / R) * 64 * 24;
  const int steps = K / 16;
  for (int ch = 0; ch < steps / R; ++ch) {
    float c[3][4] = {};
    for (int j = ch * R; j < ch * R + R; ++j) {
      const int k0 = 16 * j;
      const unsigned short* r0 = a_blk + (size_t)(16 * w + g) * K;
      const unsigned short* r8 = a_blk + (size_t)(16 * w + g + 8) * K;
      unsigned a[4] = {pair(r0, k0, 2 * t, P), pair(r8, k0, 2 * t, P), pair(r0, k0, 2 * t + 8, P), pair(r8, k0, 2 * t + 8, P)};
      for (int nt = 0; nt < 3; ++nt) {
        const unsigned short* br = b_blk + (size_t)(8 * nt + g) * K;
        mma(c[nt], a, pair(br, k0, 2 * t, P), pair(br, k0, 2 * t + 8, P));
      }
    }
    float* oc = o + (size_t)ch * 64 * 24;
    for (int nt = 0; nt < 3; ++nt) {
      oc[(16 * w + g) * 24 + 8 * nt + 2 * t] = c[nt][0];
      oc[(16 * w + g) * 24 + 8 * nt + 2 * t + 1] = c[nt][1];
      oc[(16 * w + g + 8) * 24 + 8 * nt + 2 * t] = c[nt][2];
      oc[(16 * w + g + 8) * 24 + 8 * nt + 2 * t + 1] = c[nt][3];
    }
  }
}
__device__ __forceinline__ unsigned long long desc(const void* p, int lbo, int sbo) {
  const unsigned long long addr = (unsigned)__cvta_generic_to_shared(p);
  return ((addr & 0x3FFFFull) >> 4) | ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32);
}
__device__ __forceinline__ void wgmma24(float (&c)[12], const unsigned (&a)[4], unsigned long long d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %17, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, %16, p, 1, 1, 0;\n}\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]), "+f"(c[4]), "+f"(c[5]), "+f"(c[6]), "+f"(c[7]), "+f"(c[8]),
        "+f"(c[9]), "+f"(c[10]), "+f"(c[11])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(d), "r"(1) : "memory");
}
// B of one step in core matrices: (n group i, k half h) at (2 i + h) * 128 bytes, row n at 16 bytes; LBO/SBO swapped by SW
extern "C" __global__ void run_wgmma(const unsigned short* A, const unsigned short* B, float* out, int K, int R, int SW) {
  __shared__ __align__(128) unsigned short bs[6 * 64];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const unsigned short* a_blk = A + (size_t)blockIdx.x * 64 * K;
  const unsigned short* b_blk = B + (size_t)blockIdx.x * 24 * K;
  float* o = out + (size_t)blockIdx.x * (K / 16 / R) * 64 * 24;
  const int steps = K / 16;
  for (int ch = 0; ch < steps / R; ++ch) {
    float c[12];
    for (int i = 0; i < 12; ++i) c[i] = 0.0f;
    for (int j = ch * R; j < ch * R + R; ++j) {
      const int k0 = 16 * j;
      __syncthreads();
      for (int e = threadIdx.x; e < 24 * 16; e += 128) {
        const int n = e / 16, k = e % 16, i = n / 8, h = k / 8;
        bs[(2 * i + h) * 64 + (n % 8) * 8 + (k % 8)] = b_blk[(size_t)n * K + k0 + k];
      }
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
      const unsigned short* r0 = a_blk + (size_t)(16 * w + g) * K;
      const unsigned short* r8 = a_blk + (size_t)(16 * w + g + 8) * K;
      unsigned a[4] = {pair(r0, k0, 2 * t, 0), pair(r8, k0, 2 * t, 0), pair(r0, k0, 2 * t + 8, 0), pair(r8, k0, 2 * t + 8, 0)};
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
      wgmma24(c, a, SW ? desc(bs, 256, 128) : desc(bs, 128, 256));
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
    float* oc = o + (size_t)ch * 64 * 24;
    for (int nt = 0; nt < 3; ++nt) {
      oc[(16 * w + g) * 24 + 8 * nt + 2 * t] = c[4 * nt + 0];
      oc[(16 * w + g) * 24 + 8 * nt + 2 * t + 1] = c[4 * nt + 1];
      oc[(16 * w + g + 8) * 24 + 8 * nt + 2 * t] = c[4 * nt + 2];
      oc[(16 * w + g + 8) * 24 + 8 * nt + 2 * t + 1] = c[4 * nt + 3];
    }
  }
}
'''


def bf16(x):
    b = np.asarray(x, np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def main():
    dev = Device.open()
    mod = dev.load(compile_source(dev.target, "wgbits", SRC, arch="sm_90a", use_cache=False))
    rng = np.random.default_rng(0)
    blocks, K = 1024, 256
    A = bf16(rng.integers(-40, 41, (blocks, 64, K)).astype(np.float32))
    B = bf16(rng.standard_normal((blocks, 24, K)) * 2.0 ** rng.integers(-6, 7, (blocks, 24, K)))
    dA, dB = dev.upload(A), dev.upload(B)
    for R in (1, 2, 16):
        n = blocks * (K // 16 // R) * 64 * 24
        res = {}
        for name, fn, extra in (("mma_nat", "run_mma", 0), ("mma_perm", "run_mma", 1), ("wg_a", "run_wgmma", 0),
                                ("wg_b", "run_wgmma", 1)):
            out = dev.alloc(4 * n)
            mod.function(fn).launch(blocks, 128, (dA, dB, out, np.int32(K), np.int32(R), np.int32(extra)))
            dev.synchronize()
            res[name] = dev.download(out, np.float32, (blocks, K // 16 // R, 64, 24))
        ref = np.einsum("bmcsk,bncsk->bcmn", f32(A).astype(np.float64).reshape(blocks, 64, -1, R, 16),
                        f32(B).astype(np.float64).reshape(blocks, 24, -1, R, 16))
        for name, v in res.items():
            err = np.abs(v - ref).max() / np.abs(ref).max()
            print(f"R={R} {name}: max rel err vs f64 {err:.3g}; bits != mma_nat: "
                  f"{(v.view(np.uint32) != res['mma_nat'].view(np.uint32)).sum()} of {v.size}", flush=True)


main()
