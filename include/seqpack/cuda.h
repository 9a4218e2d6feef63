/* seqpack/cuda.h: packed LSTM/GRU/RNN forward and backward on an NVIDIA GPU.
 *
 * A plain C interface (libseqpack_cuda.so) over device pointers, with the
 * semantics of PyTorch's packed RNN (torch._VF.lstm(data, batch_sizes, hx,
 * flat_weights, has_biases, num_layers, dropout, train, bidirectional)):
 *
 *   size_t ws, rs;
 *   seqpack_cuda_rnn_buffer_sizes(SEQPACK_CUDA_LSTM, SEQPACK_CUDA_FLOAT32,
 *       rows, batch, input_size, hidden, 0, layers, 1, &ws, &rs);
 *   // cudaMalloc ws and rs bytes, then
 *   if (seqpack_cuda_rnn_forward(SEQPACK_CUDA_LSTM, SEQPACK_CUDA_FLOAT32,
 *           steps, batch_sizes, batch, input_size, hidden, 0, layers, 1, 1,
 *           weights, x, h0, c0, NULL, y, hn, cn, ws_ptr, ws, rs_ptr, rs,
 *           1, 0, stream) != SEQPACK_CUDA_OK)
 *     fprintf(stderr, "%s\n", seqpack_cuda_last_error());
 *
 * Layout (all row-major, contiguous):
 *   batch_sizes  HOST array of `steps` int64, positive, non-increasing;
 *                rows = sum(batch_sizes); batch >= batch_sizes[0] (rows of
 *                h0 beyond batch_sizes[0] are zero-length sequences: their
 *                h_n/c_n are their h0/c0).
 *   x            (rows, input_size), step t's rows after step t-1's.
 *   h0, hn       (layers * dirs, batch, out) with out = proj ? proj : hidden.
 *   c0, cn       (layers * dirs, batch, hidden), LSTM only (else NULL).
 *   y            (rows, dirs * out); the reverse direction in the second half.
 *   weights      HOST array of device pointers in PyTorch's _flat_weights
 *                order: for each layer, for each direction: w_ih, w_hh,
 *                [b_ih, b_hh if has_biases], [w_hr if proj]. Gate order
 *                LSTM i,f,g,o; GRU r,z,n.
 *   dropout_mask NULL, or (layers - 1, rows, dirs * out): multiplies the
 *                input of layer l >= 1 (already scaled, e.g. 0 or 1/(1-p)).
 * dtype gives the type of every tensor argument (x, h0, c0, weights, masks,
 * outputs, gradients); the library accumulates in float32 and keeps the cell
 * state c and the gates in float32. Every device pointer is used on `stream`
 * (a cudaStream_t; NULL is the legacy default stream).
 *
 * Buffers: the forward pass needs a scratch `workspace` and a `reserve`
 * (both of at least the sizes that seqpack_cuda_rnn_buffer_sizes gives, in
 * training and in inference). The forward pass fills the reserve, and the
 * backward pass reads it: keep it unchanged in between. reserve_bytes is
 * exactly rows times the reserve size for rows = 1.
 *
 * Errors: every function returns SEQPACK_CUDA_OK (0) or an error code, and
 * seqpack_cuda_last_error() gives the message of the calling thread's last
 * error, naming the offending value.
 */
#ifndef SEQPACK_CUDA_H
#define SEQPACK_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SEQPACK_CUDA_ABI_VERSION 1

enum {
  SEQPACK_CUDA_OK = 0,
  SEQPACK_CUDA_INVALID_ARGUMENT = 1, /* bad sizes, pointers or buffer sizes */
  SEQPACK_CUDA_RUNTIME_ERROR = 2     /* an error of the CUDA runtime */
};

enum { /* mode */
  SEQPACK_CUDA_LSTM = 0,
  SEQPACK_CUDA_GRU = 1,
  SEQPACK_CUDA_RNN_TANH = 2,
  SEQPACK_CUDA_RNN_RELU = 3
};

enum { /* dtype */
  SEQPACK_CUDA_FLOAT32 = 0,
  SEQPACK_CUDA_FLOAT16 = 1,
  SEQPACK_CUDA_BFLOAT16 = 2
};

/* SEQPACK_CUDA_ABI_VERSION of the library. */
int seqpack_cuda_abi_version(void);

/* The calling thread's last error message ("" if none). */
const char* seqpack_cuda_last_error(void);

/* Bytes of workspace and reserve for these sizes (host only, no GPU). */
int seqpack_cuda_rnn_buffer_sizes(int mode, int dtype, int64_t rows,
                                  int64_t batch, int64_t input_size,
                                  int64_t hidden_size, int64_t proj_size,
                                  int64_t num_layers, int bidirectional,
                                  size_t* workspace_bytes,
                                  size_t* reserve_bytes);

/* Forward pass. c0/cn only for LSTM (else NULL); dropout_mask may be NULL.
 * allow_tf32 permits TF32 for float32 products (the current kernels compute
 * in full float32 either way). */
int seqpack_cuda_rnn_forward(
    int mode, int dtype, int64_t steps, const int64_t* batch_sizes,
    int64_t batch, int64_t input_size, int64_t hidden_size, int64_t proj_size,
    int64_t num_layers, int bidirectional, int has_biases,
    const void* const* weights, const void* x, const void* h0, const void* c0,
    const void* dropout_mask, void* y, void* hn, void* cn, void* workspace,
    size_t workspace_bytes, void* reserve, size_t reserve_bytes,
    int allow_tf32, void* stream);

/* Backward pass after a forward pass with the same arguments whose reserve
 * is passed unchanged. dy, dhn, dcn may be NULL (zero gradients). Writes dx
 * (rows, input_size), dh0, dc0 (LSTM; else NULL) and dweights (HOST array
 * of device pointers in the order and shapes of weights). */
int seqpack_cuda_rnn_backward(
    int mode, int dtype, int64_t steps, const int64_t* batch_sizes,
    int64_t batch, int64_t input_size, int64_t hidden_size, int64_t proj_size,
    int64_t num_layers, int bidirectional, int has_biases,
    const void* const* weights, const void* x, const void* h0, const void* c0,
    const void* dropout_mask, const void* dy, const void* dhn,
    const void* dcn, void* dx, void* dh0, void* dc0, void* const* dweights,
    void* workspace, size_t workspace_bytes, const void* reserve,
    size_t reserve_bytes, int allow_tf32, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* SEQPACK_CUDA_H */
