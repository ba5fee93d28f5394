// Device probe (issue 15): the regrouped GEMM chain out = a @ (b @ d) as ONE kernel of thread-block
// clusters that share the intermediate through distributed shared memory (Hopper), fp16 operands,
// fp32 accumulation, X = b @ d rounded to fp16 as a two-kernel plan stores it.
//
// Why. Two dependent Triton GEMMs cost at least about 4.1 us on the H100 (session 39's floor probe),
// over the fp16 targets of G4-G10 (3.7-4.8 us). Every one-kernel form tried so far paid global
// round trips (counters, partial sums in L2). Inside a cluster the CTAs can exchange tiles and wait
// for each other through their shared memory, with no L2 round trip and no second launch.
//
// Form (a [M, K], b [K, N], d [N, L], out [M, L]; K = L = 128, so X is 128 x 128):
// - each cluster of C CTAs computes all of X; CTA r multiplies the r-th slice of N
//   (b[:, slice] @ d[slice, :], N / C wide) into a float32 partial of X in its shared memory;
// - cluster barrier; CTA r sums rows [r * 128 / C, (r + 1) * 128 / C) of the C partials, in rank order
//   (the same bits on every run), reading its peers' shared memory, and rounds them to fp16;
// - cluster barrier; each CTA copies the other CTAs' rows of X into its own shared memory;
// - each CTA computes RM rows of out = a[rows] @ X and stores them; the clusters split M.
// Products use WMMA (mma.sync); operands are staged in shared memory with 16-byte loads.
//
// Built and run by scripts/cluster_chain_probe.py (torch.utils.cpp_extension.load; nvcc -arch=sm_90a).
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <mma.h>

#ifdef TORCH_EXTENSION_NAME
#include <torch/extension.h>
#endif

namespace cg = cooperative_groups;
using namespace nvcuda;

constexpr int KX = 128;     // rows of X (the chain's K)
constexpr int LX = 128;     // columns of X and of out (the chain's L)
constexpr int THREADS = 256;  // 8 warps
constexpr int PAD_H = 8;    // halves of padding per shared row (16 bytes: no bank conflicts, WMMA ld % 8 == 0)
constexpr int PAD_F = 4;    // floats of padding per shared float row

// Shared memory (bytes) of one CTA for a slice of NS columns of b and RM rows of out.
__host__ __device__ constexpr int smem_bytes(int NS, int RM) {
  return 2 * (KX * (NS + PAD_H) + NS * (LX + PAD_H) + KX * (LX + PAD_H) + RM * (KX + PAD_H))
       + 4 * (KX * (LX + PAD_F));
}

// rows x cols halves from global (row stride gld) into shared (row stride sld), 16 bytes at a time.
__device__ inline void stage(half* s, int sld, const half* g, int gld, int rows, int cols) {
  const int per_row = cols / 8;
  for (int i = threadIdx.x; i < rows * per_row; i += THREADS) {
    const int r = i / per_row, c = (i % per_row) * 8;
    *reinterpret_cast<uint4*>(s + r * sld + c) = *reinterpret_cast<const uint4*>(g + (size_t)r * gld + c);
  }
}

