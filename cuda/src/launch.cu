// The launchers (launch.cuh). The grid of the computation (layers x
// directions x steps) is written once here; the cells'
// element-wise math is in kernels.cuh. Per layer and direction:
//   forward:  gates = X W_ih^T + b_ih for all packed rows (one GEMM), then per
//             step t: h_prev/c_prev gathered, gh = h_prev W_hh^T (GEMM on the
//             step's rows), the cell kernel, [h = m W_hr^T], finished rows to
//             h_n/c_n;
//   backward: per step in the opposite order: dh = dy + carry, [dm = dh W_hr],
//             the cell's backward kernel, carry = dG_h W_hh; then the weight
//             gradients as GEMMs over all rows, and dX += dG_x W_ih.
// With caller_products = 1 (one layer) the caller runs the products over all
// rows (the input projection, the weight gradients, dX): the forward takes the
// input gates, the backward gives the gates' gradients and h_{t-1} instead.
#include "launch.cuh"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "choice.cuh"
#include "kernels.cuh"
#include "layouts.cuh"

namespace seqpack::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(b, 1), 65535 * 8));
}

// The 16-bit data type among a GEMM's operand types (float if none).
template <typename... Ts>
struct HalfType {
  using type = float;
};
template <typename T, typename... Ts>
struct HalfType<T, Ts...> {
  using type = std::conditional_t<std::is_same_v<T, float>, typename HalfType<Ts...>::type, T>;
};

template <typename TA, typename TB, typename TC>
void gemm(const Policy& policy, cudaStream_t stream, int64_t M, int64_t N, int64_t K, const TA* A,
          int64_t lda, bool trans_a, const TB* B, int64_t ldb, bool trans_b, const TB* bias, TC* C,
          int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  using TH = typename HalfType<TA, TB, TC>::type;
  if constexpr (!std::is_same_v<TH, float>) {
    if (use_wmma(policy)) {
      const int64_t wx = (M + kWmmaTile - 1) / kWmmaTile;
      const int64_t wy = (N + kWmmaTile - 1) / kWmmaTile;
      if (wx > 0x7fffffff || wy > 65535)
        fail(SEQPACK_CUDA_INVALID_ARGUMENT,
             "seqpack_cuda: a product of %lld x %lld is too large for one launch",
             static_cast<long long>(M), static_cast<long long>(N));
      launch(gemm_wmma_kernel<TH, TA, TB, TC>,
             dim3(static_cast<unsigned>(wx), static_cast<unsigned>(wy)), kWmmaThreads, stream, M, N,
             K, A, lda, trans_a, B, ldb, trans_b, bias, C, ldc, accumulate);
      return;
    }
  }
  const int tile = gemm_tile(policy, M, N);
  const int64_t gx = (M + tile - 1) / tile;
  const int64_t gy = (N + tile - 1) / tile;
  if (gx > 0x7fffffff || gy > 65535)
    fail(SEQPACK_CUDA_INVALID_ARGUMENT,
         "seqpack_cuda: a product of %lld x %lld is too large for one launch",
         static_cast<long long>(M), static_cast<long long>(N));
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  if (tile == 32)
    launch(gemm_kernel<32, TA, TB, TC>, grid, kGemmThreads, stream, M, N, K, A, lda, trans_a, B,
           ldb, trans_b, bias, C, ldc, accumulate);
  else
    launch(gemm_kernel<64, TA, TB, TC>, grid, kGemmThreads, stream, M, N, K, A, lda, trans_a, B,
           ldb, trans_b, bias, C, ldc, accumulate);
}

template <typename TO>
void column_sum(cudaStream_t stream, int64_t M, int64_t N, const float* a, int64_t lda, TO* out) {
  if (N <= 0) return;
  const int64_t blocks = (N + kSumColumns - 1) / kSumColumns;
  launch(column_sum_kernel<TO>, dim3(static_cast<unsigned>(blocks)), dim3(kSumColumns, kSumLanes),
         stream, M, N, a, lda, out);
}

template <typename TS, typename TD>
void convert(cudaStream_t stream, int64_t rows, int64_t cols, const TS* src, int64_t lds, TD* dst,
             int64_t ldd) {
  if (rows <= 0 || cols <= 0) return;
  launch(convert_kernel<TS, TD>, blocks_for(rows * cols), kThreads, stream, rows, cols, src, lds,
         dst, ldd);
}

