"""torch's edge cases and torch's error messages, against torch live.

Edge cases where torch gives a result (cells with hidden_size=0, layers with
dropout=1.0): seqpack.torch gives torch's result, shapes and values. A padded
input with no time steps: torch's error. Every packing and layer error that
torch raises for a condition seqpack also rejects: the exception type is
torch's, and seqpack's message starts with torch's own message for the same
input (seqpack's detail follows), on the operators' path (CPU float32) and on
the plain-torch path (float16) of the packing functions."""
import pytest
import torch
import torch.nn.utils.rnn as R

import seqpack.torch as spt
from helpers import base_seed
from tolerance import assert_like_torch

TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def raised(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the point is which one
        return e
    raise AssertionError("no exception raised")


def assert_torch_error(torch_fn, seqpack_fn):
    """seqpack_fn raises torch_fn's exception type, its message starting with
    torch's message."""
    want = raised(torch_fn)
    got = raised(seqpack_fn)
    assert type(got) is type(want), f"{type(got).__name__}: {got} (torch: {type(want).__name__})"
    want_msg, got_msg = str(want), str(got)
    assert got_msg.startswith(want_msg), f"seqpack: {got_msg!r}\ntorch:   {want_msg!r}"
    assert len(got_msg) > len(want_msg), "seqpack's detail is missing"
    return got_msg


# ---- packing -------------------------------------------------------------

DTYPES = [torch.float32, torch.float16]  # seqpack's operators; plain torch operations


def padded(dtype, batch_first=False):
    torch.manual_seed(base_seed())
    x = torch.randn(3, 4, 5).to(dtype)
    return x.transpose(0, 1).contiguous() if batch_first else x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [False, True])
def test_unsorted_lengths(dtype, batch_first):
    x = padded(dtype, batch_first)
    lengths = torch.tensor([1, 3, 2, 2])
    msg = assert_torch_error(lambda: R.pack_padded_sequence(x, lengths, batch_first),
                             lambda: spt.pack_padded_sequence(x, lengths, batch_first))
    assert "You can pass `enforce_sorted=False`" in msg
    assert "lengths[1] = 3 is greater than lengths[0] = 1" in msg


@pytest.mark.parametrize("dtype", DTYPES)
def test_negative_length(dtype):
    x = padded(dtype)
    lengths = torch.tensor([3, 2, -1, 1])
    msg = assert_torch_error(
        lambda: R.pack_padded_sequence(x, lengths, enforce_sorted=False),
        lambda: spt.pack_padded_sequence(x, lengths, enforce_sorted=False))
    assert "lengths[2] = -1 is negative" in msg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [False, True])
def test_lengths_count(dtype, batch_first):
    x = padded(dtype, batch_first)
    lengths = torch.tensor([3, 2, 1])
    msg = assert_torch_error(lambda: R.pack_padded_sequence(x, lengths, batch_first),
                             lambda: spt.pack_padded_sequence(x, lengths, batch_first))
    assert f"the input of shape {list(x.shape)} has batch size 4" in msg


@pytest.mark.parametrize("dtype", DTYPES)
def test_lengths_not_1d(dtype):
    x = padded(dtype)
    lengths = torch.tensor([[3, 2, 1, 1]])
    msg = assert_torch_error(lambda: R.pack_padded_sequence(x, lengths),
                             lambda: spt.pack_padded_sequence(x, lengths))
    assert "got shape [1, 4]" in msg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("enforce_sorted", [False, True])
def test_input_without_batch_dimension(dtype, batch_first, enforce_sorted):
    x = torch.ones(3, dtype=dtype)
    lengths = torch.tensor([3])
    msg = assert_torch_error(
        lambda: R.pack_padded_sequence(x, lengths, batch_first, enforce_sorted),
        lambda: spt.pack_padded_sequence(x, lengths, batch_first, enforce_sorted))
    assert "input must have at least 2 dimensions (time and batch), got shape [3]" in msg


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_dimensional_input(dtype):
    # torch's message depends on its path (batch_first, enforce_sorted): its type only.
    x = torch.tensor(1.0, dtype=dtype)
    lengths = torch.tensor([1])
    want = raised(lambda: R.pack_padded_sequence(x, lengths))
    got = raised(lambda: spt.pack_padded_sequence(x, lengths))
    assert type(got) is type(want) is IndexError
    assert "input must have at least 2 dimensions (time and batch), got shape []" in str(got)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("enforce_sorted", [False, True])
def test_total_length_too_small(dtype, enforce_sorted):
    x = padded(dtype)
    lengths = torch.tensor([3, 2, 1, 1])
    p = R.pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    msg = assert_torch_error(lambda: R.pad_packed_sequence(p, total_length=2),
                             lambda: spt.pad_packed_sequence(p, total_length=2))
    assert "total_length = 2 is less than the longest sequence's length 3" in msg


