"""bench/torch_noop_op.cpp, the floor bench/bench_torch_overhead.py measures
seqpack::rnn against: seqpack_bench::noop_rnn takes seqpack::rnn's arguments
and gives outputs and gradients of seqpack::rnn's shapes (so the benchmark
times the same autograd graph). Skipped where the library was not built
(-DSEQPACK_BUILD_TORCH=ON -DSEQPACK_BUILD_BENCHMARKS=ON)."""
import os

import pytest
import torch

import seqpack.torch as spt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY = os.path.join(ROOT, os.environ.get("SEQPACK_BUILD_DIR", "build"), "bench",
                       "libseqpack_bench_torch_noop.so")
pytestmark = pytest.mark.skipif(not os.path.exists(LIBRARY),
                                reason=f"no benchmark operator library {LIBRARY}")


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_noop_rnn_has_seqpack_rnn_shapes(mode):
    torch.ops.load_library(LIBRARY)
    lstm = mode == "LSTM"
    cls = spt.LSTM if lstm else spt.GRU
    m = cls(3, 4, num_layers=2, bidirectional=True, **({"proj_size": 2} if lstm else {}))
    x = torch.randn(5, 3, 3)
    packed = spt.pack_padded_sequence(x, torch.tensor([5, 0, 2]), enforce_sorted=False)
    hr = 2 if lstm else 4
    shapes = []
    for op in (torch.ops.seqpack.rnn, torch.ops.seqpack_bench.noop_rnn):
        data = packed.data.detach().requires_grad_()
        h0 = torch.zeros(4, 3, hr, requires_grad=True)
        c0 = torch.zeros(4, 3, 4, requires_grad=True) if lstm else None
        weights = [w.detach().requires_grad_() for w in m._flat_weights]
        out = op(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices, h0,
                 c0, weights, m.mode, m.hidden_size, m.num_layers, m.bias, m.bidirectional,
                 m.proj_size, 0.0, True)
        out[0].sum().backward()
        leaves = [data, h0] + ([c0] if lstm else []) + weights
        shapes.append(([tuple(t.shape) for t in out],
                       [None if t.grad is None else tuple(t.grad.shape) for t in leaves]))
    assert shapes[0] == shapes[1]
