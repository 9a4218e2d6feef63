"""seqpack.torch under torch.compile, torch.export and compiled autocast
(PyTorch 2.4+: the operators' fake implementations are registered with
torch.library.register_fake). The reference is always the same model in eager
mode, and eager against torch.nn's modules where they compute the same thing."""
import importlib.util

import pytest
import torch

import seqpack.torch as st

pytestmark = pytest.mark.skipif(
    not hasattr(torch.library, "register_fake"),
    reason=f"torch.compile/torch.export of seqpack.torch need PyTorch 2.4+ "
           f"(torch.library.register_fake); this is {torch.__version__}")

if hasattr(torch.library, "register_fake"):
    import torch._dynamo
    import torch._dynamo.testing
    from torch.export import Dim

VOCAB, EMBED, HIDDEN, CLASSES = 30, 8, 6, 3


class Classifier(torch.nn.Module):
    """embedding -> pack -> 2-layer bidirectional recurrent layer -> h_n -> linear."""

    def __init__(self, layer=None, enforce_sorted=False):
        super().__init__()
        layer = layer or st.LSTM
        self.embedding = torch.nn.Embedding(VOCAB, EMBED)
        self.rnn = layer(EMBED, HIDDEN, num_layers=2, bidirectional=True, batch_first=True)
        self.head = torch.nn.Linear(2 * HIDDEN, CLASSES)
        self.pack = st.pack_padded_sequence
        self.enforce_sorted = enforce_sorted

    def forward(self, tokens, lengths):
        x = self.embedding(tokens)
        packed = self.pack(x, lengths, batch_first=True, enforce_sorted=self.enforce_sorted)
        _, hidden = self.rnn(packed)
        h_n = hidden[0] if isinstance(hidden, tuple) else hidden
        return self.head(torch.cat([h_n[-2], h_n[-1]], dim=1))


def batch(size, steps, seed, sort=False):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (size, steps), generator=g)
    lengths = torch.randint(1, steps + 1, (size,), generator=g)
    lengths[0] = steps
    if sort:
        lengths = lengths.sort(descending=True).values
    return tokens, lengths


# Three calls: the first compiles for its shapes, the second (another batch
# size and length) once more with dynamic shapes, the third reuses that.
BATCHES = [(4, 7, 1), (6, 9, 2), (3, 5, 3)]


def max_diff(a, b):
    return (a - b).abs().max().item()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    # No allow_rnn: seqpack.torch lets Dynamo trace its layers (docs/python.md).
    assert not torch._dynamo.config.allow_rnn
    yield
    torch._dynamo.reset()


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


# Inductor builds its kernels with setuptools' C++ extension machinery.
HAS_SETUPTOOLS = importlib.util.find_spec("setuptools.command") is not None
needs_setuptools = pytest.mark.skipif(
    not HAS_SETUPTOOLS, reason="torch.compile's default backend (inductor) needs setuptools "
                               "(Debian: python3-setuptools)")


@pytest.mark.parametrize("layer,backend", [pytest.param(lambda: st.LSTM, "inductor",
                                                        marks=needs_setuptools),
                                           (lambda: st.LSTM, "aot_eager"),
                                           (lambda: st.GRU, "aot_eager"),
                                           (lambda: st.RNN, "aot_eager")],
                         ids=["LSTM-inductor", "LSTM", "GRU", "RNN"])
def test_compiled_training_matches_eager_and_recompiles_at_most_once(layer, backend):
    torch.manual_seed(0)
    model = Classifier(layer())
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    for size, steps, seed in BATCHES:
        tokens, lengths = batch(size, steps, seed)
        model.zero_grad()
        want = model(tokens, lengths)
        want.square().sum().backward()
        want_grads = grads(model)
        model.zero_grad()
        got = compiled(tokens, lengths)
        got.square().sum().backward()
        assert got.shape == (size, CLASSES)
        assert max_diff(got, want) <= 1e-6, (size, steps)
        for (name, _), g, w in zip(model.named_parameters(), grads(model), want_grads):
            assert max_diff(g, w) <= 1e-6, (name, size, steps)
    assert counter.frame_count <= 2, counter.frame_count


def test_no_graph_break():
    torch.manual_seed(1)
    model = Classifier()
    explanation = torch._dynamo.explain(model)(*batch(4, 7, 1))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_eager_matches_torch_nn():
    """The compiled model's reference, against torch's own modules (torch's
    pack_padded_sequence and LSTM)."""
    torch.manual_seed(2)
    model = Classifier()
    ref = Classifier(torch.nn.LSTM)
    ref.load_state_dict(model.state_dict())
    ref.pack = torch.nn.utils.rnn.pack_padded_sequence
    tokens, lengths = batch(5, 8, 4)
    assert max_diff(model(tokens, lengths), ref(tokens, lengths)) <= 1e-5


