// Device probe (issue 15): the regrouped GEMM chain out = a @ (b @ d) as ONE kernel of thread-block
// clusters that share the intermediate through distributed shared memory (Hopper), fp16 operands,
// fp32 accumulation, X = b @ d rounded to fp16 as a two-kernel plan stores it.
//
// Why. Two dependent Triton GEMMs cost at least about 4.1 us on the H100 (session 39's floor probe),
// over the fp16 targets of G4-G10 (3.7-4.8 us). Every one-kernel form tried so far paid global
// round trips (counters, partial sums in L2). Inside a cluster the CTAs can exchange tiles and wait
// for each other through their shared memory, with no L2 round trip and no second launch.
//
// Form (a [M, KX], b [KX, N], d [N, L], out [M, L]). A cluster of C CTAs owns a block of LB columns of
// X = b @ d and of out (out[:, j] = a @ X[:, j], X[:, j] = b @ d[:, j]) and RM * C rows of out:
// - CTA r multiplies the r-th slice of N (b[:, slice] @ d[slice, j], N / C wide) into a float32
//   partial of X[:, j] in its shared memory;
// - cluster barrier; CTA r sums its KX / C rows of the C partials, in rank order (the same bits on
//   every run), reading its peers' shared memory, and rounds them to fp16;
// - cluster barrier; each CTA copies the other CTAs' rows of X[:, j] into its own shared memory;
// - each CTA computes its RM rows of out[:, j] = a[rows] @ X[:, j] and stores them.
// A column block's X is computed once per cluster of rows (G7-G10: one block, LB = L = 128; G4, G5:
// X is too big for one cluster, so each column block has its clusters).
// Products use WMMA (mma.sync); operands are staged in shared memory by cp.async, 16 bytes a copy, all in
// flight at once (b's and d's slices first; a's rows arrive while phase 1 runs).
//
// Built and run by scripts/cluster_chain_probe.py (torch.utils.cpp_extension.load; nvcc -arch=sm_90a).
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#ifdef TORCH_EXTENSION_NAME
#include <torch/extension.h>
#endif

namespace cg = cooperative_groups;
using namespace nvcuda;

constexpr int THREADS = 256;  // 8 warps
constexpr int WARPS = THREADS / 32;
constexpr int PAD_H = 8;    // halves of padding per shared row (16 bytes: no bank conflicts, WMMA ld % 8 == 0)
constexpr int PAD_F = 4;    // floats of padding per shared float row

// Shared memory (bytes) of one CTA: b's slice (KX x NS), d's slice (NS x LB), X's block (KX x LB, fp16),
// a's rows (RM x KX), the float32 partial of X's block (KX x LB; out's staging later).
__host__ __device__ constexpr int smem_bytes(int NS, int RM, int KX, int LB) {
  return 2 * (KX * (NS + PAD_H) + NS * (LB + PAD_H) + KX * (LB + PAD_H) + RM * (KX + PAD_H))
       + 4 * (KX * (LB + PAD_F));
}

// rows x cols halves from global (row stride gld) into shared (row stride sld): cp.async of 16 bytes each,
// not waited for here (the caller commits the group and waits), so every load of a stage is in flight at once.
__device__ inline void stage(half* s, int sld, const half* g, int gld, int rows, int cols) {
  const int per_row = cols / 8;
  for (int i = threadIdx.x; i < rows * per_row; i += THREADS) {
    const int r = i / per_row, c = (i % per_row) * 8;
    __pipeline_memcpy_async(s + r * sld + c, g + (size_t)r * gld + c, 16);
  }
}