template <typename T>
void zero(cudaStream_t stream, int64_t n, T* dst) {
  if (n <= 0) return;
  launch(fill_zero_kernel<T>, blocks_for(n), kThreads, stream, n, dst);
}

// One layer and direction's forward recurrence: what a one-launch kernel
// reads and writes (the gates hold the input's part already).
template <typename T>
struct ForwardRun {
  bool reverse = false;
  LayerWeights<const T*> w;
  const Saved* sv = nullptr;
  Workspace ws{};
  const T* h0 = nullptr;
  const T* c0 = nullptr;
  T* y = nullptr;
  T* hn = nullptr;
  T* cn = nullptr;
};

// The persistent forward kernels' arguments of one layer and direction.
template <typename T>
PersistentArgs<T> persistent_args(const Shape& s, int64_t steps, int64_t units,
                                  const ForwardRun<T>& r) {
  PersistentArgs<T> a{};
  a.mode = s.mode;
  a.reverse = r.reverse;
  a.steps = steps;
  a.batch = s.batch;
  a.batch_sizes = r.ws.batch_sizes;
  a.H = s.hidden;
  a.ldy = s.width();
  a.units = units;
  a.gates = r.sv->gates;
  a.gh = r.ws.gh;
  a.w_hh = r.w.w_hh;
  a.b_hh = r.w.b_hh;
  a.h0 = r.h0;
  a.c0 = r.c0;
  a.y = r.y;
  a.hprev = r.sv->hprev;
  a.c = r.sv->c;
  a.cprev = r.sv->cprev;
  a.ghn = r.sv->ghn;
  a.hn = r.hn;
  a.cn = r.cn;
  a.P = s.hout();
  a.cols = s.hout();
  a.w_hr = r.w.w_hr;
  a.m = r.sv->m;
  return a;
}

// Copies batch_sizes to the first direction's device copy, which every
// direction of p then reads.
template <typename A>
void share_batch_sizes(Directions<A>& p, int count, const int64_t* batch_sizes, int64_t steps,
                       cudaStream_t stream) {
  check_cuda(cudaMemcpyAsync(const_cast<int64_t*>(p.dir[0].batch_sizes), batch_sizes,
                             static_cast<size_t>(steps) * 8, cudaMemcpyHostToDevice, stream),
             "copying batch_sizes to the device");
  for (int d = 1; d < count; ++d) p.dir[d].batch_sizes = p.dir[0].batch_sizes;
}

