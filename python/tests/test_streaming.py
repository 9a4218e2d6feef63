"""seqpack.streaming (NumPy) and seqpack.torch_streaming (torch): random
schedules (seeded; the seed is in the test id and printed) feed sequences in
random chunks, interleaved, with streams opening mid-flight; the outputs and
final states equal one forward over each whole sequence: within 1e-6 in
float32, exactly in float64 (the same core); torch.nn's own forward agrees
within 1e-5 / 1e-12. Bad ids, chunks and models raise ValueError/TypeError."""
import numpy as np
import pytest
import torch

import seqpack
import seqpack.nn
from seqpack.streaming import StreamingRNN
from seqpack.torch_streaming import StreamingRNN as TorchStreamingRNN

from helpers import assert_close, base_seed
from tolerance import assert_like_torch


def schedule(rng, lengths):
    """Pushes as lists of (sequence, start, stop); sequence s opens before its first
    push (at a random push), chunks are random pieces, some of length 0."""
    n = len(lengths)
    fed = [0] * n
    opened = 0
    pushes = []
    while opened < n or any(f < l for f, l in zip(fed, lengths)):
        if opened < n and (opened == 0 or rng.random() < 0.5):
            opened += 1
        push = []
        for s in rng.permutation(opened):
            left = lengths[s] - fed[s]
            if rng.random() < 0.3 or (left == 0 and rng.random() < 0.5):
                continue
            k = int(rng.integers(0, left + 1))
            push.append((int(s), fed[s], fed[s] + k))
            fed[s] += k
        pushes.append((opened, push))
    return pushes


def feed(streams, seqs, rng):
    """Runs a random schedule of `seqs` through `streams`; returns the stream ids and
    each sequence's chunk outputs in order."""
    ids, outs = {}, {s: [] for s in range(len(seqs))}
    for opened, push in schedule(rng, [len(x) for x in seqs]):
        for s in range(len(ids), opened):
            ids[s] = streams.open()
        ys = streams.push([ids[s] for s, _, _ in push], [seqs[s][a:b] for s, a, b in push])
        for (s, a, b), y in zip(push, ys):
            assert tuple(y.shape)[0] == b - a
            outs[s].append(y)
    return ids, outs


CASES = [("LSTM", 1, np.float32), ("LSTM", 2, np.float64), ("GRU", 2, np.float32),
         ("GRU", 1, np.float64), ("RNN", 3, np.float32), ("RNN", 2, np.float64)]


def make_nn(mode, layers, dtype, seed):
    cls = {"LSTM": seqpack.nn.LSTM, "GRU": seqpack.nn.GRU, "RNN": seqpack.nn.RNN}[mode]
    return cls(3, 5, num_layers=layers, dtype=dtype, seed=seed)


@pytest.mark.parametrize("k", range(3))
@pytest.mark.parametrize("mode,layers,dtype", CASES)
def test_numpy_random_schedule_matches_whole_forward(mode, layers, dtype, k):
    seed = base_seed() + 17 * k + layers
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    m = make_nn(mode, layers, dtype, seed)
    lengths = [int(x) for x in rng.integers(0, 15, size=7)]
    seqs = [rng.uniform(-1, 1, size=(n, 3)).astype(dtype) for n in lengths]
    streams = StreamingRNN(m)
    ids, outs = feed(streams, seqs, rng)
    for s, x in enumerate(seqs):
        got = np.concatenate(outs[s]) if outs[s] else np.zeros((0, 5), dtype)
        state = streams.state(ids[s])
        h = state[0] if mode == "LSTM" else state
        if len(x) == 0:  # never ran: still the zero initial state
            assert got.shape == (0, 5) and not np.any(h)
            continue
        whole, hn = m(x[:, None, :], requires_grad=False)
        h_whole = (hn[0] if mode == "LSTM" else hn)[:, 0, :]
        if dtype == np.float64:
            np.testing.assert_array_equal(got, whole[:, 0, :], err_msg=f"seed {seed}, seq {s}")
            np.testing.assert_array_equal(h, h_whole, err_msg=f"seed {seed}, seq {s}")
            if mode == "LSTM":
                np.testing.assert_array_equal(state[1], hn[1][:, 0, :])
        else:
            assert_close(got, whole[:, 0, :], 1e-6, 1e-6, f"seed {seed}, seq {s} output")
            assert_close(h, h_whole, 1e-6, 1e-6, f"seed {seed}, seq {s} h")


@pytest.mark.parametrize("seqpack_module", [False, True])
@pytest.mark.parametrize("mode,layers,dtype", [("LSTM", 2, torch.float32), ("GRU", 1, torch.float64),
                                               ("RNN", 2, torch.float32), ("LSTM", 1, torch.float64)])
