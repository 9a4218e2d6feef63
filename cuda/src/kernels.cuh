// Private kernels of libseqpack_cuda: a tiled SIMT GEMM, the cells' element-wise
// forward and backward steps, and small copies. Every kernel takes int64 sizes
// and loops grid-stride, so any row count fits one launch.
#pragma once

#include "cuda_compat.cuh"

#include <cstdint>

#include "seqpack/detail/gate_math.h"

namespace seqpack::cuda {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// The activations gate_math's formulas (seqpack/detail/gate_math.h, shared
// with the CPU's scalar kernels) take on the GPU.
struct DeviceMath {
  __host__ __device__ static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
  __host__ __device__ static float tanh(float x) { return tanhf(x); }
};

// ---------------------------------------------------------------------------
// GEMM: C[m][n] = sum_k A(m,k) B(k,n) + bias[n] (+ C[m][n] when accumulate),
// with A(m,k) = trans_a ? A[k*lda + m] : A[m*lda + k] and
//      B(k,n) = trans_b ? B[n*ldb + k] : B[k*ldb + n],
// accumulated in float32. A Tile x Tile block of C per 256-thread block
// (Tile = 64 or 32), (Tile/16)^2 per thread (rows ty + 16 i, columns
// tx + 16 j), K in slices of 16 through shared memory. The smaller tile gives
// more blocks when the product is small (one step's rows).
constexpr int kTileK = 16;
constexpr int kGemmThreads = 256;

template <int Tile, typename TA, typename TB, typename TC>
__global__ void __launch_bounds__(kGemmThreads)
    gemm_kernel(int64_t M, int64_t N, int64_t K, const TA* __restrict__ A, int64_t lda,
                bool trans_a, const TB* __restrict__ B, int64_t ldb, bool trans_b,
                const TB* __restrict__ bias, TC* __restrict__ C, int64_t ldc, bool accumulate) {
  static_assert(Tile % 16 == 0 && Tile * kTileK % kGemmThreads == 0, "tile");
  constexpr int kPer = Tile / 16;                       // outputs per thread and dimension
  constexpr int kLoads = Tile * kTileK / kGemmThreads;  // elements per thread and operand
  __shared__ float As[kTileK][Tile + 1];
  __shared__ float Bs[kTileK][Tile + 1];
  const int tid = threadIdx.x;
  const int tx = tid % 16;
  const int ty = tid / 16;
  // Row tiles along x (up to 2^31 - 1 of them), column tiles along y.
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * Tile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * Tile;
  float acc[kPer][kPer] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    // Tile x 16 elements of each operand; the faster index runs along the
    // operand's contiguous dimension.
#pragma unroll
    for (int r = 0; r < kLoads; ++r) {
      const int e = tid + r * kGemmThreads;
      int mm, kk;
      if (trans_a) {
        mm = e % Tile;
        kk = e / Tile;
      } else {
        kk = e % kTileK;
        mm = e / kTileK;
      }
      const int64_t m = m0 + mm;
      const int64_t k = k0 + kk;
      float v = 0.0f;
      if (m < M && k < K) v = to_f32(trans_a ? A[k * lda + m] : A[m * lda + k]);
      As[kk][mm] = v;
    }
#pragma unroll
    for (int r = 0; r < kLoads; ++r) {
      const int e = tid + r * kGemmThreads;
      int nn, kk;
      if (trans_b) {
        kk = e % kTileK;
        nn = e / kTileK;
      } else {
        nn = e % Tile;
        kk = e / Tile;
      }
      const int64_t n = n0 + nn;
      const int64_t k = k0 + kk;
      float v = 0.0f;
      if (n < N && k < K) v = to_f32(trans_b ? B[n * ldb + k] : B[k * ldb + n]);
      Bs[kk][nn] = v;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[kPer], b[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < kPer; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < kPer; ++i)
#pragma unroll
        for (int j = 0; j < kPer; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t m = m0 + ty + 16 * i;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t n = n0 + tx + 16 * j;
      if (n >= N) continue;
      float v = acc[i][j];
      if (bias != nullptr) v += to_f32(bias[n]);
      TC* c = C + m * ldc + n;
      if (accumulate) v += to_f32(*c);
      *c = from_f32<TC>(v);
    }
  }
}

// ---------------------------------------------------------------------------
// The same product on tensor cores (SEQPACK_CUDA_GEMM_WMMA, bfloat16 and
// float16 data): operands are converted to T (the data type) on their way
// into shared memory, wmma 16x16x16 fragments accumulate in float32, and the
// float32 tile goes back through shared memory to the same epilogue as above.
// A 64x64 tile of C per 128-thread block: warp w computes rows
// 32 (w / 2) .. + 32 and columns 32 (w % 2) .. + 32 as 2 x 2 fragments.
constexpr int kWmmaThreads = 128;
constexpr int kWmmaTile = 64;
constexpr int kWmmaK = 16;
constexpr int kWmmaPadA = kWmmaK + 8;     // row strides that keep each fragment's
constexpr int kWmmaPadB = kWmmaTile + 8;  // start 32-byte aligned and spread banks
constexpr int kWmmaPadC = kWmmaTile + 4;

template <typename T, typename TA, typename TB, typename TC>
__global__ void __launch_bounds__(kWmmaThreads)
    gemm_wmma_kernel(int64_t M, int64_t N, int64_t K, const TA* __restrict__ A, int64_t lda,
                     bool trans_a, const TB* __restrict__ B, int64_t ldb, bool trans_b,
                     const TB* __restrict__ bias, TC* __restrict__ C, int64_t ldc,
                     bool accumulate) {
  namespace wmma = nvcuda::wmma;
  __shared__ __align__(32) T As[kWmmaTile][kWmmaPadA];  // m x k
  __shared__ __align__(32) T Bs[kWmmaK][kWmmaPadB];     // k x n
  __shared__ __align__(32) float Cs[kWmmaTile][kWmmaPadC];
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int wm = (warp / 2) * 32;
  const int wn = (warp % 2) * 32;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kWmmaTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kWmmaTile;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  constexpr int kLoads = kWmmaTile * kWmmaK / kWmmaThreads;  // 8 per operand
  for (int64_t k0 = 0; k0 < K; k0 += kWmmaK) {
#pragma unroll
    for (int r = 0; r < kLoads; ++r) {
      const int e = tid + r * kWmmaThreads;
      int mm, kk;
      if (trans_a) {
        mm = e % kWmmaTile;
        kk = e / kWmmaTile;
      } else {
        kk = e % kWmmaK;
        mm = e / kWmmaK;
      }
      const int64_t m = m0 + mm;
      const int64_t k = k0 + kk;
      float v = 0.0f;
      if (m < M && k < K) v = to_f32(trans_a ? A[k * lda + m] : A[m * lda + k]);
      As[mm][kk] = from_f32<T>(v);
    }
#pragma unroll
    for (int r = 0; r < kLoads; ++r) {
      const int e = tid + r * kWmmaThreads;
      int nn, kk;
      if (trans_b) {
        kk = e % kWmmaK;
        nn = e / kWmmaK;
      } else {
        nn = e % kWmmaTile;
        kk = e / kWmmaTile;
      }
      const int64_t n = n0 + nn;
      const int64_t k = k0 + kk;
      float v = 0.0f;
      if (n < N && k < K) v = to_f32(trans_b ? B[n * ldb + k] : B[k * ldb + n]);
      Bs[kk][nn] = from_f32<T>(v);
    }
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[2];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &As[wm + 16 * i][0], kWmmaPadA);
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &Bs[0][wn + 16 * j], kWmmaPadB);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&Cs[wm + 16 * i][wn + 16 * j], acc[i][j], kWmmaPadC,
                              wmma::mem_row_major);
  __syncthreads();
  for (int e = tid; e < kWmmaTile * kWmmaTile; e += kWmmaThreads) {
    const int mm = e / kWmmaTile, nn = e % kWmmaTile;
    const int64_t m = m0 + mm, n = n0 + nn;
    if (m >= M || n >= N) continue;
    float v = Cs[mm][nn];
    if (bias != nullptr) v += to_f32(bias[n]);
    TC* c = C + m * ldc + n;
    if (accumulate) v += to_f32(*c);
    *c = from_f32<TC>(v);
  }
}

