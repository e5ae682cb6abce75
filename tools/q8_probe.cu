// A probe, not part of lucegen: the quantised target's products with int8 activations (tools/q8_probe.py runs it).
//
// Activations are quantised per token and 256 values, as GGML's Q8_K: a = d * q, q = rint(a 127 / amax), with the
// sums of q per 32 and per 16 values. Then a K-quant block's product is integers up to one float step:
//   Q4_K: sum_k W[k] a[k] = d_a (d sum_s sc_s sum_{k in s} q_k qa_k - dmin sum_s m_s sum_{k in s} qa_k)
//   Q6_K: sum_k W[k] a[k] = d_a d sum_s sc_s (sum_{k in s} q6_k qa_k - 32 sum_{k in s} qa_k)
// with the inner sums exact in int32: on the tensor cores (mma m16n8k32 s8, the mins as a second mma against their
// 6-bit m splatted over the sub-block) or by dp4a (one row). The float step is per (row, token, 256 values).

#include <cuda_fp16.h>
__device__ __forceinline__ float f16(unsigned b) { return __half2float(__ushort_as_half((unsigned short)b)); }
__device__ __forceinline__ int dp4a_us(unsigned a, int b, int c) {
  int d; asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d;
}
__device__ __forceinline__ void imma(int (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void imma0(int (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%10,%10,%10,%10};"
               : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
// The 6-bit scales / mins of a K-quant header, 8 sub-blocks a byte each: words [0] sub-blocks 0..3, [1] 4..7.
struct KS { unsigned sc[2], m[2]; float d, dmin; };
__device__ __forceinline__ KS kscales(uint4 h) {
  KS k;
  k.sc[0] = h.y & 0x3F3F3F3Fu; k.m[0] = h.z & 0x3F3F3F3Fu;
  k.sc[1] = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
  k.m[1] = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
  k.d = f16(h.x & 0xFFFFu); k.dmin = f16(h.x >> 16);
  return k;
}
__device__ __forceinline__ int kbyte(const unsigned (&w)[2], int s) { return (w[s >> 2] >> (8 * (s & 3))) & 0xFF; }

// Activations: x[M][K] float -> q int8 [Mpad][K], d [K/256][Mpad] float, sums of q per 32 [K/32][Mpad] int.
// One warp per (token, 256 values).
extern "C" __global__ void q8k_quantize(const float* x, int K, int M, int Mpad, signed char* q, float* d, int* sums,
                                        int* sums16) {
  const int lane = threadIdx.x & 31, b = blockIdx.x, m = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
  if (m >= Mpad) return;
  float v[8];
  float amax = 0.f;
  for (int i = 0; i < 8; ++i) {
    v[i] = m < M ? x[(size_t)m * K + b * 256 + 8 * lane + i] : 0.f;
    amax = fmaxf(amax, fabsf(v[i]));
  }
  for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, o));
  const float dd = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
  int s = 0; unsigned lo = 0, hi = 0;
  for (int i = 0; i < 8; ++i) {
    const int qi = __float2int_rn(v[i] * inv);
    s += qi;
    if (i < 4) lo |= (unsigned)(qi & 0xFF) << (8 * i); else hi |= (unsigned)(qi & 0xFF) << (8 * (i - 4));
  }
  *reinterpret_cast<uint2*>(q + (size_t)m * K + b * 256 + 8 * lane) = make_uint2(lo, hi);
  s += __shfl_xor_sync(~0u, s, 1);
  if ((lane & 1) == 0) sums16[(size_t)(b * 16 + lane / 2) * Mpad + m] = s;
  s += __shfl_xor_sync(~0u, s, 2);
  if ((lane & 3) == 0) sums[(size_t)(b * 8 + lane / 4) * Mpad + m] = s;
  if (lane == 0) d[(size_t)b * Mpad + m] = dd;
}

// The B fragment of token row `tok`, values k0 .. k0 + 7: int8 as stored, or (HALF_IN) quantised as it is loaded
// from fp16 activations with the token's 127 / amax of this 256-value block, `inv` (fp16, rounded down so that
// |x inv| <= 127): hfma2(x, inv, 1536) rounds x inv to an integer whose two's complement byte is the low byte of the
// result's bits (1536 = 0x6600: unit steps on [1024, 2048)), so one hfma2 per 2 values and one byte permute per 4.
template <bool HALF_IN>
__device__ __forceinline__ uint2 b_fragment(const void* act, const void* inv, int K, int Mpad, int b, int tok, int k0) {
  if (!HALF_IN)
    return __ldg(reinterpret_cast<const uint2*>(static_cast<const signed char*>(act) + (size_t)tok * K + k0));
  const uint4 x = __ldg(reinterpret_cast<const uint4*>(static_cast<const __half*>(act) + (size_t)tok * K + k0));
  const __half h = __ldg(static_cast<const __half*>(inv) + (size_t)b * Mpad + tok);
  const __half2 i2 = __halves2half2(h, h), magic = __float2half2_rn(1536.f);
  __half2 r[4];
  const unsigned xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) r[e] = __hfma2(*reinterpret_cast<const __half2*>(&xs[e]), i2, magic);
  const unsigned* w = reinterpret_cast<const unsigned*>(r);
  return make_uint2(__byte_perm(w[0], w[1], 0x6420), __byte_perm(w[2], w[3], 0x6420));
}