// part of the weights, `element` bytes an entry, in its shared memory), with
// direction d's arguments make(U, d) and the block's output columns; false
// (nothing run) where it does not fit or where the GPU refuses the launch
// (too many blocks resident elsewhere, say): the steps are then another
// launch's.
template <typename A, typename Make>
bool start_cooperative(void (*kernel)(Directions<A>), const Shape& s, bool backward, size_t element,
                       const int64_t* batch_sizes, int64_t steps, int count, cudaStream_t stream,
                       Make make) {
  if (steps == 0) return false;
  DeviceLimits limits;
  if (device_limits(&limits) != cudaSuccess || !limits.cooperative) {
    (void)cudaGetLastError();
    return false;
  }
  size_t shared = 0;
  int64_t cols = 0;
  const int64_t units = cooperative_units(kernel, kPersistentThreads, s, count, backward, element,
                                          limits, &shared, &cols);
  if (units == 0) return false;
  Directions<A> p{};
  for (int d = 0; d < count; ++d) {
    p.dir[d] = make(units, d);
    p.dir[d].cols = cols;
  }
  p.blocks = static_cast<unsigned>((s.hidden + units - 1) / units);
  share_batch_sizes(p, count, batch_sizes, steps, stream);
  if (launch_cooperative(kernel, dim3(static_cast<unsigned>(count) * p.blocks),
                         dim3(kPersistentThreads), shared, stream, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

// The persistent kernel for one layer's `count` directions, if it fits: units
// per block U from 1 up, the first whose W_hh rows fit in shared memory and
// whose blocks are all resident at once (a cooperative launch needs that).
// Returns false (nothing launched) where none does.
template <typename T>
bool try_persistent(const Shape& s, const int64_t* batch_sizes, int64_t steps,
                    const ForwardRun<T>* runs, int count, cudaStream_t stream) {
  return start_cooperative(
      s.proj > 0 ? persistent_forward_kernel<T, true> : persistent_forward_kernel<T, false>, s,
      false, sizeof(T), batch_sizes, steps, count, stream,
      [&](int64_t units, int d) { return persistent_args<T>(s, steps, units, runs[d]); });
}

// Launches `kernel` for one layer's `count` directions, a cluster of the
// plan's each, with the arguments a (batch_sizes copied to the device first);
// false (nothing run) where the GPU refuses the launch.
template <typename A>
bool start_cluster(void (*kernel)(Directions<A>), const ClusterPlan& p, const int64_t* batch_sizes,
                   int64_t steps, int count, cudaStream_t stream, Directions<A> a) {
  a.blocks = static_cast<unsigned>(p.n);
  share_batch_sizes(a, count, batch_sizes, steps, stream);
  if (launch_cluster(kernel, dim3(static_cast<unsigned>(count * p.n)), dim3(kPersistentThreads),
                     static_cast<unsigned>(p.n), p.shared, stream, a) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

// The cluster kernel for one layer's `count` directions, if it fits: a
// cluster of cluster_size(H) blocks a direction, each holding its units' rows
// of W_hh in shared memory, and the two h buffers (batch x H each) where they
// fit too (else h_{t-1} is read from y). Returns false (nothing launched)
// where the rows do not fit or the GPU refuses the launch (before sm_90: no
// clusters).
template <typename T>
bool try_cluster(const Shape& s, const int64_t* batch_sizes, int64_t steps,
                 const ForwardRun<T>* runs, int count, cudaStream_t stream) {
  ClusterPlan p = plan_cluster(s, steps, false,
                               static_cast<size_t>(2 * s.batch * s.hidden) * sizeof(T), sizeof(T));
  if (!p.ok) return false;
  // 16-bit data, or float32 with TF32 allowed (3xTF32), with H a multiple of
  // 16 and the h buffers in shared memory: the step's product on tensor cores
  // where that layout fits too (the policy's cluster_mma = 0 keeps the threads'
  // own products).
  bool mma = false;
  DeviceLimits limits;
  if (device_limits(&limits) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const auto limit = static_cast<size_t>(limits.shared_optin);
  if ((sizeof(T) == 2 || s.tf32) && s.hidden % 16 == 0 && p.buffers && s.policy.cluster_mma == 1) {
    const size_t bytes =
        cluster_mma_shared_bytes<T>(s.gates() / s.hidden, p.units, s.hidden, s.batch);
    if (bytes <= limit) {
      mma = true;
      p.shared = bytes;
    }
  }
  // The input gates prefetched a step ahead, two batch x (the block's gate
  // rows) float buffers after the rest, where they fit (not with a
  // projection, whose kernel reads them in place).
  const size_t xg_offset = (p.shared + 15) / 16 * 16;
  const size_t xg_bytes = static_cast<size_t>(2 * s.batch * s.gates() / s.hidden * p.units) * 4;
  const bool prefetch = s.proj == 0 && xg_offset + xg_bytes <= limit;
  if (prefetch) p.shared = xg_offset + xg_bytes;
  Directions<PersistentArgs<T>> a{};
  for (int d = 0; d < count; ++d) {
    a.dir[d] = persistent_args<T>(s, steps, p.units, runs[d]);
    a.dir[d].cols = p.cols;
    a.dir[d].shared_h = p.buffers;
    a.dir[d].mma = mma;
    a.dir[d].xg_offset = prefetch ? static_cast<int64_t>(xg_offset) : 0;
  }
  return start_cluster(
      s.proj > 0 ? cluster_forward_kernel<T, true> : cluster_forward_kernel<T, false>, p,
      batch_sizes, steps, count, stream, a);
}

// One layer's forward recurrence for `count` directions in one launch, where
// the policy's kernel asks for one and it fits: "persistent" a cooperative
// grid's; "cluster" a cluster a direction, else (W_hh too large for one
// cluster) the cooperative grid's. False (nothing run) otherwise.
template <typename T>
bool try_one_launch(const Shape& s, const int64_t* batch_sizes, int64_t steps,
                    const ForwardRun<T>* runs, int count, cudaStream_t stream) {
  if (persistent_requested(s.policy))
    return try_persistent<T>(s, batch_sizes, steps, runs, count, stream);
  return cluster_requested(s.policy) &&
         (try_cluster<T>(s, batch_sizes, steps, runs, count, stream) ||
          try_persistent<T>(s, batch_sizes, steps, runs, count, stream));
}

// One layer and direction's backward recurrence: what a one-launch kernel
// reads and writes (the carries hold dh_n, dc_n when it starts and dh0, dc0
// when it ends).
struct BackwardRun {
  bool reverse = false;
  const void* w_hh = nullptr;
  const void* w_hr = nullptr;
  const Saved* sv = nullptr;
  Workspace ws{};
  const float* dy = nullptr;  // the direction's first column of row 0 of dY
  float* dgx = nullptr;
  float* dgh = nullptr;
  float* dh = nullptr;  // with a projection: rows x P, the gradient of h
};

// The arguments of both backward kernels (dG_h through global memory until
// the caller says otherwise).
template <typename T>
ClusterBackwardArgs<T> cluster_backward_args(const Shape& s, int64_t steps, int64_t units,
                                             const BackwardRun& r) {
  ClusterBackwardArgs<T> a{};
  a.mode = s.mode;
  a.reverse = r.reverse;
  a.steps = steps;
  a.batch = s.batch;
  a.batch_sizes = r.ws.batch_sizes;
  a.H = s.hidden;
  a.units = units;
  a.dy = r.dy;
  a.ldy = s.width();
  a.gates = r.sv->gates;
  a.c = r.sv->c;
  a.cprev = r.sv->cprev;
  a.ghn = r.sv->ghn;
  a.hprev = r.sv->hprev;
  a.dgx = r.dgx;
  a.dgh = r.dgh;
  a.dh_carry = r.ws.dh_carry;
  a.dc_carry = r.ws.dc_carry;
  a.w_hh = static_cast<const T*>(r.w_hh);
  a.P = s.hout();
  a.cols = s.hout();
  a.w_hr = static_cast<const T*>(r.w_hr);
  a.dh = r.dh;
  return a;
}

// The backward's cluster kernel for one layer's `count` directions, if it
// fits (as try_cluster: the same cluster size, W_hh's columns of each block's
// units and two batch x gates buffers of dG_h in its shared memory).
template <typename T>
bool try_cluster_backward(const Shape& s, const int64_t* batch_sizes, int64_t steps,
                          const BackwardRun* runs, int count, cudaStream_t stream) {
  ClusterPlan p = plan_cluster(
      s, steps, true, static_cast<size_t>(2 * s.batch * s.gates()) * sizeof(float), sizeof(T));
  if (!p.ok) return false;
  // 16-bit data, or float32 with TF32 allowed (3xTF32), with H a multiple of
  // 16 and dG_h gathered in shared memory: the carry's product on tensor cores
  // (dG_h rounded to T, float32 accumulation) where that layout fits
  // (the policy's cluster_mma = 0: the threads' float32 products).
  bool mma = false;
  if ((sizeof(T) == 2 || s.tf32) && s.hidden % 16 == 0 && p.buffers && s.policy.cluster_mma == 1) {
    DeviceLimits limits;
    const size_t bytes = cluster_backward_mma_shared_bytes<T>(s.gates(), p.units, s.batch);
    if (device_limits(&limits) == cudaSuccess &&
        bytes <= static_cast<size_t>(limits.shared_optin)) {
      mma = true;
      p.shared = bytes;
    }
  }
  Directions<ClusterBackwardArgs<T>> a{};
  for (int d = 0; d < count; ++d) {
    a.dir[d] = cluster_backward_args<T>(s, steps, p.units, runs[d]);
    a.dir[d].cols = p.cols;
    a.dir[d].shared_dg = p.buffers;
    a.dir[d].mma = mma;
  }
  return start_cluster(
      s.proj > 0 ? cluster_backward_kernel<T, true> : cluster_backward_kernel<T, false>, p,
      batch_sizes, steps, count, stream, a);
}

// The backward's kernel on a cooperative grid, for W_hh's columns too large
// for one cluster (as try_persistent for the forward): dG_h through global
// memory, the grid's barrier each step.
template <typename T>
bool try_persistent_backward(const Shape& s, const int64_t* batch_sizes, int64_t steps,
                             const BackwardRun* runs, int count, cudaStream_t stream) {
  return start_cooperative(
      s.proj > 0 ? persistent_backward_kernel<T, true> : persistent_backward_kernel<T, false>, s,
      true, sizeof(T), batch_sizes, steps, count, stream,
      [&](int64_t units, int d) { return cluster_backward_args<T>(s, steps, units, runs[d]); });
}

// One layer's backward recurrence for `count` directions in one launch (as
// try_one_launch: a cluster a direction, else a cooperative grid); false
// (nothing run) where none is requested or fits.
template <typename T>
bool try_one_launch_backward(const Shape& s, const int64_t* batch_sizes, int64_t steps,
                             const BackwardRun* runs, int count, cudaStream_t stream) {
  return (cluster_requested(s.policy) &&
          try_cluster_backward<T>(s, batch_sizes, steps, runs, count, stream)) ||
         ((cluster_requested(s.policy) || persistent_requested(s.policy)) &&
          try_persistent_backward<T>(s, batch_sizes, steps, runs, count, stream));
}

}  // namespace

template <typename T>
void forward(const Shape& s, const int64_t* batch_sizes, const std::vector<int64_t>& off,
             bool has_biases, const void* const* weights_v, const T* x, const T* h0, const T* c0,
             const T* mask, T* y, T* hn, T* cn, void* workspace, void* reserve,
             const CallerProducts& cp, cudaStream_t main_stream) {
  cudaStream_t const stream = main_stream;
  const int64_t steps = static_cast<int64_t>(off.size()) - 1;
  const int64_t n = s.rows, B = s.batch, H = s.hidden, P = s.hout(), G = s.gates(), W = s.width();
  const int64_t bs0 = steps > 0 ? batch_sizes[0] : 0;
  const auto* weights = reinterpret_cast<const T* const*>(weights_v);
  ReserveLayout<T> rs = layout_reserve<T>(s, reserve);
  // A layer's two directions run at once, the reverse one on a second stream:
  // they read the layer's input and write their own columns of its output,
  // reserve and workspace; the next layer starts after both.
  SideStream side(stream, s.dirs == 2);
  const T* input = x;
  for (int64_t l = 0; l < s.layers; ++l) {
    const int64_t in = s.in_width(l);
    if (l > 0) {
      const T* below = rs.layer_output[l - 1];
      if (mask != nullptr && n > 0) {
        launch(mask_kernel<T, T, T>, blocks_for(n * W), kThreads, stream, n * W, below,
               mask + (l - 1) * n * W, rs.dropped_input[l]);
        input = rs.dropped_input[l];
      } else {
        input = below;
      }
    }
    check_cuda(side.fork(), "the reverse direction's stream");
    T* out = l + 1 < s.layers ? rs.layer_output[l] : y;
    ForwardRun<T> runs[2];
    for (int64_t d = 0; d < s.dirs; ++d) {
      const int64_t ld_index = l * s.dirs + d;
      ForwardRun<T>& r = runs[d];
      r.reverse = d == 1;
      r.w = weights_of(s, has_biases, weights, l, d);
      r.sv = &rs.saved[ld_index];
      r.ws = layout_workspace(s, workspace, d);
      r.h0 = h0 + ld_index * B * P;
      r.c0 = s.lstm() ? c0 + ld_index * B * H : nullptr;
      r.hn = hn + ld_index * B * P;
      r.cn = s.lstm() ? cn + ld_index * B * H : nullptr;
      r.y = out + d * P;
      cudaStream_t const stream = d == 1 ? side.stream() : main_stream;
      // Sequences of length zero keep their initial state.
      if (B > bs0) {
        convert(stream, B - bs0, P, r.h0 + bs0 * P, P, r.hn + bs0 * P, P);
        if (s.lstm()) convert(stream, B - bs0, H, r.c0 + bs0 * H, H, r.cn + bs0 * H, H);
      }
      // gates = input W_ih^T + b_ih for every row (the caller's, or here).
      if (cp.on)
        convert(stream, n, G, static_cast<const T*>(cp.input_gates[d]), G, r.sv->gates, G);
      else
        gemm<T, T, float>(s.policy, stream, n, G, in, input, in, false, r.w.w_ih, in, true,
                          r.w.b_ih, r.sv->gates, G, false);
    }
    // The recurrence: both directions in one launch where the policy's kernel
    // asks for a one-launch kernel and it fits (after both directions' gates),
    // else such a launch a direction, else the per-step kernels.
    bool both = false;
    if (s.dirs == 2 && (persistent_requested(s.policy) || cluster_requested(s.policy))) {
      check_cuda(side.join(), "the reverse direction's stream");
      both = try_one_launch<T>(s, batch_sizes, steps, runs, 2, main_stream);
      if (!both) check_cuda(side.fork(), "the reverse direction's stream");
    }
    for (int64_t d = 0; !both && d < s.dirs; ++d) {
      const ForwardRun<T>& r = runs[d];
      const LayerWeights<const T*>& w = r.w;
      const Saved& sv = *r.sv;
      const Workspace& ws = r.ws;
      cudaStream_t const stream = d == 1 ? side.stream() : main_stream;
      if (try_one_launch<T>(s, batch_sizes, steps, &r, 1, stream)) continue;
      for (int64_t k = 0; k < steps; ++k) {
        const bool reverse = d == 1;
        const int64_t t = reverse ? steps - 1 - k : k;
        const int64_t bs = batch_sizes[t];
        const int64_t r0 = off[t];
        // The rows that continue a previous step, and where that step's rows begin.
        int64_t prev_rows = 0, prev_off = 0;
        if (!reverse && t > 0) {
          prev_rows = bs;
          prev_off = off[t - 1];
        } else if (reverse && t + 1 < steps) {
          prev_rows = batch_sizes[t + 1];
          prev_off = off[t + 1];
        }
        launch(gather_prev_kernel<T>, blocks_for(bs * std::max(P, H)), kThreads, stream, bs, P, H,
               prev_rows, r.y + prev_off * W, W, r.h0, sv.hprev + r0 * P,
               s.lstm() ? sv.c + prev_off * H : nullptr, r.c0,
               s.lstm() ? sv.cprev + r0 * H : nullptr);
        // gh = h_{t-1} W_hh^T for the step's rows.
        gemm<float, T, float>(s.policy, stream, bs, G, P, sv.hprev + r0 * P, P, false, w.w_hh, P,
                              true, nullptr, ws.gh, G, false);
        float* gates = sv.gates + r0 * G;
        T* y_t = r.y + r0 * W;
        if (s.lstm()) {
          launch(lstm_forward_kernel<T>, blocks_for(bs * H), kThreads, stream, bs, H, gates, ws.gh,
                 w.b_hh, sv.cprev + r0 * H, sv.c + r0 * H, s.proj > 0 ? sv.m + r0 * H : nullptr,
                 y_t, W);
          if (s.proj > 0)  // h = m W_hr^T
            gemm<float, T, T>(s.policy, stream, bs, P, H, sv.m + r0 * H, H, false, w.w_hr, H, true,
                              nullptr, y_t, W, false);
        } else if (s.gru()) {
          launch(gru_forward_kernel<T>, blocks_for(bs * H), kThreads, stream, bs, H, gates, ws.gh,
                 w.b_hh, sv.hprev + r0 * P, sv.ghn + r0 * H, y_t, W);
        } else {
          launch(rnn_forward_kernel<T>, blocks_for(bs * H), kThreads, stream, bs, H,
                 s.mode == SEQPACK_CUDA_RNN_RELU, gates, ws.gh, w.b_hh, y_t, W);
        }
        // Rows whose sequence ends here: forward, those beyond the next
        // step's batch; reverse, every row at t = 0.
        const int64_t lo = reverse ? (t == 0 ? 0 : bs) : (t + 1 < steps ? batch_sizes[t + 1] : 0);
        if (lo < bs)
          launch(finish_kernel<T>, blocks_for((bs - lo) * std::max(P, H)), kThreads, stream, lo, bs,
                 P, H, y_t, W, r.hn, s.lstm() ? sv.c + r0 * H : nullptr, r.cn);
      }
    }
    check_cuda(side.join(), "the reverse direction's stream");
  }
}

template <typename T>
void backward(const Shape& s, const int64_t* batch_sizes, const std::vector<int64_t>& off,
              bool has_biases, const void* const* weights_v, const T* x, const T* mask, const T* dy,
              const T* dhn, const T* dcn, T* dx, T* dh0, T* dc0, void* const* dweights_v,
              void* workspace, const void* reserve, const CallerProducts& cp,
              cudaStream_t main_stream) {
  cudaStream_t const stream = main_stream;
  const int64_t steps = static_cast<int64_t>(off.size()) - 1;
  const int64_t n = s.rows, B = s.batch, H = s.hidden, P = s.hout(), G = s.gates(), W = s.width();
  const auto* weights = reinterpret_cast<const T* const*>(weights_v);
  auto* dweights = reinterpret_cast<T* const*>(dweights_v);
  ReserveLayout<T> rs = layout_reserve<T>(s, const_cast<void*>(reserve));
  const Workspace shared = layout_workspace(s, workspace);
  // dY of the current layer (float32, rows x W).
  float* dY = shared.dy[0];
  float* dX = shared.dy[1];
  if (dy != nullptr)
    convert(stream, n, W, dy, W, dY, W);
  else
    zero(stream, n * W, dY);
  for (int64_t l = s.layers - 1; l >= 0; --l) {
    const int64_t in = s.in_width(l);
    const T* input = l == 0 ? x : (mask != nullptr ? rs.dropped_input[l] : rs.layer_output[l - 1]);
    // One layer's two directions run at once where the caller runs the
    // products (nothing of the directions' own follows), the reverse one on a
    // second stream; they read dY and write their own buffers.
    SideStream side(main_stream, cp.on && s.dirs == 2);
    check_cuda(side.fork(), "the reverse direction's stream");
    // Each direction's recurrence: its buffers (the caller's take the
    // gradients they read: caller_products), and the carries, which start as
    // the gradients of h_n, c_n (rows of every sequence are untouched until
    // its last step).
    BackwardRun runs[2];
    for (int64_t d = 0; d < s.dirs; ++d) {
      const int64_t ld_index = l * s.dirs + d;
      BackwardRun& r = runs[d];
      r.reverse = d == 1;
      const LayerWeights<const T*> w = weights_of(s, has_biases, weights, l, d);
      r.w_hh = w.w_hh;
      r.w_hr = w.w_hr;
      r.sv = &rs.saved[ld_index];
      r.ws = layout_workspace(s, workspace, d);
      r.dy = dY + d * P;
      r.dgx = cp.on ? cp.dgates_x[d] : r.ws.dgx;
      r.dgh = cp.on ? (s.gru() ? cp.dgates_h[d] : r.dgx) : r.ws.dgh;
      r.dh = cp.on && s.proj > 0 ? cp.dh[d] : r.ws.dh;
      cudaStream_t const stream = d == 1 ? side.stream() : main_stream;
      if (dhn != nullptr)
        convert(stream, B, P, dhn + ld_index * B * P, P, r.ws.dh_carry, P);
      else
        zero(stream, B * P, r.ws.dh_carry);
      if (s.lstm()) {
        if (dcn != nullptr)
          convert(stream, B, H, dcn + ld_index * B * H, H, r.ws.dc_carry, H);
        else
          zero(stream, B * H, r.ws.dc_carry);
      }
    }
    // The recurrence in one launch (a cluster's, else a cooperative grid's)
    // where the policy's kernel asks for it: both directions in one where
    // their buffers are apart (the caller's products), else one a direction;
    // else the per-step kernels.
    bool both = false;
    if (cp.on && s.dirs == 2 && (persistent_requested(s.policy) || cluster_requested(s.policy))) {
      check_cuda(side.join(), "the reverse direction's stream");
      both = try_one_launch_backward<T>(s, batch_sizes, steps, runs, 2, main_stream);
      check_cuda(side.fork(), "the reverse direction's stream");
    }
    for (int64_t d = 0; d < s.dirs; ++d) {
      const int64_t ld_index = l * s.dirs + d;
      const BackwardRun& r = runs[d];
      const Workspace& ws = r.ws;
      cudaStream_t const stream = d == 1 ? side.stream() : main_stream;
      const LayerWeights<const T*> w = weights_of(s, has_biases, weights, l, d);
      const LayerWeights<T*> dw =
          cp.on ? LayerWeights<T*>{} : weights_of(s, has_biases, dweights, l, d);
      float* const dgx_all = r.dgx;
      float* const dgh_all = r.dgh;
      float* const dh_all = r.dh;
      const Saved& sv = *r.sv;
      const bool clustered =
          both || try_one_launch_backward<T>(s, batch_sizes, steps, &r, 1, stream);
      for (int64_t k = 0; !clustered && k < steps; ++k) {
        const bool reverse = d == 1;
        // The opposite order of the forward pass.
        const int64_t t = reverse ? k : steps - 1 - k;
        const int64_t bs = batch_sizes[t];
        const int64_t r0 = off[t];
        float* dh = dh_all + r0 * P;
        launch(dh_total_kernel, blocks_for(bs * P), kThreads, stream, bs, P, dY + r0 * W + d * P, W,
               ws.dh_carry, dh);
        const float* dm = dh;
        int64_t ldm = P;
        if (s.proj > 0) {  // dm = dh W_hr
          gemm<float, T, float>(s.policy, stream, bs, H, P, dh, P, false, w.w_hr, H, false, nullptr,
                                ws.dm, H, false);
          dm = ws.dm;
          ldm = H;
        }
        float* dgx = dgx_all + r0 * G;
        float* dgh = dgh_all + r0 * G;
        if (s.lstm()) {
          launch(lstm_backward_kernel, blocks_for(bs * H), kThreads, stream, bs, H,
                 sv.gates + r0 * G, sv.c + r0 * H, sv.cprev + r0 * H, dm, ldm, ws.dc_carry, dgx);
        } else if (s.gru()) {
          launch(gru_backward_kernel, blocks_for(bs * H), kThreads, stream, bs, H,
                 sv.gates + r0 * G, sv.ghn + r0 * H, sv.hprev + r0 * P, dh, dgx, dgh, ws.dh_carry);
        } else {
          launch(rnn_backward_kernel, blocks_for(bs * H), kThreads, stream, bs, H,
                 s.mode == SEQPACK_CUDA_RNN_RELU, sv.gates + r0 * G, dh, dgx);
        }
        // dh_{t-1} (+)= dG_h W_hh; the GRU's kernel wrote its direct part dh z.
        gemm<float, T, float>(s.policy, stream, bs, P, G, dgh, G, false, w.w_hh, P, false, nullptr,
                              ws.dh_carry, P, s.gru());
      }
      // Gradients of the initial state: what the carries hold now.
      convert(stream, B, P, ws.dh_carry, P, dh0 + ld_index * B * P, P);
      if (s.lstm()) convert(stream, B, H, ws.dc_carry, H, dc0 + ld_index * B * H, H);
      if (cp.on) {  // what the caller's products read besides the gradients
        convert(stream, n, P, sv.hprev, P, cp.hprev[d], P);
        if (s.proj > 0) convert(stream, n, H, sv.m, H, cp.m[d], H);
        continue;
      }
      // Weight gradients over all rows.
      gemm<float, T, T>(s.policy, stream, G, in, n, ws.dgx, G, true, input, in, false, nullptr,
                        dw.w_ih, in, false);
      gemm<float, float, T>(s.policy, stream, G, P, n, ws.dgh, G, true, sv.hprev, P, false, nullptr,
                            dw.w_hh, P, false);
      if (has_biases) {
        column_sum(stream, n, G, ws.dgx, G, dw.b_ih);
        column_sum(stream, n, G, ws.dgh, G, dw.b_hh);
      }
      if (s.proj > 0)
        gemm<float, float, T>(s.policy, stream, P, H, n, ws.dh, P, true, sv.m, H, false, nullptr,
                              dw.w_hr, H, false);
      // dX (+)= dG_x W_ih, both directions summed.
      gemm<float, T, float>(s.policy, stream, n, in, G, ws.dgx, G, false, w.w_ih, in, false,
                            nullptr, dX, in, d > 0);
    }
    check_cuda(side.join(), "the reverse direction's stream");
    if (cp.on) break;  // one layer; dx is the caller's
    if (l > 0) {
      if (mask != nullptr && n > 0)
        launch(mask_kernel<float, T, float>, blocks_for(n * W), kThreads, stream, n * W, dX,
               mask + (l - 1) * n * W, dX);
      std::swap(dY, dX);
    } else {
      convert(stream, n, in, dX, in, dx, in);
    }
  }
}

#define SEQPACK_CUDA_INSTANTIATE(T)                                                                \
  template void forward<T>(const Shape&, const int64_t*, const std::vector<int64_t>&, bool,        \
                           const void* const*, const T*, const T*, const T*, const T*, T*, T*, T*, \
                           void*, void*, const CallerProducts&, cudaStream_t);                     \
  template void backward<T>(const Shape&, const int64_t*, const std::vector<int64_t>&, bool,       \
                            const void* const*, const T*, const T*, const T*, const T*, const T*,  \
                            T*, T*, T*, void* const*, void*, const void*, const CallerProducts&,   \
                            cudaStream_t);
SEQPACK_CUDA_INSTANTIATE(float)
SEQPACK_CUDA_INSTANTIATE(__half)
SEQPACK_CUDA_INSTANTIATE(__nv_bfloat16)
#undef SEQPACK_CUDA_INSTANTIATE

}  // namespace seqpack::cuda