def test_pack_sequence_unsorted():
    seqs = [torch.ones(1, 2), torch.ones(3, 2)]
    msg = assert_torch_error(lambda: R.pack_sequence(seqs), lambda: spt.pack_sequence(seqs))
    assert "sequences[1] has length 3, greater than sequences[0]'s 1" in msg


def test_pack_sequence_empty_list():
    assert_torch_error(lambda: R.pack_sequence([]), lambda: spt.pack_sequence([]))


@pytest.mark.parametrize("arg", [5, None])
def test_pack_sequence_not_iterable(arg):
    want, got = raised(lambda: R.pack_sequence(arg)), raised(lambda: spt.pack_sequence(arg))
    assert type(got) is type(want) and str(got) == str(want)


@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_sequence_not_iterable(side):
    want = raised(lambda: R.pad_sequence(5))
    got = raised(lambda: spt.pad_sequence(5, padding_side=side))
    assert type(got) is type(want) and str(got) == str(want)
    if TORCH2:
        assert "Expected iterable for input sequences, but got arg of type" in str(got)


def test_pack_sequence_takes_a_tensor_as_torch_does():
    # torch iterates a tensor's first dimension: seqpack's list() does the same.
    torch.manual_seed(base_seed())
    t = torch.randn(3, 2)
    want, got = R.pack_sequence(t), spt.pack_sequence(t)
    assert torch.equal(got.data, want.data) and torch.equal(got.batch_sizes, want.batch_sizes)


# ---- layers --------------------------------------------------------------

LAYERS = ["LSTM", "GRU", "RNN"]


def layer_pair(kind, *args, **kwargs):
    """(seqpack.torch layer, torch.nn layer with the same weights)."""
    torch.manual_seed(base_seed())
    ours = getattr(spt, kind)(*args, **kwargs)
    ref = getattr(torch.nn, kind)(*args, **kwargs)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def states(kind, h, c=None):
    return (h, h if c is None else c) if kind == "LSTM" else h


@pytest.mark.parametrize("kind", LAYERS)
def test_layer_input_not_2d_or_3d(kind):
    ours, ref = layer_pair(kind, 5, 6)
    x = torch.ones(1, 3, 4, 5)
    if TORCH2:
        msg = assert_torch_error(lambda: ref(x), lambda: ours(x))
    else:
        # torch 1.13 unsqueezes the 4-D input and reports 5 dimensions; seqpack
        # gives torch 2.x's message.
        got = raised(lambda: ours(x))
        assert type(got) is ValueError
        msg = str(got)
        assert msg.startswith(f"{kind}: Expected input to be 2D or 3D, got 4D")
    assert "the input has shape [1, 3, 4, 5]" in msg


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("packed", [False, True])
def test_layer_input_size(kind, packed):
    ours, ref = layer_pair(kind, 5, 6)
    x = torch.ones(3, 4, 7)
    if packed:
        x = R.pack_padded_sequence(x, torch.tensor([3, 2, 1, 1]))
    # torch.nn.RNNBase.check_input's message; torch 2.6's LSTM skips that check
    # for packed input and fails in its kernel (a RuntimeError about matrix
    # shapes): seqpack keeps check_input's message there.
    check_input = "input.size(-1) must be equal to input_size. Expected 5, got 7"
    want, got = raised(lambda: ref(x)), raised(lambda: ours(x))
    assert type(want) is type(got) is RuntimeError
    assert str(got) == check_input
    if str(want).startswith("input.size(-1)"):
        assert str(got) == str(want)


def assert_torch_error_or_equal(torch_fn, seqpack_fn):
    """Where seqpack uses torch's own check, the messages are equal."""
    want, got = raised(torch_fn), raised(seqpack_fn)
    assert type(got) is type(want) and str(got).startswith(str(want)), (got, want)


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("which", ["batch", "hidden", "layers", "dims", "cell"])
def test_layer_state_shape(kind, which):
    if which == "cell" and kind != "LSTM":
        pytest.skip("only LSTM has a cell state")
    ours, ref = layer_pair(kind, 5, 6)
    x = torch.ones(3, 4, 5)
    good = torch.zeros(1, 4, 6)
    bad = {"batch": torch.zeros(1, 3, 6), "hidden": torch.zeros(1, 4, 7),
           "layers": torch.zeros(2, 4, 6), "dims": torch.zeros(4, 6),
           "cell": torch.zeros(1, 4, 7)}[which]
    hx = (good, bad) if which == "cell" else states(kind, bad)
    assert_torch_error_or_equal(lambda: ref(x, hx), lambda: ours(x, hx))


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("batch", [10, 0])
def test_padded_input_with_no_steps(kind, batch_first, batch):
    ours, ref = layer_pair(kind, 5, 6, batch_first=batch_first)
    x = torch.ones((batch, 0, 5) if batch_first else (0, batch, 5))
    msg = assert_torch_error(lambda: ref(x), lambda: ours(x))
    assert f"has no time steps (batch_first={batch_first})" in msg
    # unbatched (0, input_size) as well
    assert_torch_error(lambda: ref(torch.ones(0, 5)), lambda: ours(torch.ones(0, 5)))


