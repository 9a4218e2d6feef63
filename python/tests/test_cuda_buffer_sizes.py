"""seqpack_cuda_rnn_buffer_sizes within the library's own limits (issue 41, item 7).

Sizes that check_shape accepts (rows up to 2^40, hidden up to 2^40, layers up
to 2^20) can still make the workspace or reserve pass 2^63 bytes: that is an
error naming the sizes, never a wrapped (0-byte) size that check_buffers would
then accept. Run on the CPU through the emulated library (cuda_emulated.py).
"""
import ctypes
import os
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_emulated  # noqa: E402


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    return cuda_emulated.emulated(tmp_path_factory)


LSTM, GRU, F32, BF16 = 0, 1, 0, 2


def reference(mode, dtype, rows, batch, inp, hidden, proj, layers, dirs):
    """The byte counts in Python's unbounded integers, from docs of the reserve/workspace layout."""
    hout = proj if proj > 0 else hidden
    gates = (4 if mode == LSTM else 3 if mode == GRU else 1) * hidden
    width = dirs * hout
    floats = gates + hout + (2 * hidden if mode == LSTM else 0) + (hidden if proj > 0 else 0) + \
        (hidden if mode == GRU else 0)
    esize = 4 if dtype == F32 else 2
    reserve = rows * (4 * layers * dirs * floats + esize * 2 * (layers - 1) * width)
    # Shared by the directions: dG_x, dG_h (GRU), two dY; each direction's own:
    # a copy of batch_sizes, dh (rows), gh, dm (proj), the two carries (batch).
    per_row = gates * (2 if mode == GRU else 1) + 2 * max(width, inp) + dirs * hout
    per_batch = dirs * (gates + (hidden if proj > 0 else 0) + hout + hidden)
    workspace = 8 * dirs * rows + 4 * (rows * per_row + batch * per_batch)
    return workspace, reserve


def sizes(lib, *args):
    ws, rs = ctypes.c_size_t(), ctypes.c_size_t()
    status = lib.seqpack_cuda_rnn_buffer_sizes(*args, ctypes.byref(ws), ctypes.byref(rs))
    return status, ws.value, rs.value


def test_buffer_sizes_overflow_is_an_error(emulated):
    lib = emulated.lib
    # The case: the reserve wrapped to 0 bytes.
    big = (LSTM, F32, 1 << 40, 1, 1, 1 << 20, 0, 1 << 16, 1)
    assert reference(*big[:8], 2)[1] >= 1 << 63
    status, _, _ = sizes(lib, *big)
    assert status == 1
    message = lib.seqpack_cuda_last_error()
    assert b"rows 1099511627776" in message and b"hidden 1048576" in message
    assert b"layers 65536, bidirectional need more than 2^63 bytes" in message
    # The workspace alone past 2^63 (one layer, one direction, huge input).
    status, _, _ = sizes(lib, GRU, F32, 1 << 40, 1 << 40, 1 << 40, 1 << 40, 0, 1, 0)
    assert status == 1 and b"need more than 2^63 bytes" in lib.seqpack_cuda_last_error()


@pytest.mark.parametrize("args", [
    (LSTM, F32, 1 << 30, 4, 1 << 10, 1 << 12, 0, 4, 2),
    (GRU, BF16, 1 << 20, 1 << 20, 1 << 16, 1 << 16, 0, 3, 1),
    (LSTM, BF16, 1 << 24, 8, 100, 1 << 14, 1 << 10, 2, 2),
])
def test_buffer_sizes_that_fit_match_the_reference(emulated, args):
    lib = emulated.lib
    status, ws, rs = sizes(lib, *args[:8], 1 if args[8] == 2 else 0)
    assert status == 0, lib.seqpack_cuda_last_error()
    assert (ws, rs) == reference(*args)


def test_check_buffers_refuses_the_overflowing_shape(emulated):
    # forward checks the caller's buffers with the same sums: where the reserve
    # wrapped to 0 bytes, any buffer passed. Now the shape is refused whatever
    # buffer sizes it is given (here the largest size_t, and non-NULL pointers).
    lib = emulated.lib
    rows, hidden, layers = 1 << 40, 1 << 20, 1 << 16
    bs = (ctypes.c_int64 * 1)(rows)
    weights = (ctypes.c_void_p * (layers * 2 * 4))(*([8] * (layers * 2 * 4)))
    fake = ctypes.c_void_p(8)
    most = ctypes.c_size_t(-1).value
    a = cuda_emulated.RnnArgs(mode=LSTM, dtype=F32, rows=rows, steps=1, batch_sizes=bs, batch=rows, input_size=1,
                         hidden_size=hidden, num_layers=layers, bidirectional=1, has_biases=1, weights=weights,
                         x=fake, h0=fake, c0=fake, y=fake, hn=fake, cn=fake, workspace=fake, workspace_bytes=most,
                         reserve=fake, reserve_bytes=most)
    status = lib.seqpack_cuda_rnn_forward(ctypes.byref(a))
    assert status == 1
    assert b"need more than 2^63 bytes" in lib.seqpack_cuda_last_error()