// acc[t] += A (rows x depth, lda) @ B (depth x cols, ldb) for this warp's tiles t of the product's 16 x 16
// tiles in row-major order (tile = warp * PER_WARP + t); warps past the last tile do nothing.
// `b_row(k)` is the address of B's row k (B may lie in several CTAs' shared memory; rows k..k+15 in one).
template <int TILES_N, int PER_WARP, typename BRow>
__device__ inline void warp_product(wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[PER_WARP],
                                    const half* A, int lda, BRow b_row, int ldb, int depth, int warp, int tiles) {
  for (int t = 0; t < PER_WARP; ++t) wmma::fill_fragment(acc[t], 0.0f);
  for (int k = 0; k < depth; k += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    int row = -1;
    for (int t = 0; t < PER_WARP; ++t) {
      const int tile = warp * PER_WARP + t;
      if (tile >= tiles) break;
      if (tile / TILES_N != row) {  // consecutive tiles share their row of A: load it once
        row = tile / TILES_N;
        wmma::load_matrix_sync(fa, A + row * 16 * lda + k, lda);
      }
      wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, b_row(k) + (tile % TILES_N) * 16, ldb);
      wmma::mma_sync(acc[t], fa, fb, acc[t]);
    }
  }
}

template <int PER_WARP>
__device__ inline void warp_store(wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[PER_WARP], float* C,
                                  int ldc, int tiles_n, int warp, int tiles) {
  for (int t = 0; t < PER_WARP; ++t) {
    const int tile = warp * PER_WARP + t;
    if (tile >= tiles) break;
    wmma::store_matrix_sync(C + (tile / tiles_n) * 16 * ldc + (tile % tiles_n) * 16, acc[t], ldc, wmma::mem_row_major);
  }
}