// ---------------------------------------------------------------------------
// Element-wise helpers. `rows` x `cols` with leading dimensions.

template <typename TS, typename TD>
__global__ void convert_kernel(int64_t rows, int64_t cols, const TS* __restrict__ src, int64_t lds,
                               TD* __restrict__ dst, int64_t ldd) {
  const int64_t total = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / cols, c = e % cols;
    dst[r * ldd + c] = from_f32<TD>(to_f32(src[r * lds + c]));
  }
}

template <typename TD>
__global__ void fill_zero_kernel(int64_t n, TD* __restrict__ dst) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[e] = from_f32<TD>(0.0f);
}

// out[e] = a[e] * mask[e] (the dropout between layers); out may be a.
template <typename TA, typename TM, typename TO>
__global__ void mask_kernel(int64_t n, const TA* a, const TM* __restrict__ mask, TO* out) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[e] = from_f32<TO>(to_f32(a[e]) * to_f32(mask[e]));
}

// out[n] = sum over m < M of a[m*lda + n] (bias gradients). Blocks of 32 x 8
// threads: 32 columns, each summed by 8 threads over every 8th row, then
// added up in shared memory (the same order every run).
constexpr int kSumColumns = 32;
constexpr int kSumLanes = 8;

template <typename TO>
__global__ void column_sum_kernel(int64_t M, int64_t N, const float* __restrict__ a, int64_t lda,
                                  TO* __restrict__ out) {
  __shared__ float partial[kSumLanes][kSumColumns];
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kSumColumns + threadIdx.x;
  float s = 0.0f;
  if (n < N)
    for (int64_t m = threadIdx.y; m < M; m += kSumLanes) s += a[m * lda + n];
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && n < N) {
    float total = 0.0f;
    for (int l = 0; l < kSumLanes; ++l) total += partial[l][threadIdx.x];
    out[n] = from_f32<TO>(total);
  }
}

// ---------------------------------------------------------------------------
// The state a step starts from, for its `bs` rows: rows b < prev_rows continue
// the previous step's rows (h from the layer output y, c from the cell-state
// buffer), the others start from h0 / c0. Written into float32 buffers that
// the backward pass reuses.
template <typename T>
__global__ void gather_prev_kernel(int64_t bs, int64_t hout, int64_t hidden, int64_t prev_rows,
                                   const T* y_prev, int64_t ldy, const T* __restrict__ h0,
                                   float* __restrict__ hprev, const float* c_prev,
                                   const T* __restrict__ c0, float* __restrict__ cprev) {
  const int64_t cols = hout > hidden ? hout : hidden;
  const int64_t total = bs * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = e / cols, j = e % cols;
    if (j < hout)
      hprev[b * hout + j] = b < prev_rows ? to_f32(y_prev[b * ldy + j]) : to_f32(h0[b * hout + j]);
    if (cprev != nullptr && j < hidden)
      cprev[b * hidden + j] = b < prev_rows ? c_prev[b * hidden + j] : to_f32(c0[b * hidden + j]);
  }
}