def test_enforce_sorted_and_padded_input_with_lengths_compile():
    """enforce_sorted=True (indices known only when the graph runs) and a padded
    input with `lengths` (pack, layer, pad inside the layer)."""
    torch.manual_seed(3)
    sorted_model = Classifier(enforce_sorted=True)
    layer = st.GRU(EMBED, HIDDEN, batch_first=True, bidirectional=True)

    def padded(x, lengths):
        out, h_n = layer(x, lengths=lengths)
        return out.sum(2) + h_n.sum(0).sum(1, keepdim=True)

    compiled_sorted = torch.compile(sorted_model, fullgraph=True, backend="aot_eager")
    compiled_padded = torch.compile(padded, fullgraph=True, backend="aot_eager")
    for size, steps, seed in BATCHES:
        tokens, lengths = batch(size, steps, seed, sort=True)
        assert max_diff(compiled_sorted(tokens, lengths), sorted_model(tokens, lengths)) <= 1e-6
        x = torch.randn(size, steps, EMBED, generator=torch.Generator().manual_seed(seed))
        assert max_diff(compiled_padded(x, lengths), padded(x, lengths)) <= 1e-6
        assert max_diff(compiled_padded(x, None), padded(x, None)) <= 1e-6


def test_export_runs_on_other_batch_sizes_and_lengths():
    torch.manual_seed(4)
    model = Classifier().eval()
    tokens, lengths = batch(4, 7, 1)
    b, t = Dim("batch", min=2, max=64), Dim("time", min=2, max=512)
    with torch._dynamo.config.patch(allow_rnn=False):  # export does not need it
        program = torch.export.export(model, (tokens, lengths),
                                      dynamic_shapes={"tokens": {0: b, 1: t}, "lengths": {0: b}})
    exported = program.module()
    with torch.no_grad():
        for size, steps, seed in BATCHES + [(9, 20, 5), (2, 3, 6)]:
            tokens, lengths = batch(size, steps, seed)
            assert max_diff(exported(tokens, lengths), model(tokens, lengths)) <= 1e-6, \
                (size, steps)


def test_autocast_bf16_compiled_as_in_eager():
    torch.manual_seed(5)
    model = Classifier()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for size, steps, seed in BATCHES:
        tokens, lengths = batch(size, steps, seed)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model.zero_grad()
            want = model(tokens, lengths)
            want.float().sum().backward()
            want_grads = grads(model)
            model.zero_grad()
            got = compiled(tokens, lengths)
            got.float().sum().backward()
        assert got.dtype == want.dtype == torch.bfloat16
        assert max_diff(got.float(), want.float()) <= 1e-6
        for g, w in zip(grads(model), want_grads):
            assert max_diff(g, w) <= 1e-6


def test_torch_own_lstm_still_stops_dynamo_without_allow_rnn():
    # seqpack lets Dynamo wrap its own layers only: torch.nn.LSTM meets Dynamo's
    # refusal as without seqpack, in the model and alone, and allow_rnn stays unset.
    compiled = torch.compile(Classifier(lambda *a, **k: torch.nn.LSTM(*a, **k)), fullgraph=True,
                             backend="aot_eager")
    with pytest.raises(Exception, match="RNN, GRU,? (or )?LSTM"):
        compiled(*batch(4, 7, 1))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="RNN, GRU,? (or )?LSTM"):
        torch.compile(torch.nn.GRU(3, 4), fullgraph=True, backend="aot_eager")(torch.randn(5, 2, 3))
    assert not torch._dynamo.config.allow_rnn
    # Without fullgraph it runs (the recurrent layer eagerly), as before.
    torch._dynamo.reset()
    model = Classifier(lambda *a, **k: torch.nn.LSTM(*a, **k))
    tokens, lengths = batch(4, 7, 1)
    with torch.no_grad():
        assert max_diff(torch.compile(model, backend="aot_eager")(tokens, lengths),
                        model(tokens, lengths)) <= 1e-6


def test_compiles_when_dynamo_was_imported_before_seqpack():
    # seqpack.torch wraps Dynamo's module check when Dynamo is imported after it
    # (the other tests) or, as here, before it.
    import subprocess
    import sys
    code = ("import torch, torch._dynamo\n"
            "import seqpack.torch as st\n"
            "m = st.GRU(3, 4)\n"
            "x = torch.randn(5, 2, 3)\n"
            "got = torch.compile(m, fullgraph=True, backend='aot_eager')(x)[0]\n"
            "assert torch._dynamo.config.allow_rnn is False\n"
            "print(float((got - m(x)[0]).abs().max()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) <= 1e-6