// Tensor-core form. W tiled: per (tile of 16 rows, block b) 256 bytes of headers (row r at 16 r) then 2048 bytes of
// quants, [j][lane][16]: lane (g, t) finds bytes 32 j + 8 t .. + 7 of row g, then of row g + 8. Block = warps
// (tiles_per_block x parts); warp w: tile w / parts, blocks b = part, part + parts, ...
template <int NT, int WARPS, bool PREFETCH, bool HALF_IN>
__device__ void q4k_imma_body(const unsigned char* __restrict__ W, int nb, int tiles, int parts,
                              const void* __restrict__ q, int K, const float* __restrict__ ad,
                              const void* __restrict__ asum, int Mpad, int M, float* __restrict__ out, int N) {
  __shared__ float red[WARPS][NT][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int tpb = WARPS / parts, tile = blockIdx.x * tpb + warp / parts, part = warp % parts;
  float acc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) for (int i = 0; i < 4; ++i) acc[n][i] = 0.f;
  if (tile < tiles) {
    uint4 nhg, nh8, nv[4];
    auto load = [&](int b) {
      const unsigned char* base = W + ((size_t)tile * nb + b) * 2304;
      nhg = __ldg(reinterpret_cast<const uint4*>(base + 16 * g));
      nh8 = __ldg(reinterpret_cast<const uint4*>(base + 16 * (g + 8)));
#pragma unroll
      for (int j = 0; j < 4; ++j) nv[j] = __ldg(reinterpret_cast<const uint4*>(base + 256 + 512 * j + 16 * lane));
    };
    if (PREFETCH && part < nb) load(part);
    for (int b = part; b < nb; b += parts) {
      if (!PREFETCH) load(b);
      const uint4 hg = nhg, h8 = nh8;
      uint4 v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = nv[j];
      if (PREFETCH && b + parts < nb) load(b + parts);
      const KS kg = kscales(hg), k8 = kscales(h8);
      int S[NT][4], Mn[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n) for (int i = 0; i < 4; ++i) { S[n][i] = 0; Mn[n][i] = 0; }
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const int j = s >> 1, sh = 4 * (s & 1);
        const unsigned a[4] = {(v[j].x >> sh) & 0x0F0F0F0Fu, (v[j].z >> sh) & 0x0F0F0F0Fu,
                               (v[j].y >> sh) & 0x0F0F0F0Fu, (v[j].w >> sh) & 0x0F0F0F0Fu};
        const unsigned mg = kbyte(kg.m, s) * 0x01010101u, m8 = kbyte(k8.m, s) * 0x01010101u;
        const unsigned am[4] = {mg, m8, mg, m8};
        const int scg = kbyte(kg.sc, s), sc8 = kbyte(k8.sc, s);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const uint2 bq = b_fragment<HALF_IN>(q, asum, K, Mpad, b, 8 * n + g, b * 256 + 32 * s + 8 * t);
          int c[4];
          imma0(c, a, bq.x, bq.y);
          imma(Mn[n], am, bq.x, bq.y);
          S[n][0] += scg * c[0]; S[n][1] += scg * c[1]; S[n][2] += sc8 * c[2]; S[n][3] += sc8 * c[3];
        }
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float2 da = __ldg(reinterpret_cast<const float2*>(ad + (size_t)b * Mpad + 8 * n + 2 * t));
        acc[n][0] += da.x * (kg.d * (float)S[n][0] - kg.dmin * (float)Mn[n][0]);
        acc[n][1] += da.y * (kg.d * (float)S[n][1] - kg.dmin * (float)Mn[n][1]);
        acc[n][2] += da.x * (k8.d * (float)S[n][2] - k8.dmin * (float)Mn[n][2]);
        acc[n][3] += da.y * (k8.d * (float)S[n][3] - k8.dmin * (float)Mn[n][3]);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) for (int i = 0; i < 4; ++i) red[warp][n][i][lane] = acc[n][i];
  __syncthreads();
  if (part == 0 && tile < tiles) {
#pragma unroll
    for (int n = 0; n < NT; ++n) for (int i = 0; i < 4; ++i) {
      float s = acc[n][i];
      for (int p = 1; p < parts; ++p) s += red[warp + p][n][i][lane];
      const int tok = 8 * n + 2 * t + (i & 1), row = 16 * tile + g + 8 * (i >> 1);
      if (tok < M) out[(size_t)tok * N + row] = s;
    }
  }
}
#define IMMA_KERNEL(NAME, NT, WARPS, MINB, PF, HALF_IN) \
extern "C" __global__ void __launch_bounds__(32 * WARPS, MINB) NAME(const unsigned char* W, int nb, int tiles, \
    int parts, const void* q, int K, const float* ad, const void* asum, int Mpad, int M, float* out, int N) { \
  q4k_imma_body<NT, WARPS, PF, HALF_IN>(W, nb, tiles, parts, q, K, ad, asum, Mpad, M, out, N); }