template <int C, int RM, int NS>
__global__ void __launch_bounds__(THREADS) chain_cluster(const half* __restrict__ a, const half* __restrict__ b,
                                                         const half* __restrict__ d, half* __restrict__ out, int N,
                                                         int stop) {
  static_assert(KX % C == 0 && (KX / C) * LX % (4 * THREADS) == 0, "X's rows split evenly, float4 per thread");
  static_assert(NS % 16 == 0 && RM % 16 == 0 && (RM / 16) * (LX / 16) % 8 == 0, "whole WMMA tiles per warp");
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LB = NS + PAD_H, LD = LX + PAD_H, LXH = LX + PAD_H, LA = KX + PAD_H, LP = LX + PAD_F;
  half* sB = reinterpret_cast<half*>(smem);  // b[:, slice]   KX x NS
  half* sD = sB + KX * LB;                   // d[slice, :]   NS x LX
  half* sX = sD + NS * LD;                   // X             KX x LX (fp16)
  half* sA = sX + KX * LXH;                  // a[rows, :]    RM x KX
  float* sP = reinterpret_cast<float*>(sA + RM * LA);  // partial X (fp32), later out's staging

  cg::cluster_group cluster = cg::this_cluster();
  const int r = static_cast<int>(cluster.block_rank());
  const int row0 = (blockIdx.x / C) * (C * RM) + r * RM;  // this CTA's rows of out
  const int warp = threadIdx.x / 32;

  stage(sB, LB, b + r * NS, N, KX, NS);
  stage(sD, LD, d + (size_t)r * NS * LX, LX, NS, LX);
  stage(sA, LA, a + (size_t)row0 * KX, KX, RM, KX);
  __syncthreads();

  {  // phase 1: the partial X of this slice; warp w owns X's tile row w (16 rows), all 8 tile columns
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[LX / 16];
    for (int j = 0; j < LX / 16; ++j) wmma::fill_fragment(acc[j], 0.0f);
    for (int k = 0; k < NS; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
      wmma::load_matrix_sync(fa, sB + warp * 16 * LB + k, LB);
      for (int j = 0; j < LX / 16; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb;
        wmma::load_matrix_sync(fb, sD + k * LD + j * 16, LD);
        wmma::mma_sync(acc[j], fa, fb, acc[j]);
      }
    }
    for (int j = 0; j < LX / 16; ++j)
      wmma::store_matrix_sync(sP + warp * 16 * LP + j * 16, acc[j], LP, wmma::mem_row_major);
  }
  if (stop == 1) {  // timing variant: phase 1 alone (one value kept live)
    __syncthreads();
    out[(size_t)row0 * LX + threadIdx.x] = __float2half(sP[threadIdx.x]);
    return;
  }
  cluster.sync();  // every partial is in its CTA's shared memory

  {  // this CTA's rows of X: the partials summed in rank order, rounded to fp16
    constexpr int ROWS = KX / C;
    for (int i = threadIdx.x; i < ROWS * LX / 4; i += THREADS) {
      const int row = r * ROWS + (i * 4) / LX, col = (i * 4) % LX;
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int q = 0; q < C; ++q) {
        const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(sP, q) + row * LP + col);
        s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
      }
      half2* x = reinterpret_cast<half2*>(sX + row * LXH + col);
      x[0] = __floats2half2_rn(s.x, s.y);
      x[1] = __floats2half2_rn(s.z, s.w);
    }
  }
  cluster.sync();  // every CTA's rows of X are done, and no one reads a partial any more

  {  // the other CTAs' rows of X into this CTA's copy
    constexpr int ROWS = KX / C, PER_ROW = LX / 8;
    for (int i = threadIdx.x; i < (C - 1) * ROWS * PER_ROW; i += THREADS) {
      const int q = (r + 1 + i / (ROWS * PER_ROW)) % C, rr = (i / PER_ROW) % ROWS, c = (i % PER_ROW) * 8;
      const int row = q * ROWS + rr;
      *reinterpret_cast<uint4*>(sX + row * LXH + c) =
          *reinterpret_cast<const uint4*>(cluster.map_shared_rank(sX, q) + row * LXH + c);
    }
  }
  cluster.barrier_arrive();  // peers may still read this CTA's rows of X: wait for them before exiting
  __syncthreads();
  if (stop == 2) {  // timing variant: everything but phase 2 and the store of out
    out[(size_t)row0 * LX + threadIdx.x] = sX[threadIdx.x];
    cluster.barrier_wait();
    return;
  }

  {  // phase 2: out[rows] = a[rows] @ X; warp w owns PER_WARP consecutive 16 x 16 tiles (row-major order)
    constexpr int TILES = (RM / 16) * (LX / 16), PER_WARP = TILES / 8;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[PER_WARP];
    for (int t = 0; t < PER_WARP; ++t) wmma::fill_fragment(acc[t], 0.0f);
    for (int k = 0; k < KX; k += 16) {
      for (int t = 0; t < PER_WARP; ++t) {
        const int tile = warp * PER_WARP + t, tr = tile / (LX / 16), tc = tile % (LX / 16);
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, sA + tr * 16 * LA + k, LA);
        wmma::load_matrix_sync(fb, sX + k * LXH + tc * 16, LXH);
        wmma::mma_sync(acc[t], fa, fb, acc[t]);
      }
    }
    for (int t = 0; t < PER_WARP; ++t) {
      const int tile = warp * PER_WARP + t, tr = tile / (LX / 16), tc = tile % (LX / 16);
      wmma::store_matrix_sync(sP + tr * 16 * LP + tc * 16, acc[t], LP, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < RM * LX / 8; i += THREADS) {  // fp32 staging -> fp16 out, 16 bytes a store
    const int row = (i * 8) / LX, col = (i * 8) % LX;
    const float* p = sP + row * LP + col;
    uint4 v;
    half2* h = reinterpret_cast<half2*>(&v);
    for (int e = 0; e < 4; ++e) h[e] = __floats2half2_rn(p[2 * e], p[2 * e + 1]);
    *reinterpret_cast<uint4*>(out + (size_t)(row0 + row) * LX + col) = v;
  }
  cluster.barrier_wait();
}

