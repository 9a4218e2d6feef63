"""seqpack.torch.optimize, patch and unpatch on models written the torch way
(torch.nn.LSTM/GRU/RNN, the cells, torch.nn.utils.rnn's functions looked up at
call time), against the same models left to torch: values, gradients, an
optimizer step, TorchScript where torch's model scripts; and torch patched by
hand with seqpack's functions, which must never reach seqpack's again."""
import copy
from typing import List

import pytest
import torch
from torch import Tensor, nn

import seqpack.torch as st
from helpers import base_seed
from tolerance import assert_fp_close, rnn_reduction_length

VOCAB, EMBED, HIDDEN = 20, 8, 6
CLASS_NAMES = ("LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell")
FUNCTION_NAMES = ("pack_padded_sequence", "pad_packed_sequence", "pack_sequence", "pad_sequence",
                  "unpack_sequence", "unpad_sequence", "invert_permutation")
TORCH_CLASSES = {name: getattr(nn, name) for name in CLASS_NAMES}
TORCH_FUNCTIONS = {name: getattr(nn.utils.rnn, name) for name in FUNCTION_NAMES}


@pytest.fixture(autouse=True)
def torch_restored():
    """Every test leaves torch as it found it, whatever it patched."""
    yield
    st.unpatch()
    for name, cls in TORCH_CLASSES.items():
        setattr(nn, name, cls)
    for name, fn in TORCH_FUNCTIONS.items():
        setattr(nn.utils.rnn, name, fn)


class Tagger(nn.Module):
    """A part-of-speech tagger: embedding -> packed 2-layer bidirectional LSTM -> per-token tags."""

    def __init__(self, tags: int = 5):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMBED, padding_idx=0)
        self.lstm = nn.LSTM(EMBED, HIDDEN, num_layers=2, bidirectional=True, batch_first=True)
        self.out = nn.Linear(2 * HIDDEN, tags)

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(self.embedding(tokens), lengths,
                                                   batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                  total_length=tokens.size(1))
        return self.out(out)


class Seq2Seq(nn.Module):
    """A bidirectional GRU encoder (time-major, packed) and an LSTMCell decoder
    with dot-product attention over the encoder's outputs (teacher forcing)."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMBED)
        self.encoder = nn.GRU(EMBED, HIDDEN, bidirectional=True)
        self.bridge = nn.Linear(2 * HIDDEN, HIDDEN)
        self.decoder = nn.LSTMCell(EMBED + 2 * HIDDEN, HIDDEN)
        self.attention = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.out = nn.Linear(HIDDEN, VOCAB)

    def forward(self, src: Tensor, lengths: Tensor, tgt: Tensor) -> Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(self.embedding(src), lengths,
                                                   enforce_sorted=False)
        enc, h_n = self.encoder(packed)
        enc, _ = nn.utils.rnn.pad_packed_sequence(enc, total_length=src.size(0))
        mask = torch.arange(enc.size(0)).unsqueeze(1) < lengths.unsqueeze(0)
        h = torch.tanh(self.bridge(torch.cat([h_n[0], h_n[1]], 1)))
        c = torch.zeros_like(h)
        context = enc.new_zeros(enc.size(1), enc.size(2))
        logits: List[Tensor] = []
        for t in range(tgt.size(0)):
            h, c = self.decoder(torch.cat([self.embedding(tgt[t]), context], 1), (h, c))
            scores = (enc * self.attention(h).unsqueeze(0)).sum(2)
            weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), 0)
            context = (weights.unsqueeze(2) * enc).sum(0)
            logits.append(self.out(h))
        return torch.stack(logits)


class Classifier(nn.Module):
    """Written for this test: a list of feature sequences -> pad_sequence ->
    packed 2-layer relu RNN -> a GRUCell and an RNNCell step -> classes."""

    def __init__(self, features: int = 4, classes: int = 3):
        super().__init__()
        self.rnn = nn.RNN(features, HIDDEN, num_layers=2, nonlinearity="relu")
        self.gru_cell = nn.GRUCell(HIDDEN, HIDDEN)
        self.rnn_cell = nn.RNNCell(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, classes)

    def forward(self, sequences: List[Tensor]) -> Tensor:
        lengths = torch.tensor([s.size(0) for s in sequences])
        padded = nn.utils.rnn.pad_sequence(sequences)
        packed = nn.utils.rnn.pack_padded_sequence(padded, lengths, enforce_sorted=False)
        _, h_n = self.rnn(packed)
        h = self.gru_cell(h_n[-1], h_n[-2])
        return self.head(self.rnn_cell(h, h_n[-1]))


def inputs(kind, seed):
    """(args, tokens in the longest chain, decoder steps) for a model kind."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 5, 1])
    if kind == "tagger":
        tokens = torch.randint(1, VOCAB, (4, 7), generator=g)
        return (tokens, lengths), int(lengths.sum()), 0
    if kind == "seq2seq":
        src = torch.randint(0, VOCAB, (7, 4), generator=g)
        tgt = torch.randint(0, VOCAB, (5, 4), generator=g)
        return (src, lengths, tgt), int(lengths.sum()), 5
    return ([torch.randn(int(n), 4, generator=g) for n in lengths],), int(lengths.sum()), 1