// LSTM step, rows b < bs, units j < H; gates holds x W_ih^T + b_ih on entry and
// the activations i, f, g, o on exit:
//   c_t = f * c_{t-1} + i * g,  m_t = o * tanh(c_t),  h_t = m_t (or W_hr m_t)
// One element (b, j) of the step: shared by the one-launch-per-step kernel and
// the persistent kernel. The input's part of gate k is x[k xs] where x is
// given (a copy prefetched into shared memory), else gates' own.
template <typename T>
__device__ __forceinline__ void lstm_forward_element(int64_t b, int64_t j, int64_t H, float* gates,
                                                     const float* gh, const T* b_hh,
                                                     const float* cprev, float* c, float* m_out,
                                                     T* y, int64_t ldy, const float* x = nullptr,
                                                     int64_t xs = 0) {
  float* g = gates + b * 4 * H;
  const float* r = gh + b * 4 * H;
  if (x == nullptr) x = g + j, xs = H;
  float a[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    a[k] = x[k * xs] + r[k * H + j] + (b_hh != nullptr ? to_f32(b_hh[k * H + j]) : 0.0f);
  const auto st = gate_math::lstm_forward<DeviceMath>(a[0], a[1], a[2], a[3], cprev[b * H + j]);
  g[j] = st.i;
  g[H + j] = st.f;
  g[2 * H + j] = st.g;
  g[3 * H + j] = st.o;
  c[b * H + j] = st.c;
  if (m_out != nullptr)
    m_out[b * H + j] = st.h;
  else
    y[b * ldy + j] = from_f32<T>(st.h);
}

template <typename T>
__global__ void lstm_forward_kernel(int64_t bs, int64_t H, float* __restrict__ gates,
                                    const float* __restrict__ gh, const T* __restrict__ b_hh,
                                    const float* __restrict__ cprev, float* __restrict__ c,
                                    float* __restrict__ m_out, T* __restrict__ y, int64_t ldy) {
  const int64_t total = bs * H;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    lstm_forward_element<T>(e / H, e % H, H, gates, gh, b_hh, cprev, c, m_out, y, ldy);
}

// GRU step; gates holds x W_ih^T + b_ih on entry and r, z, n on exit:
//   r = sigma(.), z = sigma(.), hn = W_hn h + b_hn, n = tanh(x_n + r * hn),
//   h_t = (1 - z) * n + z * h_{t-1}
template <typename T>
__device__ __forceinline__ void gru_forward_element(int64_t b, int64_t j, int64_t H, float* gates,
                                                    const float* gh, const T* b_hh,
                                                    const float* hprev, float* ghn, T* y,
                                                    int64_t ldy, const float* x = nullptr,
                                                    int64_t xs = 0) {
  float* g = gates + b * 3 * H;
  const float* r = gh + b * 3 * H;
  if (x == nullptr) x = g + j, xs = H;
  float bh[3] = {0.0f, 0.0f, 0.0f};
  if (b_hh != nullptr) {
#pragma unroll
    for (int k = 0; k < 3; ++k) bh[k] = to_f32(b_hh[k * H + j]);
  }
  const float hn = r[2 * H + j] + bh[2];
  const auto st = gate_math::gru_forward<DeviceMath>(x[0] + r[j] + bh[0], x[xs] + r[H + j] + bh[1],
                                                     x[2 * xs], hn, hprev[b * H + j]);
  g[j] = st.r;
  g[H + j] = st.z;
  g[2 * H + j] = st.n;
  ghn[b * H + j] = hn;
  y[b * ldy + j] = from_f32<T>(st.h);
}

template <typename T>
__global__ void gru_forward_kernel(int64_t bs, int64_t H, float* __restrict__ gates,
                                   const float* __restrict__ gh, const T* __restrict__ b_hh,
                                   const float* __restrict__ hprev, float* __restrict__ ghn,
                                   T* __restrict__ y, int64_t ldy) {
  const int64_t total = bs * H;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    gru_forward_element<T>(e / H, e % H, H, gates, gh, b_hh, hprev, ghn, y, ldy);
}

// Elman step: h_t = act(x W_ih^T + b_ih + h W_hh^T + b_hh); gates keeps h_t.
template <typename T>
__device__ __forceinline__ void rnn_forward_element(int64_t b, int64_t j, int64_t H, bool relu,
                                                    float* gates, const float* gh, const T* b_hh,
                                                    T* y, int64_t ldy, const float* x = nullptr) {
  const float a = (x != nullptr ? *x : gates[b * H + j]) + gh[b * H + j] +
                  (b_hh != nullptr ? to_f32(b_hh[j]) : 0.0f);
  const float ht = gate_math::rnn_forward<DeviceMath>(a, relu);
  gates[b * H + j] = ht;
  y[b * ldy + j] = from_f32<T>(ht);
}

template <typename T>
__global__ void rnn_forward_kernel(int64_t bs, int64_t H, bool relu, float* __restrict__ gates,
                                   const float* __restrict__ gh, const T* __restrict__ b_hh,
                                   T* __restrict__ y, int64_t ldy) {
  const int64_t total = bs * H;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    rnn_forward_element<T>(e / H, e % H, H, relu, gates, gh, b_hh, y, ldy);
}

// ---------------------------------------------------------------------------
// The barrier of a one-launch kernel's blocks: a cluster's, or a cooperative
// grid's.
template <bool kCluster>
__device__ __forceinline__ void group_sync() {
  if constexpr (kCluster)
    cluster_sync();
  else
    grid_sync();
}

// How many of `n` things (hidden units, output columns) a block has whose
// share starts at `first`, `per` a block: per, or what is left, or none.
__device__ __forceinline__ int64_t share(int64_t first, int64_t per, int64_t n) {
  return first >= n ? 0 : (per < n - first ? per : n - first);
}

// The steps of a one-launch kernel in its processing order, and the packed row
// each starts at (the steps' rows are consecutive): from the first step, or
// from the last (a forward's reverse direction; a backward's forward one).
struct StepWalk {
  const int64_t* batch_sizes;
  int64_t steps;
  bool last_first;
  int64_t next = 0;  // the first row of the step after the last taken (from the first),
                     // or one past the last row of the step after it (from the last)
  __device__ StepWalk(const int64_t* bs, int64_t n, bool from_last)
      : batch_sizes(bs), steps(n), last_first(from_last) {
    for (int64_t t = 0; last_first && t < steps; ++t) next += batch_sizes[t];
  }
  // Step k of the order: its time index, rows and first row; without `advance`
  // only a look (the next step's, while the current one runs).
  __device__ void at(int64_t k, int64_t* t, int64_t* bs, int64_t* r0, bool advance = true) {
    *t = last_first ? steps - 1 - k : k;
    *bs = batch_sizes[*t];
    *r0 = last_first ? next - *bs : next;
    if (advance) next = last_first ? *r0 : *r0 + *bs;
  }
};

// The arguments of the persistent forward kernels (below): one layer and
// direction.
template <typename T>
struct PersistentArgs {
  int mode;
  bool reverse;
  int64_t steps;
  int64_t batch;  // rows of h0 (the cluster kernel's h buffers)
  bool shared_h;  // cluster kernel: h_{t-1} gathered in shared memory (else read from y)
  bool mma;       // cluster kernel with shared_h, H % 16 == 0, 16-bit T or TF32 allowed:
                  // tensor cores
  // Cluster kernel: where in its shared memory (bytes) the input gates are
  // prefetched a step ahead, two [batch][gates U] float buffers; 0: none.
  int64_t xg_offset;
  const int64_t* batch_sizes;  // device copy
  int64_t H;
  int64_t ldy;
  int64_t units;
  float* gates;  // the layer's gates buffer, row 0
  float* gh;     // batch x gates scratch
  const T* w_hh;
  const T* b_hh;
  const T* h0;
  const T* c0;
  T* y;  // the direction's first column of row 0
  float* hprev;
  float* c;
  float* cprev;
  float* ghn;
  T* hn;
  T* cn;
  // LSTM with a projection (projected_forward_steps): h = m W_hr^T has P
  // columns, cols of them a block's; m kept for the backward.
  int64_t P;
  int64_t cols;
  const T* w_hr;
  float* m;
};

constexpr int kPersistentThreads = 256;

__host__ __device__ constexpr int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

// The cluster forward kernel's shared memory with tensor cores (a.mma): W_hh's
// rows of the block's units as [H][R] (R = ng U rounded up to 16, the padding
// zero), the two h buffers [Bp][H] (Bp = the batch rounded up to 16), and a
// float [Bp][R] scratch for the product; every fragment starts 32-byte aligned
// because H is a multiple of 16.
template <typename T>
constexpr size_t cluster_mma_shared_bytes(int64_t ng, int64_t units, int64_t H, int64_t batch) {
  return static_cast<size_t>(H * round16(ng * units) + 2 * round16(batch) * H) * sizeof(T) +
         static_cast<size_t>(round16(batch) * round16(ng * units)) * sizeof(float);
}

// One step's h_{t-1} W_hh^T for the block's units on tensor cores: the rows
// [0, bs) of hg (16-row tiles; rows past bs are whatever the buffer holds and
// their results are dropped) times w ([H][R]), accumulated in float32, into
// scratch [rows][R]. The warps share the tiles. 16-bit data: 16 x 16 x 16
// products. float32 (with TF32 allowed): 3xTF32, 16 x 16 x 8 products of each
// operand split into a TF32 part and the TF32 of the rest, a_big b_big +
// a_big b_small + a_small b_big (the small parts' product, below float32's
// rounding, left out): float32's accuracy on tensor cores.
template <typename T>
__device__ __forceinline__ void cluster_step_mma(const T* hg, const T* w, float* scratch,
                                                 int64_t bs, int64_t H, int64_t R) {
  namespace wmma = nvcuda::wmma;
  const int64_t mt = (bs + 15) / 16, nt = R / 16;
  const int warp = static_cast<int>(threadIdx.x) / 32, warps = static_cast<int>(blockDim.x) / 32;
  for (int64_t tile = warp; tile < mt * nt; tile += warps) {
    const int64_t m = tile / nt, n = tile % nt;
    if constexpr (sizeof(T) == 2) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int64_t k = 0; k < H; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, hg + m * 16 * H + k, static_cast<unsigned>(H));
        wmma::load_matrix_sync(fb, w + k * R + n * 16, static_cast<unsigned>(R));
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(scratch + m * 16 * R + n * 16, acc, static_cast<unsigned>(R),
                              wmma::mem_row_major);
    } else {
      using tf32 = wmma::precision::tf32;
      wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int64_t k = 0; k < H; k += 8) {
        wmma::fragment<wmma::matrix_a, 16, 16, 8, tf32, wmma::row_major> a_big, a_small;
        wmma::fragment<wmma::matrix_b, 16, 16, 8, tf32, wmma::row_major> b_big, b_small;
        wmma::load_matrix_sync(a_big, hg + m * 16 * H + k, static_cast<unsigned>(H));
        wmma::load_matrix_sync(b_big, w + k * R + n * 16, static_cast<unsigned>(R));
#pragma unroll
        for (int i = 0; i < a_big.num_elements; ++i) {
          const float v = a_big.x[i], big = wmma::__float_to_tf32(v);
          a_big.x[i] = big;
          a_small.x[i] = wmma::__float_to_tf32(v - big);
        }
#pragma unroll
        for (int i = 0; i < b_big.num_elements; ++i) {
          const float v = b_big.x[i], big = wmma::__float_to_tf32(v);
          b_big.x[i] = big;
          b_small.x[i] = wmma::__float_to_tf32(v - big);
        }
        wmma::mma_sync(acc, a_small, b_big, acc);
        wmma::mma_sync(acc, a_big, b_small, acc);
        wmma::mma_sync(acc, a_big, b_big, acc);
      }
      wmma::store_matrix_sync(scratch + m * 16 * R + n * 16, acc, static_cast<unsigned>(R),
                              wmma::mem_row_major);
    }
  }
}