// q4k_imma_nt<token groups>_w<warps a block>; _pf: the next block's weights loaded before this one's products;
// _h: fp16 activations quantised as they are loaded (q: the fp16 rows, asum: the fp16 inv per block and token).
IMMA_KERNEL(q4k_imma_nt1_w8, 1, 8, 2, false, false)
IMMA_KERNEL(q4k_imma_nt2_w8, 2, 8, 2, false, false)
IMMA_KERNEL(q4k_imma_nt3_w8, 3, 8, 1, false, false)
IMMA_KERNEL(q4k_imma_nt2_w4, 2, 4, 4, false, false)
IMMA_KERNEL(q4k_imma_nt3_w4, 3, 4, 3, false, false)
IMMA_KERNEL(q4k_imma_nt3_w8_pf, 3, 8, 1, true, false)
IMMA_KERNEL(q4k_imma_nt3_w4_pf, 3, 4, 3, true, false)
IMMA_KERNEL(q4k_imma_nt1_w8_h, 1, 8, 2, false, true)
IMMA_KERNEL(q4k_imma_nt2_w4_h, 2, 4, 4, false, true)
IMMA_KERNEL(q4k_imma_nt3_w4_h, 3, 4, 3, false, true)

// dp4a form, one row, raw GGML rows (144 bytes a block). Warp = R rows; lane (bl = lane / 4, c = lane % 4): blocks
// bl, bl + 8, ..., quant bytes 32 c .. 32 c + 31 (sub-blocks 2c low nibbles, 2c + 1 high nibbles).
template <int R>
__device__ void q4k_dp4a_body(const unsigned char* __restrict__ W, int N, int nb, const signed char* __restrict__ q,
                              const float* __restrict__ ad, const int* __restrict__ asum, int Mpad,
                              float* __restrict__ out) {
  const int lane = threadIdx.x & 31, c = lane & 3, bl = lane >> 2;
  const int row0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * R;
  if (row0 >= N) return;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int b = bl; b < nb; b += 8) {
    const int4* a = reinterpret_cast<const int4*>(q + b * 256 + 64 * c);
    const int4 a0 = __ldg(a), a1 = __ldg(a + 1), a2 = __ldg(a + 2), a3 = __ldg(a + 3);
    const int slo = __ldg(asum + (size_t)(b * 8 + 2 * c) * Mpad);
    const int shi = __ldg(asum + (size_t)(b * 8 + 2 * c + 1) * Mpad);
    const float da = __ldg(ad + (size_t)b * Mpad);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const unsigned char* blk = W + ((size_t)(row0 + r) * nb + b) * 144;
      const uint4 h = __ldg(reinterpret_cast<const uint4*>(blk));
      const uint4 q0 = __ldg(reinterpret_cast<const uint4*>(blk + 16 + 32 * c));
      const uint4 q1 = __ldg(reinterpret_cast<const uint4*>(blk + 32 + 32 * c));
      int lo = 0, hi = 0;
      lo = dp4a_us(q0.x & 0x0F0F0F0Fu, a0.x, lo); lo = dp4a_us(q0.y & 0x0F0F0F0Fu, a0.y, lo);
      lo = dp4a_us(q0.z & 0x0F0F0F0Fu, a0.z, lo); lo = dp4a_us(q0.w & 0x0F0F0F0Fu, a0.w, lo);
      lo = dp4a_us(q1.x & 0x0F0F0F0Fu, a1.x, lo); lo = dp4a_us(q1.y & 0x0F0F0F0Fu, a1.y, lo);
      lo = dp4a_us(q1.z & 0x0F0F0F0Fu, a1.z, lo); lo = dp4a_us(q1.w & 0x0F0F0F0Fu, a1.w, lo);
      hi = dp4a_us(q0.x & 0xF0F0F0F0u, a2.x, hi); hi = dp4a_us(q0.y & 0xF0F0F0F0u, a2.y, hi);
      hi = dp4a_us(q0.z & 0xF0F0F0F0u, a2.z, hi); hi = dp4a_us(q0.w & 0xF0F0F0F0u, a2.w, hi);
      hi = dp4a_us(q1.x & 0xF0F0F0F0u, a3.x, hi); hi = dp4a_us(q1.y & 0xF0F0F0F0u, a3.y, hi);
      hi = dp4a_us(q1.z & 0xF0F0F0F0u, a3.z, hi); hi = dp4a_us(q1.w & 0xF0F0F0F0u, a3.w, hi);
      const KS k = kscales(h);
      const int S = kbyte(k.sc, 2 * c) * lo + kbyte(k.sc, 2 * c + 1) * (hi >> 4);
      const int Mn = kbyte(k.m, 2 * c) * slo + kbyte(k.m, 2 * c + 1) * shi;
      acc[r] += da * (k.d * (float)S - k.dmin * (float)Mn);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float s = acc[r];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
    if (lane == 0 && row0 + r < N) out[row0 + r] = s;
  }
}
#define DP4A_KERNEL(NAME, R) \
extern "C" __global__ void __launch_bounds__(256) NAME(const unsigned char* W, int N, int nb, \
    const signed char* q, const float* ad, const int* asum, int Mpad, float* out) { \
  q4k_dp4a_body<R>(W, N, nb, q, ad, asum, Mpad, out); }