template <int C, int RM, int NS, int KX, int LB>
__global__ void __launch_bounds__(THREADS) chain_cluster(const half* __restrict__ a, const half* __restrict__ b,
                                                         const half* __restrict__ d, half* __restrict__ out, int M,
                                                         int N, int L, int stop) {
  constexpr int ROWS = KX / C;  // rows of X this CTA sums
  static_assert(KX % C == 0 && (ROWS * LB) % 4 == 0 && LB % 16 == 0, "X's rows split evenly, float4 at a time");
  static_assert(NS % 16 == 0 && RM % 16 == 0 && KX % 16 == 0, "whole WMMA tiles");
  constexpr int T1 = (KX / 16) * (LB / 16), T2 = (RM / 16) * (LB / 16);
  constexpr int PW1 = (T1 + WARPS - 1) / WARPS, PW2 = (T2 + WARPS - 1) / WARPS;
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LDB = NS + PAD_H, LDD = LB + PAD_H, LDX = LB + PAD_H, LDA = KX + PAD_H, LDP = LB + PAD_F;
  half* sB = reinterpret_cast<half*>(smem);  // b[:, slice]    KX x NS
  half* sD = sB + KX * LDB;                  // d[slice, j]    NS x LB
  half* sX = sD + NS * LDD;                  // X[:, j]        KX x LB (fp16)
  half* sA = sX + KX * LDX;                  // a[rows, :]     RM x KX
  float* sP = reinterpret_cast<float*>(sA + RM * LDA);  // partial X[:, j] (fp32), later out's staging

  cg::cluster_group cluster = cg::this_cluster();
  const int r = static_cast<int>(cluster.block_rank());
  const int row_clusters = M / (C * RM), cid = blockIdx.x / C;
  const int col0 = (cid / row_clusters) * LB;                   // this cluster's columns of X and out
  const int row0 = (cid % row_clusters) * (C * RM) + r * RM;   // this CTA's rows of out
  const int warp = threadIdx.x / 32;

  if (stop == 3) {  // timing variant: the launch alone (the same grid, cluster and shared memory)
    if (threadIdx.x == 0 && r == 0) out[(size_t)row0 * L + col0] = __float2half(0.f);
    return;
  }
  stage(sB, LDB, b + r * NS, N, KX, NS);
  stage(sD, LDD, d + (size_t)r * NS * L + col0, L, NS, LB);
  __pipeline_commit();
  stage(sA, LDA, a + (size_t)row0 * KX, KX, RM, KX);  // needed only in phase 2
  __pipeline_commit();
  __pipeline_wait_prior(1);  // b's and d's slices are here (a's may not be)
  __syncthreads();
  if (stop == 4) {  // timing variant: the launch and the staging of b's and d's slices
    out[(size_t)row0 * L + col0 + threadIdx.x % LB] = __hadd(sB[threadIdx.x], sD[threadIdx.x]);
    __pipeline_wait_prior(0);
    return;
  }

  {  // phase 1: the partial X[:, j] of this slice of N
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[PW1];
    warp_product<LB / 16, PW1>(acc, sB, LDB, [&](int k) { return sD + k * LDD; }, LDD, NS, warp, T1);
    warp_store<PW1>(acc, sP, LDP, LB / 16, warp, T1);
  }
  if (stop == 1) {  // timing variant: phase 1 alone (one value kept live)
    __pipeline_wait_prior(0);
    __syncthreads();
    out[(size_t)row0 * L + col0 + threadIdx.x % LB] = __float2half(sP[threadIdx.x]);
    return;
  }
  cluster.sync();  // every partial is in its CTA's shared memory

  // this CTA's rows of X[:, j]: the partials summed in rank order, rounded to fp16
  for (int i = threadIdx.x; i < ROWS * LB / 4; i += THREADS) {
    const int row = r * ROWS + (i * 4) / LB, col = (i * 4) % LB;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int q = 0; q < C; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(sP, q) + row * LDP + col);
      s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
    }
    half2* x = reinterpret_cast<half2*>(sX + row * LDX + col);
    x[0] = __floats2half2_rn(s.x, s.y);
    x[1] = __floats2half2_rn(s.z, s.w);
  }
  cluster.sync();  // every CTA's rows of X are done, and no one reads a partial any more

  // stop 5: the whole chain with phase 2 reading the peers' rows of X in their shared memory (no gather;
  // needs whole 16-row WMMA tiles per CTA, KX / C % 16 == 0)
  const bool direct = stop == 5 && ROWS % 16 == 0;
  if (!direct) {  // the other CTAs' rows of X[:, j] into this CTA's copy
    constexpr int PER_ROW = LB / 8;
    for (int i = threadIdx.x; i < (C - 1) * ROWS * PER_ROW; i += THREADS) {
      const int q = (r + 1 + i / (ROWS * PER_ROW)) % C, rr = (i / PER_ROW) % ROWS, c = (i % PER_ROW) * 8;
      const int row = q * ROWS + rr;
      *reinterpret_cast<uint4*>(sX + row * LDX + c) =
          *reinterpret_cast<const uint4*>(cluster.map_shared_rank(sX, q) + row * LDX + c);
    }
  }
  // peers may still read this CTA's rows of X: arrive when done reading theirs, wait before exiting
  if (!direct) cluster.barrier_arrive();
  __pipeline_wait_prior(0);  // a's rows
  __syncthreads();
  if (stop == 2) {  // timing variant: everything but phase 2 and the store of out
    out[(size_t)row0 * L + col0 + threadIdx.x % LB] = sX[threadIdx.x];
    cluster.barrier_wait();
    return;
  }

  {  // phase 2: out[rows, j] = a[rows] @ X[:, j]
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[PW2];
    if (direct)
      warp_product<LB / 16, PW2>(acc, sA, LDA, [&](int k) {
        return static_cast<const half*>(cluster.map_shared_rank(sX, k / ROWS)) + k * LDX; }, LDX, KX, warp, T2);
    else
      warp_product<LB / 16, PW2>(acc, sA, LDA, [&](int k) { return static_cast<const half*>(sX) + k * LDX; }, LDX,
                                 KX, warp, T2);
    if (direct) cluster.barrier_arrive();  // this CTA reads no peer any more
    warp_store<PW2>(acc, sP, LDP, LB / 16, warp, T2);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < RM * LB / 8; i += THREADS) {  // fp32 staging -> fp16 out, 16 bytes a store
    const int row = (i * 8) / LB, col = (i * 8) % LB;
    const float* p = sP + row * LDP + col;
    uint4 v;
    half2* h = reinterpret_cast<half2*>(&v);
    for (int e = 0; e < 4; ++e) h[e] = __floats2half2_rn(p[2 * e], p[2 * e + 1]);
    *reinterpret_cast<uint4*>(out + (size_t)(row0 + row) * L + col0 + col) = v;
  }
  cluster.barrier_wait();
}