MODELS = {"tagger": Tagger, "seq2seq": Seq2Seq, "classifier": Classifier}


def chain_length(model, tokens, cell_steps):
    """n of the tolerance rule (docs/testing.md) for the model's outputs and
    gradients: the recurrent modules' reduction lengths over the batch's
    tokens (cells over the decoder's steps), plus every linear map's width and
    the attention's sums, all of which a value may pass through."""
    n = 0
    for m in model.modules():
        if isinstance(m, nn.RNNBase):
            n += rnn_reduction_length(m.input_size, m.hidden_size, m.num_layers, m.bidirectional,
                                      tokens)
        elif isinstance(m, nn.RNNCellBase):
            n += rnn_reduction_length(m.input_size, m.hidden_size, steps=max(cell_steps, 1))
        elif isinstance(m, nn.Linear):
            n += m.in_features * max(cell_steps, 1)
    return n + 2 * 2 * HIDDEN * 7 * cell_steps


def recurrent(model):
    return [m for m in model.modules() if isinstance(m, (nn.RNNBase, nn.RNNCellBase))]


def assert_matches(model, reference, kind, seed, what):
    """Outputs, gradients and one SGD step of `model` against `reference`
    (the same weights, torch's modules), each within the tolerance rule."""
    args, tokens, cell_steps = inputs(kind, seed)
    n = chain_length(reference, tokens, cell_steps)
    lr = 0.1
    steps = []
    for m in (model, reference):
        optimizer = torch.optim.SGD(m.parameters(), lr=lr)
        optimizer.zero_grad()
        out = m(*args)
        out.square().mean().backward()
        grads = {k: p.grad.clone() for k, p in m.named_parameters()}
        optimizer.step()
        steps.append((out.detach(), grads, {k: p.detach().clone() for k, p in m.named_parameters()}))
    (out, grads, after), (want, want_grads, want_after) = steps
    assert_fp_close(out, want, n, what=f"{what}: output")
    assert grads.keys() == want_grads.keys()
    for k in want_grads:
        assert_fp_close(grads[k], want_grads[k], n, what=f"{what}: grad of {k}")
        scale = max(float(want_after[k].abs().max()), lr * float(want_grads[k].abs().max()))
        assert_fp_close(after[k], want_after[k], n, what=f"{what}: {k} after an SGD step",
                        scale=scale)


def assert_scripts_alike(model, reference, kind, seed, what):
    """Where torch's model scripts, seqpack's scripts and gives the same values."""
    try:
        scripted_reference = torch.jit.script(reference)
    except Exception as e:  # noqa: BLE001 (the test covers only what torch's model allows)
        pytest.skip(f"torch's {kind} does not script on torch {torch.__version__}: {e}")
    scripted = torch.jit.script(model)
    args, tokens, cell_steps = inputs(kind, seed + 1)
    n = chain_length(reference, tokens, cell_steps)
    with torch.no_grad():
        want = scripted_reference(*args)
        assert_fp_close(scripted(*args), want, n, what=f"{what}: scripted")
        assert_fp_close(model(*args), want, n, what=f"{what}: eager")