// Step rows [r0, r0 + bs)'s input gates (x W_ih^T + b_ih) of units
// [j0, j0 + U) into dst [b][g U + u], as one group of asynchronous copies.
__device__ __forceinline__ void prefetch_gates(float* dst, const float* gates, int64_t r0,
                                               int64_t bs, int ng, int64_t H, int64_t j0,
                                               int64_t U) {
  const int64_t per = ng * U;
  for (int64_t e = threadIdx.x; e < bs * per; e += blockDim.x) {
    const int64_t b = e / per, r = e % per;
    copy_async(dst + e, gates + (r0 + b) * ng * H + (r / U) * H + j0 + r % U);
  }
  copy_async_commit();
}

// The body of both persistent forward kernels below. Block r owns the hidden
// units [r U, r U + U) (r: the block's index in the grid, or its rank in the
// cluster) and keeps their rows of W_hh (every gate) in shared memory for the
// whole sequence; per step it computes its units' part of h_{t-1} W_hh^T for
// the step's rows, the cell, and the rows that end, then the grid's or the
// cluster's barrier. Rows are batch rows: a step's rows continue the rows of
// the step processed before it (the forward's are a prefix of the step
// before; the reverse's rows beyond the step after start from h0). h_{t-1}
// of the rows that continue comes from the previous step's y in global
// memory, or, in a cluster with a.shared_h, from the block's own shared
// memory, into which every block writes its units of h_t (distributed shared
// memory: the all-gather; h alternates between two buffers, so that a block
// writes step k's h into the buffer its peers read at step k - 1, which all
// of them finished before that step's barrier). Writes the same reserve as
// the per-step kernels, so the backward pass is shared.
template <typename T, bool kCluster>
__device__ __forceinline__ void persistent_forward_steps(const PersistentArgs<T>& a,
                                                         unsigned rank) {
  const bool lstm = a.mode == 0, gru = a.mode == 1;
  const int ng = lstm ? 4 : gru ? 3 : 1;
  const int64_t H = a.H, G = ng * H, B = a.batch;
  const int64_t j0 = static_cast<int64_t>(rank) * a.units;
  const int64_t U = share(j0, a.units, H);
  const bool shared_h = kCluster && a.shared_h;
  const bool mma = kCluster && a.mma;
  // w[p R + g U + u] = W_hh[g H + j0 + u][p], R = gates U (with tensor cores
  // rounded up to 16, the padding zero): consecutive units (consecutive
  // threads) read consecutive words. Then the h buffers, [Bp][H] (Bp = B, or
  // rounded up to 16 with tensor cores), then their float scratch [Bp][R].
  const int64_t R = mma ? round16(ng * a.units) : ng * U;
  const int64_t Bp = mma ? round16(B) : B;
  T* w = dynamic_shared<T>();
  T* hbuf[2] = {w + (mma ? R : ng * a.units) * H, w + (mma ? R : ng * a.units) * H + Bp * H};
  float* scratch = reinterpret_cast<float*>(hbuf[1] + Bp * H);
  // The input gates of the step after the current one are fetched while the
  // current one's product runs (a.xg_offset: the cluster kernel, where the
  // buffers fit).
  float* xg[2] = {nullptr, nullptr};
  if (kCluster && a.xg_offset > 0) {
    xg[0] = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(w) + a.xg_offset);
    xg[1] = xg[0] + B * ng * a.units;
  }
  for (int64_t e = threadIdx.x; e < R * H; e += blockDim.x) {
    const int64_t row = e / H, p = e % H;
    const int64_t g = row / (U > 0 ? U : 1), u = row % (U > 0 ? U : 1);
    w[p * R + row] = row < ng * U ? a.w_hh[(g * H + j0 + u) * H + p] : from_f32<T>(0.0f);
  }
  __syncthreads();
  StepWalk walk(a.batch_sizes, a.steps, a.reverse);
  // Row offset of the step before in processing order.
  int64_t prev_off = 0;
  if (xg[0] != nullptr && a.steps > 0) {
    int64_t t, bs, r0;
    walk.at(0, &t, &bs, &r0, false);
    prefetch_gates(xg[0], a.gates, r0, bs, ng, H, j0, U);
  }
  for (int64_t k = 0; k < a.steps; ++k) {
    int64_t t, bs, r0;
    walk.at(k, &t, &bs, &r0);
    const int64_t prev_rows = k == 0 ? 0 : (a.reverse ? a.batch_sizes[t + 1] : bs);
    const bool fetch_next = xg[0] != nullptr && k + 1 < a.steps;
    if (fetch_next) {  // into the buffer the step before read (done: its barrier)
      int64_t t1, bs1, r1;
      walk.at(k + 1, &t1, &bs1, &r1, false);
      prefetch_gates(xg[(k + 1) & 1], a.gates, r1, bs1, ng, H, j0, U);
    }
    T* hg = hbuf[k & 1];
    T* hnext = hbuf[(k + 1) & 1];
    if (mma) {
      // The rows that start here take h0 into the buffer (no peer writes it
      // this step), then the product on tensor cores.
      for (int64_t e = threadIdx.x; e < (bs - prev_rows) * H; e += blockDim.x)
        hg[prev_rows * H + e] = a.h0[prev_rows * H + e];
      __syncthreads();
      cluster_step_mma<T>(hg, w, scratch, bs, H, R);
      __syncthreads();
    }
    for (int64_t e = threadIdx.x; e < bs * U; e += blockDim.x) {
      const int64_t b = e / U, u = e % U, j = j0 + u;
      const T* h = mma || (b < prev_rows && shared_h) ? hg + b * H
                   : b >= prev_rows                   ? a.h0 + b * H
                                                      : a.y + (prev_off + b) * a.ldy;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (mma) {
#pragma unroll
        for (int g = 0; g < 4; ++g)
          if (g < ng) acc[g] = scratch[b * R + g * U + u];
      } else {
        for (int64_t p = 0; p < H; ++p) {
          const float hv = to_f32(h[p]);
          const T* wp = w + p * R + u;
#pragma unroll
          for (int g = 0; g < 4; ++g)
            if (g < ng) acc[g] += hv * to_f32(wp[g * U]);
        }
      }
#pragma unroll
      for (int g = 0; g < 4; ++g)
        if (g < ng) a.gh[b * G + g * H + j] = acc[g];
      a.hprev[(r0 + b) * H + j] = to_f32(h[j]);
      if (lstm)
        a.cprev[(r0 + b) * H + j] =
            b < prev_rows ? a.c[(prev_off + b) * H + j] : to_f32(a.c0[b * H + j]);
    }
    // This step's input gates landed (the thread's own copies; the barrier
    // makes them the block's).
    if (fetch_next)
      copy_async_wait_all_but_newest();
    else if (xg[0] != nullptr)
      copy_async_wait_all();
    __syncthreads();
    for (int64_t e = threadIdx.x; e < bs * U; e += blockDim.x) {
      const int64_t b = e / U, u = e % U, j = j0 + u;
      float* gates = a.gates + r0 * G;
      T* y = a.y + r0 * a.ldy;
      const float* x = xg[0] != nullptr ? xg[k & 1] + b * ng * U + u : nullptr;
      if (lstm)
        lstm_forward_element<T>(b, j, H, gates, a.gh, a.b_hh, a.cprev + r0 * H, a.c + r0 * H,
                                nullptr, y, a.ldy, x, U);
      else if (gru)
        gru_forward_element<T>(b, j, H, gates, a.gh, a.b_hh, a.hprev + r0 * H, a.ghn + r0 * H, y,
                               a.ldy, x, U);
      else
        rnn_forward_element<T>(b, j, H, a.mode == 3, gates, a.gh, a.b_hh, y, a.ldy, x);
      if constexpr (kCluster) {
        if (shared_h) {  // h_t of this unit to every block of the cluster
          const T v = y[b * a.ldy + j];
          for (unsigned q = 0; q < cluster_blocks(); ++q) peer_shared(hnext, q)[b * H + j] = v;
        }
      }
    }
    __syncthreads();
    // Rows whose sequence ends here (as in forward() of rnn.cu).
    const int64_t lo = a.reverse ? (t == 0 ? 0 : bs) : (t + 1 < a.steps ? a.batch_sizes[t + 1] : 0);
    for (int64_t e = threadIdx.x; e < (bs - lo) * U; e += blockDim.x) {
      const int64_t b = lo + e / U, j = j0 + e % U;
      a.hn[b * H + j] = a.y[(r0 + b) * a.ldy + j];
      if (lstm) a.cn[b * H + j] = from_f32<T>(a.c[(r0 + b) * H + j]);
    }
    prev_off = r0;
    group_sync<kCluster>();
  }
}

