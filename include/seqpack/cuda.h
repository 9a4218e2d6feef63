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
 *   seqpack_cuda_rnn_args a = {0};
 *   a.mode = SEQPACK_CUDA_LSTM; a.dtype = SEQPACK_CUDA_FLOAT32;
 *   a.rows = rows; a.steps = steps; a.batch_sizes = batch_sizes;
 *   a.batch = batch; a.input_size = input_size; a.hidden_size = hidden;
 *   a.num_layers = layers; a.bidirectional = 1; a.has_biases = 1;
 *   a.weights = weights; a.x = x; a.h0 = h0; a.c0 = c0;
 *   a.y = y; a.hn = hn; a.cn = cn;
 *   a.workspace = ws_ptr; a.workspace_bytes = ws;
 *   a.reserve = rs_ptr; a.reserve_bytes = rs; a.stream = stream;
 *   if (seqpack_cuda_rnn_forward(&a) != SEQPACK_CUDA_OK)
 *     fprintf(stderr, "%s\n", seqpack_cuda_last_error());
 *
 * Layout (all row-major, contiguous):
 *   batch_sizes  HOST array of `steps` int64, positive, non-increasing;
 *                rows = sum(batch_sizes) (checked against the rows given);
 *                batch >= batch_sizes[0] (rows of
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
 *
 * Policy: which kernels run (seqpack_cuda_policy below) is the caller's
 * choice, installed once with seqpack_cuda_set_policy and read by every later
 * call; the library reads no environment variable. seqpack's front ends (the
 * Python glue seqpack/_cuda.py and the torch operators seqpack_torch/
 * cuda_ops.cpp) fill it from the SEQPACK_CUDA_* variables (docs/gpu-build.md)
 * when they load the library.
 */
#ifndef SEQPACK_CUDA_H
#define SEQPACK_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SEQPACK_CUDA_ABI_VERSION 4

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

#define SEQPACK_CUDA_POLICY_VERSION 1

enum { /* seqpack_cuda_policy.kernel: the recurrence's kernels */
  SEQPACK_CUDA_KERNEL_SIMPLE = 0,     /* a few launches per step */
  SEQPACK_CUDA_KERNEL_PERSISTENT = 1, /* a layer's recurrence in one cooperative
                                         launch where it fits, else simple */
  SEQPACK_CUDA_KERNEL_CLUSTER = 2     /* on thread-block clusters (sm_90) where
                                         they fit, else persistent, else simple */
};

enum { /* seqpack_cuda_policy.gemm: the products' kernel */
  SEQPACK_CUDA_GEMM_SIMT = 0, /* every product on the SIMT kernel */
  SEQPACK_CUDA_GEMM_WMMA = 1  /* products with 16-bit operands on tensor cores */
};

enum { /* seqpack_cuda_policy.cluster_gather */
  SEQPACK_CUDA_GATHER_SHARED = 0, /* through shared memory where it fits */
  SEQPACK_CUDA_GATHER_GLOBAL = 1  /* always through global memory */
};

/* Which kernels the library runs: the choices that do not change results
 * beyond rounding. Start from seqpack_cuda_get_policy's (before any
 * seqpack_cuda_set_policy: the defaults, noted below) and change fields. The
 * SEQPACK_CUDA_* variable each field stands for is in brackets. */
typedef struct seqpack_cuda_policy {
  int version;        /* SEQPACK_CUDA_POLICY_VERSION */
  int kernel;         /* SEQPACK_CUDA_KERNEL_*; default SIMPLE [SEQPACK_CUDA_KERNEL] */
  int gemm;           /* SEQPACK_CUDA_GEMM_*; default SIMT [SEQPACK_CUDA_GEMM] */
  int gemm_tile;      /* 0 (default): 64, or 32 where 64 gives a product fewer
                         than 264 blocks; 32 or 64 forces it [SEQPACK_CUDA_GEMM_TILE] */
  int cluster_size;   /* 0 (default): the largest power of two up to 16 that
                         leaves each block 4 hidden units or more; 1 to 16
                         forces it (at most H) [SEQPACK_CUDA_CLUSTER] */
  int cluster_gather; /* SEQPACK_CUDA_GATHER_*; default SHARED
                         [SEQPACK_CUDA_CLUSTER_GATHER] */
  int cluster_mma;    /* 1 (default): the cluster kernels' step products on
                         tensor cores where they can; 0: the threads' float32
                         products [SEQPACK_CUDA_CLUSTER_MMA] */
  int tf32;           /* 1 (default): a call's allow_tf32 holds; 0: float32
                         products never run as TF32, whatever allow_tf32 says */
} seqpack_cuda_policy;

/* Installs `policy` for every later call of any thread (calls running keep
 * the one they started with). Every field is checked: a value out of range is
 * an error naming the field and the value, and leaves the policy unchanged. */