// q4k_dp4a_r<rows a warp>
DP4A_KERNEL(q4k_dp4a_r1, 1)
DP4A_KERNEL(q4k_dp4a_r2, 2)
// Q6_K, one row, dp4a. Blocks as structure of arrays: ql[128], qh[64], scales int8[16], d f16 per block.
// Lane (bl = lane / 8: blocks bl, bl + 4, ...; c = lane % 8: half h = c / 4, quarter u = c % 4): values
// 128 h + 32 u .. + 31 (sub-blocks 8h + 2u, 8h + 2u + 1 of 16).
template <int R>
__device__ void q6k_dp4a_body(const unsigned char* __restrict__ ql, const unsigned char* __restrict__ qh,
                              const signed char* __restrict__ scl, const unsigned short* __restrict__ dd, int N, int nb,
                              const signed char* __restrict__ q, const float* __restrict__ ad,
                              const int* __restrict__ asum16, int Mpad, float* __restrict__ out) {
  const int lane = threadIdx.x & 31, c = lane & 7, bl = lane >> 3, h = c >> 2, u = c & 3;
  const int row0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * R;
  if (row0 >= N) return;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int b = bl; b < nb; b += 4) {
    const int4* a = reinterpret_cast<const int4*>(q + b * 256 + 128 * h + 32 * u);
    const int4 a0 = __ldg(a), a1 = __ldg(a + 1);
    const int s0 = __ldg(asum16 + (size_t)(b * 16 + 8 * h + 2 * u) * Mpad);
    const int s1 = __ldg(asum16 + (size_t)(b * 16 + 8 * h + 2 * u + 1) * Mpad);
    const float da = __ldg(ad + (size_t)b * Mpad);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const size_t blk = (size_t)(row0 + r) * nb + b;
      const uint4 l0 = __ldg(reinterpret_cast<const uint4*>(ql + blk * 128 + 64 * h + 32 * (u & 1)));
      const uint4 l1 = __ldg(reinterpret_cast<const uint4*>(ql + blk * 128 + 64 * h + 32 * (u & 1) + 16));
      const uint4 g0 = __ldg(reinterpret_cast<const uint4*>(qh + blk * 64 + 32 * h));
      const uint4 g1 = __ldg(reinterpret_cast<const uint4*>(qh + blk * 64 + 32 * h + 16));
      const unsigned short scw = __ldg(reinterpret_cast<const unsigned short*>(scl + blk * 16 + 8 * h + 2 * u));
      const float d = f16(__ldg(dd + blk));
      const int ls = 4 * (u >> 1), hs = 2 * u;
#define Q6V(L, G) ((((L) >> ls) & 0x0F0F0F0Fu) | ((((G) >> hs) & 0x03030303u) << 4))
      int d0 = 0, d1 = 0;
      d0 = dp4a_us(Q6V(l0.x, g0.x), a0.x, d0); d0 = dp4a_us(Q6V(l0.y, g0.y), a0.y, d0);
      d0 = dp4a_us(Q6V(l0.z, g0.z), a0.z, d0); d0 = dp4a_us(Q6V(l0.w, g0.w), a0.w, d0);
      d1 = dp4a_us(Q6V(l1.x, g1.x), a1.x, d1); d1 = dp4a_us(Q6V(l1.y, g1.y), a1.y, d1);
      d1 = dp4a_us(Q6V(l1.z, g1.z), a1.z, d1); d1 = dp4a_us(Q6V(l1.w, g1.w), a1.w, d1);
      const int S = (int)(signed char)(scw & 0xFF) * (d0 - 32 * s0) + (int)(signed char)(scw >> 8) * (d1 - 32 * s1);
      acc[r] += da * (d * (float)S);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float s = acc[r];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
    if (lane == 0 && row0 + r < N) out[row0 + r] = s;
  }
}
#define Q6_KERNEL(R) \
extern "C" __global__ void __launch_bounds__(256) q6k_dp4a_r##R(const unsigned char* ql, const unsigned char* qh, \
    const signed char* scl, const unsigned short* dd, int N, int nb, const signed char* q, const float* ad, \
    const int* asum16, int Mpad, float* out) { q6k_dp4a_body<R>(ql, qh, scl, dd, N, nb, q, ad, asum16, Mpad, out); }
Q6_KERNEL(1)
Q6_KERNEL(2)