// The one-launch forward of an LSTM with a projection (h = m W_hr^T, P
// columns): block r owns hidden units [r U, r U + U) (the cell; W_hh's rows
// of them, every gate) and output columns [r V, r V + V) (W_hr's rows of
// them), both kept in its shared memory for the whole sequence. h and m pass
// through global memory: per step the block's units' part of h_{t-1} W_hh^T
// and their cell (m to the reserve), the barrier, its columns of h_t = m
// W_hr^T (y) and the rows that end, the barrier. Writes the per-step
// kernels' reserve (hprev P wide, m), so the backward pass is shared.
template <typename T, bool kCluster>
__device__ __forceinline__ void projected_forward_steps(const PersistentArgs<T>& a, unsigned rank) {
  const int64_t H = a.H, P = a.P, G = 4 * H;
  const int64_t j0 = static_cast<int64_t>(rank) * a.units, q0 = static_cast<int64_t>(rank) * a.cols;
  const int64_t U = share(j0, a.units, H);
  const int64_t V = share(q0, a.cols, P);
  // w[p R + g U + u] = W_hh[g H + j0 + u][p] (R = 4 U), then
  // wr[k V + v] = W_hr[q0 + v][k].
  const int64_t R = 4 * U;
  T* w = dynamic_shared<T>();
  T* wr = w + 4 * a.units * P;
  for (int64_t e = threadIdx.x; e < R * P; e += blockDim.x) {
    const int64_t row = e / P, p = e % P;
    w[p * R + row] = a.w_hh[((row / U) * H + j0 + row % U) * P + p];
  }
  for (int64_t e = threadIdx.x; e < V * H; e += blockDim.x) {
    const int64_t v = e / H, k = e % H;
    wr[k * V + v] = a.w_hr[(q0 + v) * H + k];
  }
  __syncthreads();
  StepWalk walk(a.batch_sizes, a.steps, a.reverse);
  int64_t prev_off = 0;
  for (int64_t k = 0; k < a.steps; ++k) {
    int64_t t, bs, r0;
    walk.at(k, &t, &bs, &r0);
    const int64_t prev_rows = k == 0 ? 0 : (a.reverse ? a.batch_sizes[t + 1] : bs);
    for (int64_t e = threadIdx.x; e < bs * U; e += blockDim.x) {
      const int64_t b = e / U, u = e % U, j = j0 + u;
      const T* h = b >= prev_rows ? a.h0 + b * P : a.y + (prev_off + b) * a.ldy;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int64_t p = 0; p < P; ++p) {
        const float hv = to_f32(h[p]);
        const T* wp = w + p * R + u;
#pragma unroll
        for (int g = 0; g < 4; ++g) acc[g] += hv * to_f32(wp[g * U]);
      }
#pragma unroll
      for (int g = 0; g < 4; ++g) a.gh[b * G + g * H + j] = acc[g];
      a.cprev[(r0 + b) * H + j] =
          b < prev_rows ? a.c[(prev_off + b) * H + j] : to_f32(a.c0[b * H + j]);
    }
    for (int64_t e = threadIdx.x; e < bs * V; e += blockDim.x) {
      const int64_t b = e / V, q = q0 + e % V;
      const T* h = b >= prev_rows ? a.h0 + b * P : a.y + (prev_off + b) * a.ldy;
      a.hprev[(r0 + b) * P + q] = to_f32(h[q]);
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < bs * U; e += blockDim.x)
      lstm_forward_element<T>(e / U, j0 + e % U, H, a.gates + r0 * G, a.gh, a.b_hh,
                              a.cprev + r0 * H, a.c + r0 * H, a.m + r0 * H, nullptr, 0);
    group_sync<kCluster>();
    // h_t = m_t W_hr^T for the block's columns, then the rows that end.
    for (int64_t e = threadIdx.x; e < bs * V; e += blockDim.x) {
      const int64_t b = e / V, v = e % V;
      const float* m = a.m + (r0 + b) * H;
      float acc = 0.0f;
      for (int64_t i = 0; i < H; ++i) acc += m[i] * to_f32(wr[i * V + v]);
      a.y[(r0 + b) * a.ldy + q0 + v] = from_f32<T>(acc);
    }
    __syncthreads();
    const int64_t lo = a.reverse ? (t == 0 ? 0 : bs) : (t + 1 < a.steps ? a.batch_sizes[t + 1] : 0);
    for (int64_t e = threadIdx.x; e < (bs - lo) * V; e += blockDim.x) {
      const int64_t b = lo + e / V, q = q0 + e % V;
      a.hn[b * P + q] = a.y[(r0 + b) * a.ldy + q];
    }
    for (int64_t e = threadIdx.x; e < (bs - lo) * U; e += blockDim.x) {
      const int64_t b = lo + e / U, j = j0 + e % U;
      a.cn[b * H + j] = from_f32<T>(a.c[(r0 + b) * H + j]);
    }
    prev_off = r0;
    group_sync<kCluster>();
  }
}