// Launch with C CTAs per cluster: (L / LB) x M / (C * RM) clusters. Returns the CUDA error, 0 on success.
template <int C, int RM, int NS, int KX, int LB>
cudaError_t launch(const half* a, const half* b, const half* d, half* out, int M, int N, int L, int stop,
                   cudaStream_t stream) {
  auto kernel = chain_cluster<C, RM, NS, KX, LB>;
  constexpr int bytes = smem_bytes(NS, RM, KX, LB);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && C > 8)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((L / LB) * (M / RM));
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = C;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, a, b, d, out, M, N, L, stop);
}

// The configurations built: (C, RM, N / C, KX, LB). G7-G9: KX 128, N 512, L 128; G10: N 1024; G4: KX 256,
// N 512, L 256; G5: KX 512. Each fits the H100's 227 KB of shared memory per CTA.
#define CONFIGS(X) \
  X(8, 64, 64, 128, 128) X(8, 32, 64, 128, 128) X(16, 32, 32, 128, 128) X(16, 16, 32, 128, 128) \
  X(8, 64, 128, 128, 128) X(8, 32, 128, 128, 128) X(16, 32, 64, 128, 128) X(16, 16, 64, 128, 128) \
  X(8, 64, 64, 256, 64) X(8, 32, 64, 256, 32) X(16, 32, 32, 256, 64) \
  X(16, 32, 32, 512, 32) X(8, 32, 64, 512, 32)

cudaError_t run_config(int c, int rm, int lb, const half* a, const half* b, const half* d, half* out, int M, int K,
                       int N, int L, int stop, cudaStream_t stream) {
#define DISPATCH(C_, RM_, NS_, KX_, LB_)                                                \
  if (c == C_ && rm == RM_ && N / c == NS_ && K == KX_ && lb == LB_)                   \
    return launch<C_, RM_, NS_, KX_, LB_>(a, b, d, out, M, N, L, stop, stream);
  CONFIGS(DISPATCH)
#undef DISPATCH
  return cudaErrorInvalidValue;
}

#ifdef TORCH_EXTENSION_NAME
// `lb`: the columns of X each cluster owns; `stop`: 0 the whole chain, 1 phase 1 only, 2 all but phase 2,
// 3 the launch only, 4 the launch and the staging of b and d (timing variants that leave stages out), 5 the
// whole chain reading X from the peers in phase 2 (no gather); `stream`: torch.cuda.current_stream().cuda_stream (passed in, so
// no CUDA header of torch's is needed).
void chain(torch::Tensor a, torch::Tensor b, torch::Tensor d, torch::Tensor out, int64_t c, int64_t rm, int64_t lb,
           int64_t stop, int64_t stream) {
  const int M = a.size(0), K = a.size(1), N = b.size(1), L = d.size(1);
  TORCH_CHECK(b.size(0) == K && d.size(0) == N && out.size(0) == M && out.size(1) == L,
              "shapes: a [M, K], b [K, N], d [N, L], out [M, L]");
  TORCH_CHECK(N % c == 0 && M % (c * rm) == 0 && L % lb == 0, "N must split in C slices, M in C * RM rows, L in LB");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && d.is_contiguous() && out.is_contiguous(), "contiguous");
  const cudaError_t err = run_config(c, rm, lb, reinterpret_cast<const half*>(a.data_ptr<at::Half>()),
                                     reinterpret_cast<const half*>(b.data_ptr<at::Half>()),
                                     reinterpret_cast<const half*>(d.data_ptr<at::Half>()),
                                     reinterpret_cast<half*>(out.data_ptr<at::Half>()), M, K, N, L, stop,
                                     reinterpret_cast<cudaStream_t>(stream));
  TORCH_CHECK(err == cudaSuccess, "chain_cluster (C=", c, ", RM=", rm, ", LB=", lb, ", K=", K, ", N=", N, "): ",
              cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("chain", &chain, "out = a @ (b @ d) in one cluster kernel"); }
#endif