int seqpack_cuda_set_policy(const seqpack_cuda_policy* policy);

/* The policy installed (the defaults before any). */
int seqpack_cuda_get_policy(seqpack_cuda_policy* policy);

/* Bytes of workspace and reserve for these sizes (host only, no GPU). */
int seqpack_cuda_rnn_buffer_sizes(int mode, int dtype, int64_t rows,
                                  int64_t batch, int64_t input_size,
                                  int64_t hidden_size, int64_t proj_size,
                                  int64_t num_layers, int bidirectional,
                                  size_t* workspace_bytes,
                                  size_t* reserve_bytes);

/* The arguments of a forward or a backward pass: one struct, so that a
 * caller fills the sizes once per configuration and the pointers per call.
 * Zero-initialise it, then set what the pass reads. */
typedef struct seqpack_cuda_rnn_args {
  int mode;          /* SEQPACK_CUDA_LSTM, ... */
  int dtype;         /* SEQPACK_CUDA_FLOAT32, ... */
  int bidirectional; /* 0 or 1 */
  int has_biases;    /* 0 or 1 */
  int allow_tf32;    /* 0 or 1: float32 step products may run on tensor
                        cores, as 3xTF32 (float32's accuracy; the cluster
                        kernels, SEQPACK_CUDA_KERNEL_CLUSTER, where H is a
                        multiple of 16) unless the policy's tf32 is 0; other
                        products stay float32 */
  int caller_products; /* 0: the library runs every product; 1: one layer
                          whose products that are not recurrent the caller
                          runs (below, after dweights) */
  int64_t rows;      /* rows of x and y: sum(batch_sizes) */
  int64_t steps;
  const int64_t* batch_sizes; /* HOST, `steps` of them */
  int64_t batch;
  int64_t input_size;
  int64_t hidden_size;
  int64_t proj_size; /* 0: none (LSTM only) */
  int64_t num_layers;
  const void* const* weights; /* HOST array of device pointers */
  const void* x;
  const void* h0;
  const void* c0;           /* LSTM only, else NULL */
  const void* dropout_mask; /* or NULL */
  void* workspace;
  size_t workspace_bytes;
  void* reserve; /* written by the forward, read by the backward */
  size_t reserve_bytes;
  void* stream;  /* a cudaStream_t; NULL is the legacy default stream */
  /* Forward: its outputs. */
  void* y;
  void* hn;
  void* cn; /* LSTM only, else NULL */
  /* Backward: the gradients of the outputs (each may be NULL: zero) and the
   * gradients it writes: dx (rows, input_size), dh0, dc0 (LSTM; else NULL)
   * and dweights (HOST array of device pointers in the order and shapes of
   * weights). */
  const void* dy;
  const void* dhn;
  const void* dcn;
  void* dx;
  void* dh0;
  void* dc0;
  void* const* dweights;
  /* caller_products = 1: one layer (num_layers = 1) whose products that are
   * not recurrent the caller runs (as cuBLAS products through torch, say).
   * The forward reads input_gates instead of x, w_ih and b_ih; the backward
   * writes dh0, dc0 and the buffers below instead of dx and dweights, and
   * reads neither x nor dweights. Per direction d < dirs (entries beyond are NULL), with
   * G = gates * hidden_size and P = proj_size or hidden_size, each
   * (rows, width) row-major, float32 except input_gates (dtype):
   *   input_gates[d] (rows, G)  x W_ih^T + b_ih (b_ih if has_biases)
   *   dgates_x[d]    (rows, G)  the gradient of input_gates
   *   dgates_h[d]    (rows, G)  GRU: of h_{t-1} W_hh^T + b_hh (its n part
   *                             differs: r times); else NULL (dgates_x's)
   *   hprev[d]       (rows, P)  h_{t-1} of each row
   *   dh[d]          (rows, P)  proj only (else NULL): the gradient of h
   *   m[d]        (rows, hidden) proj only (else NULL): o * tanh(c)
   * whence dW_ih = dgates_x^T x, db_ih = the column sums of dgates_x,
   * dW_hh = dgates_h^T hprev, db_hh its column sums, dW_hr = dh^T m and
   * dx = the sum over d of dgates_x W_ih. */
  const void* input_gates[2];
  float* dgates_x[2];
  float* dgates_h[2];
  float* hprev[2];
  float* dh[2];
  float* m[2];
} seqpack_cuda_rnn_args;

/* Forward pass: y, hn, cn from x, h0, c0 and the weights. */
int seqpack_cuda_rnn_forward(const seqpack_cuda_rnn_args* args);

/* Backward pass after a forward pass with the same arguments whose reserve
 * is passed unchanged. */
int seqpack_cuda_rnn_backward(const seqpack_cuda_rnn_args* args);

#ifdef __cplusplus
}
#endif

#endif /* SEQPACK_CUDA_H */