// The parameter of the one-launch kernels: one layer's recurrence in one
// direction or in both at once. Direction d runs on blocks
// [d blocks, d blocks + blocks) of the grid (a cluster's blocks, or half a
// cooperative grid), the block of rank r there owning units [r U, r U + U).
template <typename A>
struct Directions {
  A dir[2];
  unsigned blocks;  // per direction
};

// SEQPACK_CUDA_KERNEL_PERSISTENT: one cooperative launch, ceil(H / U) blocks
// a direction all resident, the grid's barrier each step.
template <typename T, bool kProj>
__global__ void __launch_bounds__(kPersistentThreads)
    persistent_forward_kernel(Directions<PersistentArgs<T>> p) {
  if constexpr (kProj)
    projected_forward_steps<T, false>(p.dir[blockIdx.x / p.blocks], blockIdx.x % p.blocks);
  else
    persistent_forward_steps<T, false>(p.dir[blockIdx.x / p.blocks], blockIdx.x % p.blocks);
}

// SEQPACK_CUDA_KERNEL_CLUSTER (sm_90): a thread-block cluster a direction,
// its barrier each step, h_{t-1} gathered in the blocks' shared memory where
// it fits.
template <typename T, bool kProj>
__global__ void __launch_bounds__(kPersistentThreads)
    cluster_forward_kernel(Directions<PersistentArgs<T>> p) {
  if constexpr (kProj)
    projected_forward_steps<T, true>(p.dir[blockIdx.x / p.blocks], cluster_rank());
  else
    persistent_forward_steps<T, true>(p.dir[blockIdx.x / p.blocks], cluster_rank());
}

// Rows b in [lo, hi) end at this step: their h (from y) and c go to h_n, c_n.
template <typename T>
__global__ void finish_kernel(int64_t lo, int64_t hi, int64_t hout, int64_t hidden, const T* y,
                              int64_t ldy, T* __restrict__ hn, const float* __restrict__ c,
                              T* __restrict__ cn) {
  const int64_t cols = hout > hidden ? hout : hidden;
  const int64_t total = (hi - lo) * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = lo + e / cols, j = e % cols;
    if (j < hout) hn[b * hout + j] = y[b * ldy + j];
    if (cn != nullptr && j < hidden) cn[b * hidden + j] = from_f32<T>(c[b * hidden + j]);
  }
}

// ---------------------------------------------------------------------------
// Backward steps.

// dh[b][j] = dy[b*ldy + j] + carry[b][j]: the gradient of the step's output h.
__global__ void dh_total_kernel(int64_t bs, int64_t hout, const float* __restrict__ dy, int64_t ldy,
                                const float* __restrict__ carry, float* __restrict__ dh) {
  const int64_t total = bs * hout;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = e / hout, j = e % hout;
    dh[e] = dy[b * ldy + j] + carry[e];
  }
}

// LSTM: from dm (gradient of m = o tanh c) and dc_carry (gradient of c from
// the next step), the pre-activation gate gradients dG, and dc_carry becomes
// the gradient of c_{t-1}:
//   dc = dc_carry + dm o (1 - tanh^2 c), di = dc g, df = dc c_{t-1}, dg = dc i,
//   do = dm tanh c, dc_{t-1} = dc f.
__device__ __forceinline__ void lstm_backward_element(int64_t b, int64_t j, int64_t H,
                                                      const float* gates, const float* c,
                                                      const float* cprev, float dmv,
                                                      float* dc_carry, float* dG) {
  const float* g = gates + b * 4 * H;
  const auto dg =
      gate_math::lstm_backward(g[j], g[H + j], g[2 * H + j], g[3 * H + j], tanhf(c[b * H + j]),
                               cprev[b * H + j], dmv, dc_carry[b * H + j]);
  float* d = dG + b * 4 * H;
  d[j] = dg.i;
  d[H + j] = dg.f;
  d[2 * H + j] = dg.g;
  d[3 * H + j] = dg.o;
  dc_carry[b * H + j] = dg.dc_prev;
}

__global__ void lstm_backward_kernel(int64_t bs, int64_t H, const float* __restrict__ gates,
                                     const float* __restrict__ c, const float* __restrict__ cprev,
                                     const float* __restrict__ dm, int64_t ldm,
                                     float* __restrict__ dc_carry, float* __restrict__ dG) {
  const int64_t total = bs * H;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = e / H, j = e % H;
    lstm_backward_element(b, j, H, gates, c, cprev, dm[b * ldm + j], dc_carry, dG);
  }
}

