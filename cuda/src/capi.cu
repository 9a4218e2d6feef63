// libseqpack_cuda's C entry points (seqpack/cuda.h): each checks its
// arguments (checks.cuh), takes a copy of the installed policy (policy.cuh)
// and runs the pass (launch.cuh); an error is a status and the calling
// thread's message, never an exception across the C interface.
#include <string>
#include <vector>

#include "checks.cuh"
#include "launch.cuh"
#include "policy.cuh"
#include "seqpack/cuda.h"

namespace seqpack::cuda {
namespace {

template <typename F>
int guarded(F&& body) {
  try {
    g_last_error.clear();
    body();
    return SEQPACK_CUDA_OK;
  } catch (const Failure& f) {
    return f.status;
  } catch (const std::exception& e) {
    g_last_error = std::string("seqpack_cuda: ") + e.what();
    return SEQPACK_CUDA_RUNTIME_ERROR;
  }
}

}  // namespace
}  // namespace seqpack::cuda

using namespace seqpack::cuda;

// The library is built with hidden visibility; these are its whole interface.
#define SEQPACK_CUDA_EXPORT __attribute__((visibility("default")))

extern "C" {

SEQPACK_CUDA_EXPORT int seqpack_cuda_abi_version(void) { return SEQPACK_CUDA_ABI_VERSION; }

SEQPACK_CUDA_EXPORT const char* seqpack_cuda_last_error(void) { return g_last_error.c_str(); }

SEQPACK_CUDA_EXPORT int seqpack_cuda_set_policy(const seqpack_cuda_policy* policy) {
  return guarded([&] {
    require(policy, "policy");
    install_policy(*policy);
  });
}

SEQPACK_CUDA_EXPORT int seqpack_cuda_get_policy(seqpack_cuda_policy* policy) {
  return guarded([&] {
    require(policy, "policy");
    *policy = installed_policy();
  });
}

SEQPACK_CUDA_EXPORT int seqpack_cuda_rnn_buffer_sizes(int mode, int dtype, int64_t rows,
                                                      int64_t batch, int64_t input_size,
                                                      int64_t hidden_size, int64_t proj_size,
                                                      int64_t num_layers, int bidirectional,
                                                      size_t* workspace_bytes,
                                                      size_t* reserve_bytes) {
  return guarded([&] {
    require(workspace_bytes, "workspace_bytes");
    require(reserve_bytes, "reserve_bytes");
    const Shape s = check_shape(mode, dtype, rows, batch, input_size, hidden_size, proj_size,
                                num_layers, bidirectional);
    *workspace_bytes = static_cast<size_t>(s.workspace_bytes());
    *reserve_bytes = static_cast<size_t>(s.reserve_bytes());
  });
}

SEQPACK_CUDA_EXPORT int seqpack_cuda_rnn_forward(const seqpack_cuda_rnn_args* args) {
  return guarded([&] {
    require(args, "args");
    const seqpack_cuda_rnn_args& a = *args;
    const int mode = a.mode, dtype = a.dtype, has_biases = a.has_biases;
    const auto* batch_sizes = a.batch_sizes;
    const void* const* weights = a.weights;
    const void *x = a.x, *h0 = a.h0, *c0 = a.c0, *dropout_mask = a.dropout_mask;
    void *y = a.y, *hn = a.hn, *cn = a.cn, *workspace = a.workspace, *reserve = a.reserve;
    const std::vector<int64_t> off = check_batch_sizes(a.steps, batch_sizes, a.batch, a.rows);
    Shape shape = check_shape(mode, dtype, off.back(), a.batch, a.input_size, a.hidden_size,
                              a.proj_size, a.num_layers, a.bidirectional);
    shape.policy = installed_policy();
    const Shape s = with_tf32(shape, a.allow_tf32);
    check_weights(s, has_biases != 0, weights, "weights");
    check_buffers(s, a.workspace_bytes, workspace, a.reserve_bytes, reserve);
    const CallerProducts cp = caller_products(s, a, false);
    if (s.rows > 0) {
      if (!cp.on) require(x, "x");
      require(y, "y");
    }
    if (s.batch > 0) {
      require(h0, "h0");
      require(hn, "hn");
      if (s.lstm()) {
        require(c0, "c0");
        require(cn, "cn");
      }
    }
    auto st = static_cast<cudaStream_t>(a.stream);
    (void)cudaGetLastError();  // clears a launch error left by others, not ours to report
    switch (dtype) {
      case SEQPACK_CUDA_FLOAT32:
        forward<float>(s, batch_sizes, off, has_biases != 0, weights, static_cast<const float*>(x),
                       static_cast<const float*>(h0), static_cast<const float*>(c0),
                       static_cast<const float*>(dropout_mask), static_cast<float*>(y),
                       static_cast<float*>(hn), static_cast<float*>(cn), workspace, reserve, cp,
                       st);
        break;
      case SEQPACK_CUDA_FLOAT16:
        forward<__half>(s, batch_sizes, off, has_biases != 0, weights,
                        static_cast<const __half*>(x), static_cast<const __half*>(h0),
                        static_cast<const __half*>(c0), static_cast<const __half*>(dropout_mask),
                        static_cast<__half*>(y), static_cast<__half*>(hn), static_cast<__half*>(cn),
                        workspace, reserve, cp, st);
        break;
      default:
        forward<__nv_bfloat16>(
            s, batch_sizes, off, has_biases != 0, weights, static_cast<const __nv_bfloat16*>(x),
            static_cast<const __nv_bfloat16*>(h0), static_cast<const __nv_bfloat16*>(c0),
            static_cast<const __nv_bfloat16*>(dropout_mask), static_cast<__nv_bfloat16*>(y),
            static_cast<__nv_bfloat16*>(hn), static_cast<__nv_bfloat16*>(cn), workspace, reserve,
            cp, st);
        break;
    }
    check_cuda(cudaGetLastError(), "a kernel launch of the forward pass");
  });
}

SEQPACK_CUDA_EXPORT int seqpack_cuda_rnn_backward(const seqpack_cuda_rnn_args* args) {
  // h0 and c0 are not read (the reserve holds every row's h_{t-1} and
  // c_{t-1}).
  return guarded([&] {
    require(args, "args");
    const seqpack_cuda_rnn_args& a = *args;
    const int mode = a.mode, dtype = a.dtype, has_biases = a.has_biases;
    const auto* batch_sizes = a.batch_sizes;
    const void* const* weights = a.weights;
    void* const* dweights = a.dweights;
    const void *x = a.x, *dropout_mask = a.dropout_mask, *dy = a.dy, *dhn = a.dhn, *dcn = a.dcn;
    const void* reserve = a.reserve;
    void *dx = a.dx, *dh0 = a.dh0, *dc0 = a.dc0, *workspace = a.workspace;
    const std::vector<int64_t> off = check_batch_sizes(a.steps, batch_sizes, a.batch, a.rows);
    Shape shape = check_shape(mode, dtype, off.back(), a.batch, a.input_size, a.hidden_size,
                              a.proj_size, a.num_layers, a.bidirectional);
    shape.policy = installed_policy();
    const Shape s = with_tf32(shape, a.allow_tf32);
    check_weights(s, has_biases != 0, weights, "weights");
    const CallerProducts cp = caller_products(s, a, true);
    if (!cp.on) check_weights(s, has_biases != 0, dweights, "dweights");
    check_buffers(s, a.workspace_bytes, workspace, a.reserve_bytes, reserve);
    if (s.rows > 0 && !cp.on) {
      require(x, "x");
      require(dx, "dx");
    }
    if (s.batch > 0) {
      require(dh0, "dh0");
      if (s.lstm()) require(dc0, "dc0");
    }
    auto st = static_cast<cudaStream_t>(a.stream);
    (void)cudaGetLastError();  // clears a launch error left by others, not ours to report
    switch (dtype) {
      case SEQPACK_CUDA_FLOAT32:
        backward<float>(s, batch_sizes, off, has_biases != 0, weights, static_cast<const float*>(x),
                        static_cast<const float*>(dropout_mask), static_cast<const float*>(dy),
                        static_cast<const float*>(dhn), static_cast<const float*>(dcn),
                        static_cast<float*>(dx), static_cast<float*>(dh0), static_cast<float*>(dc0),
                        dweights, workspace, reserve, cp, st);
        break;
      case SEQPACK_CUDA_FLOAT16:
        backward<__half>(s, batch_sizes, off, has_biases != 0, weights,
                         static_cast<const __half*>(x), static_cast<const __half*>(dropout_mask),
                         static_cast<const __half*>(dy), static_cast<const __half*>(dhn),
                         static_cast<const __half*>(dcn), static_cast<__half*>(dx),
                         static_cast<__half*>(dh0), static_cast<__half*>(dc0), dweights, workspace,
                         reserve, cp, st);
        break;
      default:
        backward<__nv_bfloat16>(
            s, batch_sizes, off, has_biases != 0, weights, static_cast<const __nv_bfloat16*>(x),
            static_cast<const __nv_bfloat16*>(dropout_mask), static_cast<const __nv_bfloat16*>(dy),
            static_cast<const __nv_bfloat16*>(dhn), static_cast<const __nv_bfloat16*>(dcn),
            static_cast<__nv_bfloat16*>(dx), static_cast<__nv_bfloat16*>(dh0),
            static_cast<__nv_bfloat16*>(dc0), dweights, workspace, reserve, cp, st);
        break;
    }
    check_cuda(cudaGetLastError(), "a kernel launch of the backward pass");
  });
}

#ifdef SEQPACK_CUDA_EMULATE
// The emulated library only (tests): the one-launch kernels' launches since
// the last call, as (grid blocks, cluster blocks; 0 for a cooperative grid)
// pairs in blocks[0..2n) for the first n <= capacity of them; returns how many
// there were, and forgets them.
SEQPACK_CUDA_EXPORT int seqpack_cuda_emulated_grid_launches(unsigned* blocks, int capacity) {
  std::vector<GridLaunch>& launches = grid_launches();
  const int n = static_cast<int>(launches.size());
  for (int i = 0; i < n && i < capacity; ++i) {
    blocks[2 * i] = launches[i].blocks;
    blocks[2 * i + 1] = launches[i].cluster;
  }
  launches.clear();
  return n;
}
#endif

}  // extern "C"
