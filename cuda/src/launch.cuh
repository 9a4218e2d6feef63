// The launchers: a call's forward and backward passes over the kernels of
// kernels.cuh, on the buffers of layouts.cuh, with the kernels choice.cuh
// picks. The arguments are checked before (checks.cuh, capi.cu).
#pragma once

#include <cstdint>
#include <vector>

#include "checks.cuh"

namespace seqpack::cuda {

// forward<T> and backward<T> for T = float, __half and __nv_bfloat16 (launch.cu).
template <typename T>
void forward(const Shape& s, const int64_t* batch_sizes, const std::vector<int64_t>& off,
             bool has_biases, const void* const* weights_v, const T* x, const T* h0, const T* c0,
             const T* mask, T* y, T* hn, T* cn, void* workspace, void* reserve,
             const CallerProducts& cp, cudaStream_t main_stream);

template <typename T>
void backward(const Shape& s, const int64_t* batch_sizes, const std::vector<int64_t>& off,
              bool has_biases, const void* const* weights_v, const T* x, const T* mask, const T* dy,
              const T* dhn, const T* dcn, T* dx, T* dh0, T* dc0, void* const* dweights_v,
              void* workspace, const void* reserve, const CallerProducts& cp,
              cudaStream_t main_stream);

}  // namespace seqpack::cuda