// GRU: dn = dh (1 - z), dz = dh (h_{t-1} - n), da_n = dn (1 - n^2),
// dr = da_n hn; dGx = (dr r(1-r), dz z(1-z), da_n), dGh = (same, same, da_n r);
// dh_carry = dh z (the direct part of dh_{t-1}; the GEMM with W_hh adds the rest).
__device__ __forceinline__ void gru_backward_element(int64_t b, int64_t j, int64_t H,
                                                     const float* gates, const float* ghn,
                                                     const float* hprev, float dhv, float* dGx,
                                                     float* dGh, float* dh_carry) {
  const float* g = gates + b * 3 * H;
  const auto d =
      gate_math::gru_backward(g[j], g[H + j], g[2 * H + j], ghn[b * H + j], hprev[b * H + j], dhv);
  float* dx = dGx + b * 3 * H;
  float* dhh = dGh + b * 3 * H;
  dx[j] = d.r;
  dx[H + j] = d.z;
  dx[2 * H + j] = d.n;
  dhh[j] = d.r;
  dhh[H + j] = d.z;
  dhh[2 * H + j] = d.n_h;
  dh_carry[b * H + j] = d.h_prev;
}

__global__ void gru_backward_kernel(int64_t bs, int64_t H, const float* __restrict__ gates,
                                    const float* __restrict__ ghn, const float* __restrict__ hprev,
                                    const float* __restrict__ dh, float* __restrict__ dGx,
                                    float* __restrict__ dGh, float* __restrict__ dh_carry) {
  const int64_t total = bs * H;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    gru_backward_element(e / H, e % H, H, gates, ghn, hprev, dh[e], dGx, dGh, dh_carry);
}

// Elman: da = dh (1 - h^2), or torch's threshold_backward for relu.
__device__ __forceinline__ float rnn_backward_element(bool relu, float h, float dhv) {
  return gate_math::rnn_backward(h, dhv, relu);
}

__global__ void rnn_backward_kernel(int64_t bs, int64_t H, bool relu,
                                    const float* __restrict__ gates, const float* __restrict__ dh,
                                    float* __restrict__ dG) {
  const int64_t total = bs * H;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dG[e] = rnn_backward_element(relu, gates[e], dh[e]);
}

// The backward recurrence of one layer and direction on one thread-block
// cluster (SEQPACK_CUDA_KERNEL_CLUSTER; sm_90), the forward's cluster kernel
// turned around: block r of n owns hidden units [r U, r U + U) and keeps
// W_hh's columns of them (every gate's rows) in shared memory. Per step (the
// forward's order reversed): each block computes its units' dh = dY + carry
// and the cell's backward for the step's rows (the gates' gradients to dGx,
// dGh in global memory, for the products over all rows after), writes its
// units' entries of dG_h into every block's shared memory (the all-gather),
// meets the cluster barrier, then computes its units of the carry
// dh_{t-1} = dG_h W_hh (+ dh z for a GRU) from the gathered dG_h. dG_h
// alternates between two buffers, so one barrier a step suffices. The carries
// start as dh_n, dc_n (the host's) and end as dh0, dc0. With a projection:
// projected_backward_steps (below).
template <typename T>
struct ClusterBackwardArgs {
  int mode;
  bool reverse;
  int64_t steps;
  int64_t batch;
  const int64_t* batch_sizes;  // device copy
  int64_t H;
  int64_t units;
  const float* dy;  // the direction's first column of row 0 of dY
  int64_t ldy;
  const float* gates;
  const float* c;
  const float* cprev;
  const float* ghn;
  const float* hprev;
  float* dgx;
  float* dgh;
  float* dh_carry;  // [batch, H]
  float* dc_carry;  // [batch, H], LSTM
  const T* w_hh;
  // LSTM with a projection (projected_backward_steps): dh has P columns, cols
  // of them a block's; dh written (rows x P) for the caller's dW_hr.
  int64_t P;
  int64_t cols;
  const T* w_hr;
  float* dh;
  bool shared_dg;  // dG_h gathered in shared memory (else read from dgh, global)
  bool mma;        // the carry's product on tensor cores (shared_dg, H % 16 == 0, 16-bit T
                   // or TF32 allowed)
};

// The cluster backward kernel's shared memory with tensor cores (a.mma): the
// two dG_h buffers [Bp][G] in T (Bp = the batch rounded up to 16), W_hh's
// columns of the block's units as [G][Nu] (Nu = units rounded up to 16, the
// padding zero), and a float [Bp][Nu] scratch for the product; every fragment
// starts 32-byte aligned because G is a multiple of 16.
template <typename T>
constexpr size_t cluster_backward_mma_shared_bytes(int64_t G, int64_t units, int64_t batch) {
  return static_cast<size_t>(2 * round16(batch) * G + G * round16(units)) * sizeof(T) +
         static_cast<size_t>(round16(batch) * round16(units)) * sizeof(float);
}