@pytest.mark.parametrize("kind", list(MODELS))
def test_optimize_in_place_matches_torch(kind):
    seed = base_seed() + len(kind)
    torch.manual_seed(seed)
    model = MODELS[kind]()
    reference = copy.deepcopy(model)
    params = [(k, id(p)) for k, p in model.named_parameters()]
    keys = list(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # made before optimize
    model.eval() if kind == "tagger" else model.train()
    mode = [m.training for m in model.modules()]

    assert st.optimize(model) is model
    assert [type(m) for m in recurrent(model)] == \
        [getattr(st, type(m).__name__) for m in recurrent(reference)]
    assert [(k, id(p)) for k, p in model.named_parameters()] == params
    assert list(model.state_dict()) == keys
    for k, v in reference.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    assert [m.training for m in model.modules()] == mode

    # The optimizer made before optimize updates the model's parameters.
    args, _, _ = inputs(kind, seed)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad()
    model(*args).square().mean().backward()
    optimizer.step()
    changed = [not torch.equal(p, b) for p, b in zip(model.parameters(), before)]
    assert sum(changed) >= len(changed) - 1, changed  # (the padding row gets no gradient)
    with torch.no_grad():
        for p, b in zip(model.parameters(), before):
            p.copy_(b)

    model.train(), reference.train()
    assert_matches(model, reference, kind, seed, f"optimize({kind})")


@pytest.mark.parametrize("kind", list(MODELS))
def test_optimize_scripts_where_torch_does(kind):
    seed = base_seed() + 10 + len(kind)
    torch.manual_seed(seed)
    reference = MODELS[kind]().eval()
    model = st.optimize(copy.deepcopy(reference))
    assert_scripts_alike(model, reference, kind, seed, f"optimize({kind})")


@pytest.mark.parametrize("kind", list(MODELS))
def test_patch_builds_seqpack_models_that_match_torch(kind):
    seed = base_seed() + 20 + len(kind)
    changed = st.patch()
    try:
        assert changed == [f"torch.nn.{n} -> seqpack.torch.{n}" for n in CLASS_NAMES] + \
            [f"torch.nn.utils.rnn.{n} -> seqpack.torch.{n}" for n in FUNCTION_NAMES]
        assert st.patch() == []  # twice is harmless
        torch.manual_seed(seed)
        model = MODELS[kind]()
        for m in recurrent(model):
            assert type(m) is getattr(st, type(m).__name__)
            # The patched name and torch's class (seqpack's base) both match.
            assert isinstance(m, getattr(nn, type(m).__name__))
            assert isinstance(m, getattr(torch.nn.modules.rnn, type(m).__name__))
        assert nn.utils.rnn.pack_padded_sequence is st.pack_padded_sequence
        reference = copy.deepcopy(model)
        for m in reference.modules():  # torch's modules, the same weights
            torch_class = TORCH_CLASSES.get(type(m).__name__)
            if torch_class is not None:
                m.__class__ = torch_class
        assert_matches(model, reference, kind, seed, f"patch({kind})")
        assert_scripts_alike(model.eval(), reference.eval(), kind, seed, f"patch({kind})")
    finally:
        restored = st.unpatch()
    assert len(restored) == len(CLASS_NAMES) + len(FUNCTION_NAMES)
    assert st.unpatch() == []
    for name, cls in TORCH_CLASSES.items():
        assert getattr(nn, name) is cls, name
    for name, fn in TORCH_FUNCTIONS.items():
        assert getattr(nn.utils.rnn, name) is fn, name
    torch.manual_seed(seed)
    assert all(type(m) is TORCH_CLASSES[type(m).__name__] for m in recurrent(MODELS[kind]()))


def test_patch_builds_the_same_weights_as_torch():
    # seqpack's classes initialise as torch's: a model built under patch() has
    # the weights the same seed gives torch's.
    torch.manual_seed(base_seed())
    want = Seq2Seq().state_dict()
    st.patch()
    torch.manual_seed(base_seed())
    got = Seq2Seq().state_dict()
    st.unpatch()
    assert list(got) == list(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_unpatch_leaves_names_someone_else_set():
    st.patch()
    mine = type("MyLSTM", (TORCH_CLASSES["LSTM"],), {})
    nn.LSTM = mine
    assert "torch.nn.LSTM -> torch's LSTM" not in st.unpatch()
    assert nn.LSTM is mine
    assert nn.GRU is TORCH_CLASSES["GRU"]


def test_torch_patched_by_hand_never_recurses():
    # What users write to speed up code they cannot edit: every function and
    # class assigned onto torch, then called through torch's names, on inputs
    # seqpack hands to torch (any dtype, padding_side right) and on its own.
    g = torch.Generator().manual_seed(base_seed())
    seqs = [torch.randn(n, 3, generator=g) for n in (4, 2, 3)]
    half = [s.to(torch.bfloat16) for s in seqs]
    want_pad = TORCH_FUNCTIONS["pad_sequence"](seqs)
    want_half = TORCH_FUNCTIONS["pad_sequence"](half, batch_first=True)
    want_packed = TORCH_FUNCTIONS["pack_sequence"](seqs, enforce_sorted=False)
    torch.manual_seed(1)
    torch_lstm = TORCH_CLASSES["LSTM"](3, 4, batch_first=True).to(torch.bfloat16)
    torch_cell = TORCH_CLASSES["GRUCell"](3, 4).to(torch.bfloat16)
    lengths = torch.tensor([4, 2, 3])
    want_lstm = torch_lstm(TORCH_FUNCTIONS["pack_padded_sequence"](
        want_half, lengths, batch_first=True, enforce_sorted=False))[0].data
    want_cell = torch_cell(half[0])
    for name in FUNCTION_NAMES:
        setattr(nn.utils.rnn, name, getattr(st, name))
    for name in CLASS_NAMES:
        setattr(nn, name, getattr(st, name))
    rnn = nn.utils.rnn
    assert torch.equal(rnn.pad_sequence(seqs), want_pad)
    assert torch.equal(rnn.pad_sequence(half, batch_first=True), want_half)
    assert torch.equal(rnn.pad_sequence(seqs, padding_side="left")[-2:, 1], seqs[1])
    packed = rnn.pack_sequence(seqs, enforce_sorted=False)
    assert torch.equal(packed.data, want_packed.data)
    padded, got_lengths = rnn.pad_packed_sequence(packed)
    assert torch.equal(padded, want_pad) and got_lengths.tolist() == [4, 2, 3]
    assert all(torch.equal(a, b) for a, b in zip(rnn.unpack_sequence(packed), seqs))
    assert all(torch.equal(a, b) for a, b in zip(rnn.unpad_sequence(want_pad, lengths), seqs))
    # bfloat16 runs torch's kernels inside seqpack's layers and cells.
    lstm = nn.LSTM(3, 4, batch_first=True).to(torch.bfloat16)
    lstm.load_state_dict(torch_lstm.state_dict())
    out = lstm(want_half, lengths=lengths)[0]
    assert_fp_close(rnn.pack_padded_sequence(out, lengths, batch_first=True,
                                             enforce_sorted=False).data.float(),
                    want_lstm.float(), rnn_reduction_length(3, 4, steps=9), dtype="bfloat16",
                    what="LSTM bf16 with lengths")
    cell = nn.GRUCell(3, 4).to(torch.bfloat16)
    cell.load_state_dict(torch_cell.state_dict())
    assert_fp_close(cell(half[0]).float(), want_cell.float(), rnn_reduction_length(3, 4, steps=4),
                    dtype="bfloat16", what="GRUCell bf16")


def test_optimize_refuses_what_it_cannot_change():
    with pytest.raises(TypeError, match="torch.nn.Module, got list"):
        st.optimize([nn.LSTM(2, 3)])
    lstm = torch.jit.script(nn.LSTM(2, 3))
    with pytest.raises(TypeError, match="TorchScript module"):
        st.optimize(lstm)


def test_optimize_leaves_subclasses_and_seqpack_layers():
    class MyLSTM(nn.LSTM):
        pass

    model = nn.Sequential(MyLSTM(2, 3), st.GRU(2, 3))
    mine, seqpack_gru = model[0], model[1]
    st.optimize(model)
    assert type(model[0]) is MyLSTM and model[0] is mine
    assert type(model[1]) is st.GRU and model[1] is seqpack_gru
    # The model itself is changed when it is a recurrent layer.
    lstm = nn.LSTM(2, 3)
    assert st.optimize(lstm) is lstm and type(lstm) is st.LSTM