// Launch with C CTAs per cluster; M / (C * RM) clusters. Returns the CUDA error, 0 on success.
template <int C, int RM, int NS>
cudaError_t launch(const half* a, const half* b, const half* d, half* out, int M, int N, int stop,
                   cudaStream_t stream) {
  auto kernel = chain_cluster<C, RM, NS>;
  constexpr int bytes = smem_bytes(NS, RM);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && C > 8)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(M / RM);
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
  return cudaLaunchKernelEx(&cfg, kernel, a, b, d, out, N, stop);
}

// The configurations built: (C, RM, N / C). N = 512 (G7-G9) and 1024 (G10).
#define CONFIGS(X) \
  X(8, 64, 64) X(16, 32, 32) X(8, 64, 128) X(16, 32, 64) X(8, 32, 64) X(8, 32, 128) X(16, 16, 32) X(16, 16, 64)

cudaError_t run_config(int c, int rm, int ns, const half* a, const half* b, const half* d, half* out, int M, int N,
                       int stop, cudaStream_t stream) {
#define DISPATCH(C_, RM_, NS_) \
  if (c == C_ && rm == RM_ && ns == NS_) return launch<C_, RM_, NS_>(a, b, d, out, M, N, stop, stream);
  CONFIGS(DISPATCH)
#undef DISPATCH
  return cudaErrorInvalidValue;
}

#ifdef TORCH_EXTENSION_NAME
// `stream`: torch.cuda.current_stream().cuda_stream (passed in, so no CUDA header of torch's is needed).
// `stop`: 0 the whole chain; 1 phase 1 only; 2 all but phase 2 (timing variants that leave stages out).
void chain(torch::Tensor a, torch::Tensor b, torch::Tensor d, torch::Tensor out, int64_t c, int64_t rm, int64_t stop,
           int64_t stream) {
  const int M = a.size(0), N = b.size(1);
  TORCH_CHECK(a.size(1) == KX && b.size(0) == KX && d.size(0) == N && d.size(1) == LX && out.size(0) == M,
              "shapes: a [M, 128], b [128, N], d [N, 128], out [M, 128]");
  TORCH_CHECK(N % c == 0 && M % (c * rm) == 0, "N must split in C slices and M in C * RM rows");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && d.is_contiguous() && out.is_contiguous(), "contiguous");
  const cudaError_t err = run_config(c, rm, N / c, reinterpret_cast<const half*>(a.data_ptr<at::Half>()),
                                     reinterpret_cast<const half*>(b.data_ptr<at::Half>()),
                                     reinterpret_cast<const half*>(d.data_ptr<at::Half>()),
                                     reinterpret_cast<half*>(out.data_ptr<at::Half>()), M, N, stop,
                                     reinterpret_cast<cudaStream_t>(stream));
  TORCH_CHECK(err == cudaSuccess, "chain_cluster (C=", c, ", RM=", rm, ", NS=", N / c, "): ", cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("chain", &chain, "out = a @ (b @ d) in one cluster kernel"); }
#endif