// The body of both backward kernels below: block r (its rank in the cluster,
// or in its direction's part of a cooperative grid, which gathers dG_h
// through global memory only) owns units [r U, r U + U).
template <typename T, bool kCluster>
__device__ __forceinline__ void backward_steps(const ClusterBackwardArgs<T>& a, unsigned rank) {
  const unsigned n = kCluster ? cluster_blocks() : 0;
  const bool lstm = a.mode == 0, gru = a.mode == 1;
  const int ng = lstm ? 4 : gru ? 3 : 1;
  const int64_t H = a.H, G = ng * H, B = a.batch;
  const int64_t j0 = static_cast<int64_t>(rank) * a.units;
  const int64_t U = share(j0, a.units, H);
  // Two dG_h buffers where they fit (a.shared_dg), [B][G] in float, or with
  // tensor cores [Bp][G] in T (the product's operand); else none: dG_h is read
  // from global memory after the barrier. Then w[row Nu + u] = W_hh[row][j0 + u]
  // (Nu = U, or with tensor cores units rounded up to 16, the padding zero),
  // then (tensor cores) the product's float scratch [Bp][Nu].
  const bool mma = a.mma;
  const int64_t Bp = mma ? round16(B) : B, Nu = mma ? round16(a.units) : U;
  const int64_t buffered = a.shared_dg ? Bp * G : 0;
  float* dgbuf[2] = {dynamic_shared<float>(), dynamic_shared<float>() + buffered};
  T* dgt[2] = {dynamic_shared<T>(), dynamic_shared<T>() + buffered};
  T* w = mma ? dgt[1] + buffered : reinterpret_cast<T*>(dgbuf[1] + buffered);
  float* scratch = reinterpret_cast<float*>(w + G * Nu);
  for (int64_t e = threadIdx.x; e < G * Nu; e += blockDim.x) {
    const int64_t row = e / Nu, u = e % Nu;
    w[e] = u < U ? a.w_hh[row * H + j0 + u] : from_f32<T>(0.0f);
  }
  __syncthreads();
  // Processing order: the forward's reversed.
  StepWalk walk(a.batch_sizes, a.steps, !a.reverse);
  for (int64_t k = 0; k < a.steps; ++k) {
    int64_t t, bs, r0;
    walk.at(k, &t, &bs, &r0);
    float* dg = dgbuf[k & 1];
    for (int64_t e = threadIdx.x; e < bs * U; e += blockDim.x) {
      const int64_t b = e / U, j = j0 + e % U;
      const float dhv = a.dy[(r0 + b) * a.ldy + j] + a.dh_carry[b * H + j];
      float* dgh = a.dgh + r0 * G;
      if (lstm)
        lstm_backward_element(b, j, H, a.gates + r0 * G, a.c + r0 * H, a.cprev + r0 * H, dhv,
                              a.dc_carry, a.dgx + r0 * G);
      else if (gru)
        gru_backward_element(b, j, H, a.gates + r0 * G, a.ghn + r0 * H, a.hprev + r0 * H, dhv,
                             a.dgx + r0 * G, dgh, a.dh_carry);
      else
        a.dgx[(r0 + b) * G + j] = rnn_backward_element(a.mode == 3, a.gates[(r0 + b) * G + j], dhv);
      // This unit's dG_h entries (every gate) to every block of the cluster.
      if constexpr (kCluster) {
        for (int g = 0; a.shared_dg && g < ng; ++g) {
          const float v = dgh[b * G + g * H + j];
          if (mma) {
            const T vt = from_f32<T>(v);
            for (unsigned q = 0; q < n; ++q) peer_shared(dgt[k & 1], q)[b * G + g * H + j] = vt;
          } else {
            for (unsigned q = 0; q < n; ++q) peer_shared(dg, q)[b * G + g * H + j] = v;
          }
        }
      }
    }
    group_sync<kCluster>();
    if (mma) {  // dG_h W_hh for the block's units: [bs][G] x [G][Nu] (rows past bs dropped)
      cluster_step_mma<T>(dgt[k & 1], w, scratch, bs, G, Nu);
      __syncthreads();
    }
    const float* dgs = a.shared_dg ? dg : a.dgh + r0 * G;
    for (int64_t e = threadIdx.x; e < bs * U; e += blockDim.x) {
      const int64_t b = e / U, u = e % U, j = j0 + u;
      float acc = gru ? a.dh_carry[b * H + j] : 0.0f;
      if (mma)
        acc += scratch[b * Nu + u];
      else
        for (int64_t row = 0; row < G; ++row) acc += dgs[b * G + row] * to_f32(w[row * Nu + u]);
      a.dh_carry[b * H + j] = acc;
    }
    __syncthreads();  // the next step's rows map to other threads
  }
}

// The backward of an LSTM with a projection, turned around as
// projected_forward_steps: block r owns hidden units [r U, r U + U) (the
// cell; W_hr's columns of them) and output columns [r V, r V + V) (W_hh's
// columns of them: the carry's). Per step (the forward's order reversed): its
// columns of dh = dY + carry (to a.dh), the barrier, its units' dm = dh W_hr
// and the cell's backward (dG to a.dgx), the barrier, its columns of the
// carry dh_{t-1} = dG W_hh. Everything passes through global memory.
template <typename T, bool kCluster>
__device__ __forceinline__ void projected_backward_steps(const ClusterBackwardArgs<T>& a,
                                                         unsigned rank) {
  const int64_t H = a.H, P = a.P, G = 4 * H;
  const int64_t j0 = static_cast<int64_t>(rank) * a.units, q0 = static_cast<int64_t>(rank) * a.cols;
  const int64_t U = share(j0, a.units, H);
  const int64_t V = share(q0, a.cols, P);
  // wr[q U + u] = W_hr[q][j0 + u], then wh[row V + v] = W_hh[row][q0 + v].
  T* wr = dynamic_shared<T>();
  T* wh = wr + P * a.units;
  for (int64_t e = threadIdx.x; e < P * U; e += blockDim.x)
    wr[e] = a.w_hr[(e / U) * H + j0 + e % U];
  for (int64_t e = threadIdx.x; e < G * V; e += blockDim.x)
    wh[e] = a.w_hh[(e / V) * P + q0 + e % V];
  __syncthreads();
  StepWalk walk(a.batch_sizes, a.steps, !a.reverse);
  for (int64_t k = 0; k < a.steps; ++k) {
    int64_t t, bs, r0;
    walk.at(k, &t, &bs, &r0);
    float* dh = a.dh + r0 * P;
    for (int64_t e = threadIdx.x; e < bs * V; e += blockDim.x) {
      const int64_t b = e / V, q = q0 + e % V;
      dh[b * P + q] = a.dy[(r0 + b) * a.ldy + q] + a.dh_carry[b * P + q];
    }
    group_sync<kCluster>();
    for (int64_t e = threadIdx.x; e < bs * U; e += blockDim.x) {
      const int64_t b = e / U, u = e % U;
      float dm = 0.0f;
      for (int64_t q = 0; q < P; ++q) dm += dh[b * P + q] * to_f32(wr[q * U + u]);
      lstm_backward_element(b, j0 + u, H, a.gates + r0 * G, a.c + r0 * H, a.cprev + r0 * H, dm,
                            a.dc_carry, a.dgx + r0 * G);
    }
    group_sync<kCluster>();
    for (int64_t e = threadIdx.x; e < bs * V; e += blockDim.x) {
      const int64_t b = e / V, v = e % V;
      const float* dg = a.dgx + (r0 + b) * G;
      float acc = 0.0f;
      for (int64_t row = 0; row < G; ++row) acc += dg[row] * to_f32(wh[row * V + v]);
      a.dh_carry[b * P + q0 + v] = acc;
    }
    __syncthreads();  // the next step's columns of dh read this block's carry
  }
}

template <typename T, bool kProj>
__global__ void __launch_bounds__(kPersistentThreads)
    cluster_backward_kernel(Directions<ClusterBackwardArgs<T>> p) {
  if constexpr (kProj)
    projected_backward_steps<T, true>(p.dir[blockIdx.x / p.blocks], cluster_rank());
  else
    backward_steps<T, true>(p.dir[blockIdx.x / p.blocks], cluster_rank());
}

// The same on a cooperative grid whose blocks are all resident (W_hh's
// columns too large for one cluster): dG_h through global memory, the grid's
// barrier each step.
template <typename T, bool kProj>
__global__ void __launch_bounds__(kPersistentThreads)
    persistent_backward_kernel(Directions<ClusterBackwardArgs<T>> p) {
  if constexpr (kProj)
    projected_backward_steps<T, false>(p.dir[blockIdx.x / p.blocks], blockIdx.x % p.blocks);
  else
    backward_steps<T, false>(p.dir[blockIdx.x / p.blocks], blockIdx.x % p.blocks);
}

}  // namespace seqpack::cuda