@pytest.mark.parametrize("kind", LAYERS)
def test_no_steps_with_lengths_gives_h0(kind):
    """With lengths every sequence has length 0: h_n = h0 for each (seqpack's
    zero-length rule), of the batch's size."""
    ours, _ = layer_pair(kind, 5, 6)
    torch.manual_seed(base_seed())
    h0 = torch.randn(1, 10, 6)
    c0 = torch.randn(1, 10, 6)
    out, hx = ours(torch.ones(0, 10, 5), states(kind, h0, c0), lengths=torch.zeros(10, dtype=torch.int64))
    assert out.shape == (0, 10, 6)
    if kind == "LSTM":
        assert torch.equal(hx[0], h0) and torch.equal(hx[1], c0)
    else:
        assert torch.equal(hx, h0)


@pytest.mark.parametrize("kind", LAYERS)
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_dropout_one(kind, training, packed):
    """dropout=1.0: torch ignores it in eval and zeroes every layer's output but
    the last in training (the last layer then sees zeros: no randomness)."""
    ours, ref = layer_pair(kind, 5, 6, num_layers=2, dropout=1.0)
    ours.train(training)
    ref.train(training)
    torch.manual_seed(base_seed() + 1)
    x = torch.randn(3, 4, 5)
    lengths = [3, 2, 2, 1]
    if packed:
        x = R.pack_padded_sequence(x, torch.tensor(lengths))
    out, hx = ours(x)
    want_out, want_hx = ref(x)
    if packed:
        out, want_out = out.data, want_out.data
    assert_like_torch(out, want_out, ref, lengths, "output")
    for got, want in zip(states(kind, *hx) if kind == "LSTM" else (hx,),
                         states(kind, *want_hx) if kind == "LSTM" else (want_hx,)):
        assert_like_torch(got, want, ref, lengths, "state")


@pytest.mark.parametrize("kind", LAYERS)
def test_layer_hidden_size_zero_as_torch(kind):
    """The layers' constructor is torch's: hidden_size=0 is what torch makes of it."""
    want = raised(lambda: getattr(torch.nn, kind)(10, 0)) if not _constructs(kind) else None
    if want is not None:
        got = raised(lambda: getattr(spt, kind)(10, 0))
        assert type(got) is type(want) and str(got) == str(want)
        return
    ours, ref = layer_pair(kind, 10, 0)
    x = torch.ones(2, 3, 10)
    out, _ = ours(x)
    want_out, _ = ref(x)
    assert out.shape == want_out.shape


def _constructs(kind):
    try:
        getattr(torch.nn, kind)(10, 0)
    except Exception:  # noqa: BLE001
        return False
    return True


# ---- cells ---------------------------------------------------------------

CELLS = ["LSTMCell", "GRUCell", "RNNCell"]


def cell_pair(kind, *args, **kwargs):
    torch.manual_seed(base_seed())
    ours = getattr(spt, kind)(*args, **kwargs)
    ref = getattr(torch.nn, kind)(*args, **kwargs)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


@pytest.mark.parametrize("kind", CELLS)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_state", [False, True])
def test_cell_hidden_size_zero(kind, batched, with_state):
    ours, ref = cell_pair(kind, 10, 0)
    torch.manual_seed(base_seed() + 2)
    x = torch.randn(3, 10) if batched else torch.randn(10)
    hx = None
    if with_state:
        h = torch.zeros(3, 0) if batched else torch.zeros(0)
        hx = (h, h) if kind == "LSTMCell" else h
    got, want = ours(x, hx), ref(x, hx)
    got = got if kind == "LSTMCell" else (got,)
    want = want if kind == "LSTMCell" else (want,)
    for g, w in zip(got, want):
        assert g.shape == w.shape == ((3, 0) if batched else (0,))
        assert g.dtype == w.dtype


@pytest.mark.parametrize("kind", CELLS)
@pytest.mark.parametrize("which", ["input_size", "dims", "batch", "hidden"])
def test_cell_errors(kind, which):
    ours, ref = cell_pair(kind, 5, 6)
    x = {"input_size": torch.ones(4, 7), "dims": torch.ones(2, 4, 5)}.get(which, torch.ones(4, 5))
    hx = None
    if which in ("batch", "hidden"):
        h = torch.zeros(3, 6) if which == "batch" else torch.zeros(4, 7)
        hx = (h, h) if kind == "LSTMCell" else h
    assert_torch_error_or_equal(lambda: ref(x, hx), lambda: ours(x, hx))