def test_torch_random_schedule_matches_whole_forward(mode, layers, dtype, seqpack_module):
    import seqpack.torch as st
    seed = base_seed() + layers + (100 if seqpack_module else 0)
    print(f"seed {seed}")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    ns = st if seqpack_module else torch.nn
    m = getattr(ns, mode)(3, 6, num_layers=layers).to(dtype).eval()
    lengths = [int(x) for x in rng.integers(1, 12, size=6)]
    seqs = [torch.from_numpy(rng.uniform(-1, 1, size=(n, 3))).to(dtype) for n in lengths]
    streams = TorchStreamingRNN(m)
    ids, outs = feed(streams, seqs, rng)
    # The same core's whole forward (seqpack.torch over a packed batch of one).
    core = getattr(st, mode)(3, 6, num_layers=layers).to(dtype).eval()
    core.load_state_dict(m.state_dict())
    with torch.no_grad():
        for s, x in enumerate(seqs):
            got = torch.cat(outs[s])
            state = streams.state(ids[s])
            h = state[0] if mode == "LSTM" else state
            want, hn = core(x[:, None, :])
            h_want = (hn[0] if mode == "LSTM" else hn)[:, 0, :]
            if dtype == torch.float64:
                assert torch.equal(got, want[:, 0, :]), f"seed {seed}, seq {s}"
                assert torch.equal(h, h_want), f"seed {seed}, seq {s}"
            else:
                assert_close(got.numpy(), want[:, 0, :].numpy(), 1e-6, 1e-6, f"seed {seed} seq {s}")
                assert_close(h.numpy(), h_want.numpy(), 1e-6, 1e-6, f"seed {seed} seq {s} h")
            if not seqpack_module:
                # torch's own kernels: the bound of a code path against another.
                torch_out, _ = m(x[:, None, :])
                assert_like_torch(got, torch_out[:, 0, :], m, [len(x)], f"vs torch, seq {s}")


def test_module_updates_are_seen_and_state_round_trips():
    m = torch.nn.GRU(2, 3)
    streams = TorchStreamingRNN(m)
    a = streams.open()
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
    (y,) = streams.push([a], [torch.ones(4, 2)])
    assert torch.equal(y, torch.zeros(4, 3))  # zero weights: h stays 0
    h0 = torch.full((1, 3), 0.25)
    streams.reset(a, h0)
    assert torch.equal(streams.state(a), h0)
    assert a in streams and len(streams) == 1 and streams.open_ids() == [a]
    streams.close(a)
    assert a not in streams


def test_bad_input_is_a_clear_error():
    lstm = seqpack.nn.LSTM(2, 3)
    s = StreamingRNN(lstm)
    a, b = s.open(), s.open()
    s.close(b)
    ok = np.zeros((2, 2), np.float32)
    with pytest.raises(ValueError, match=r"stream_ids\[1\] = 9: no stream 9 was opened"):
        s.push([a, 9], [ok, ok])
    with pytest.raises(ValueError, match="stream 1 was closed"):
        s.push([b], [ok])
    with pytest.raises(ValueError, match=r"stream_ids\[1\] = 0 repeats stream_ids\[0\]"):
        s.push([a, a], [ok, ok])
    with pytest.raises(ValueError, match=r"chunks\[0\] has shape \[2, 4\]"):
        s.push([a], [np.zeros((2, 4), np.float32)])
    with pytest.raises(ValueError, match=r"chunks\[0\] has dtype float64"):
        s.push([a], [np.zeros((2, 2))])
    with pytest.raises(TypeError, match=r"stream_ids\[0\]"):
        s.push(["a"], [ok])
    with pytest.raises(TypeError, match=r"tuple \(h, c\)"):
        s.open(np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="bidirectional"):
        StreamingRNN(seqpack.nn.GRU(2, 3, bidirectional=True))
    with pytest.raises(TypeError, match="seqpack.nn"):
        StreamingRNN(torch.nn.GRU(2, 3))
    with pytest.raises(ValueError, match="bidirectional"):
        TorchStreamingRNN(torch.nn.LSTM(2, 3, bidirectional=True))
    with pytest.raises(TypeError, match="LSTM, GRU or RNN"):
        TorchStreamingRNN(torch.nn.Linear(2, 3))
    t = TorchStreamingRNN(torch.nn.LSTM(2, 3))
    with pytest.raises(ValueError, match="no stream 4"):
        t.push([4], [torch.zeros(1, 2)])
    with pytest.raises(TypeError, match=r"chunks\[0\] has dtype torch.int64"):
        t.push([t.open()], [torch.zeros(1, 2, dtype=torch.int64)])


@pytest.mark.parametrize("make", [lambda: TorchStreamingRNN(torch.nn.LSTM(2, 3)),
                                  lambda: StreamingRNN(seqpack.nn.LSTM(2, 3))],
                         ids=["torch", "numpy"])
def test_stream_ids_past_int64_are_named_range_errors(make):
    """An id past int64 reached pybind11 from seqpack.torch's StreamingRNN, which
    raised a bare "incompatible function arguments" TypeError; both classes name it
    (docs/errors.md, integers outside int64)."""
    s = make()
    a = s.open()
    chunk = np.zeros((1, 2), np.float32) if isinstance(s, StreamingRNN) else torch.zeros(1, 2)
    big = r"is out of range: must be in \[-9223372036854775808, 9223372036854775807\]"
    with pytest.raises(ValueError, match=r"stream_ids\[1\] = 9223372036854775808 " + big):
        s.push([a, 2**63], [chunk, chunk])
    with pytest.raises(ValueError, match=r"stream_id = 18446744073709551616 " + big):
        s.state(2**64)
    with pytest.raises(ValueError, match=r"stream_id = 18446744073709551616 " + big):
        s.close(2**64)
    with pytest.raises(ValueError, match=r"stream_id = -9223372036854775809 " + big):
        s.reset(-2**63 - 1)
    with pytest.raises(ValueError, match=r"stream_id = 18446744073709551616 " + big):
        2**64 in s
    with pytest.raises(TypeError, match=r"stream_ids\[0\]"):
        s.push([1.5], [chunk])
    # In range: the stream still works.
    assert len(s.push([a], [chunk])) == 1
