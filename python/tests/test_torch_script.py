"""TorchScript: models holding seqpack.torch layers and seqpack's packing
operators script, save, load in a fresh process that only loads the operator
library, and give the eager outputs, which equal torch.nn's; tracing with
padded input and lengths generalises to other lengths and batch sizes."""
import os
import subprocess
import sys
import textwrap
from typing import Tuple

import pytest
import torch
from torch import Tensor
from torch.nn.utils import rnn as trnn

import seqpack.torch as spt
from helpers import assert_close, base_seed, torch_twin
from tolerance import assert_fp_close, module_reduction_length


class Tagger(torch.nn.Module):
    """Padded batch + lengths -> per-step scores and final states, through
    seqpack's pack/pad operators and a seqpack.torch layer."""

    def __init__(self, rnn: torch.nn.Module, out_features: int, pad_to_input: bool = True):
        super().__init__()
        self.rnn = rnn
        # Padding to the input's length passes x.size(1) as an int, which a
        # trace records as a constant: traced models pad to the longest length.
        self.pad_to_input = pad_to_input
        width = rnn.hidden_size if getattr(rnn, "proj_size", 0) == 0 else rnn.proj_size
        self.head = torch.nn.Linear(width * (2 if rnn.bidirectional else 1), out_features)

    def forward(self, x: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
        packed = spt.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, hidden = self.rnn(packed)
        total_length = x.size(1) if self.pad_to_input else None
        padded, _ = spt.pad_packed_sequence(out, batch_first=True, total_length=total_length)
        h_n = hidden[0] if isinstance(hidden, tuple) else hidden
        return self.head(padded), h_n


class LengthsTagger(torch.nn.Module):
    """The same through the layers' own `lengths` argument (one operator)."""

    def __init__(self, rnn: torch.nn.Module):
        super().__init__()
        self.rnn = rnn

    def forward(self, x: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
        out, hidden = self.rnn(x, None, lengths)
        h_n = hidden[0] if isinstance(hidden, tuple) else hidden
        return out, h_n


def layers():
    torch.manual_seed(base_seed())
    return {
        "lstm": spt.LSTM(3, 5, num_layers=2, bidirectional=True, batch_first=True),
        "lstm-proj": spt.LSTM(3, 5, proj_size=2, batch_first=True),
        "gru": spt.GRU(3, 4, batch_first=True, bidirectional=True),
        "rnn-relu": spt.RNN(3, 4, nonlinearity="relu", num_layers=2, batch_first=True),
    }


def batch(lengths, features=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(len(lengths), max(lengths), features)
    for b, n in enumerate(lengths):
        x[b, :n] = torch.randn(n, features, generator=g)
    return x, torch.tensor(lengths, dtype=torch.int64)


def torch_reference(rnn, x, lengths):
    """torch.nn's module of the same class and weights, with torch's packing."""
    t = torch_twin(rnn)
    packed = trnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, hidden = t(packed)
    padded, _ = trnn.pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
    return padded, hidden[0] if isinstance(hidden, tuple) else hidden


@pytest.mark.parametrize("name", ["lstm", "lstm-proj", "gru", "rnn-relu"])
def test_script_matches_eager_and_torch(name):
    rnn = layers()[name].eval()
    model = Tagger(rnn, 2).eval()
    scripted = torch.jit.script(model)
    x, lengths = batch([4, 1, 3, 2])
    with torch.no_grad():
        eager_out, eager_h = model(x, lengths)
        out, h = scripted(x, lengths)
        ref_pad, ref_h = torch_reference(rnn, x, lengths)
        ref_out = model.head(ref_pad)
    assert_close(out.numpy(), eager_out.numpy(), 0, 0, "scripted output")
    assert_close(h.numpy(), eager_h.numpy(), 0, 0, "scripted h_n")
    # The head adds its sum over the layer's outputs to the layer's chain.
    n = module_reduction_length(rnn, lengths) + rnn.hidden_size * (2 if rnn.bidirectional else 1)
    assert_fp_close(out, ref_out, n, what="output vs torch.nn")
    assert_fp_close(h, ref_h, n, what="h_n vs torch.nn")
    # The graph calls seqpack's operators, not torch's RNN.
    graph = str(scripted.inlined_graph)
    assert "seqpack::rnn(" in graph and "seqpack::pack_padded_sequence" in graph


def test_scripted_training_step_gradients_match_eager():
    torch.manual_seed(base_seed())
    model = Tagger(spt.GRU(3, 4, batch_first=True), 2)
    scripted = torch.jit.script(model)
    x, lengths = batch([3, 2, 2])
    x.requires_grad_()
    model(x, lengths)[0].pow(2).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    scripted(x, lengths)[0].pow(2).sum().backward()
    actual = [p.grad for p in scripted.parameters()] + [x.grad]
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_close(a.numpy(), e.numpy(), 1e-6, 1e-7, f"gradient {i}")


def run_fresh_process(code, tmp_path):
    """Runs `code` in a new interpreter that has not imported seqpack."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("tagger", ["pack-pad", "lengths"])
def test_save_and_load_in_a_fresh_process(tmp_path, tagger):
    rnn = layers()["lstm"].eval()
    model = (Tagger(rnn, 2) if tagger == "pack-pad" else LengthsTagger(rnn)).eval()
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(model), str(path))
    x, lengths = batch([5, 0, 2, 3], seed=1)  # with a zero-length sequence
    with torch.no_grad():
        expected_out, expected_h = model(x, lengths)
    torch.save({"x": x, "lengths": lengths}, tmp_path / "inputs.pt")
    run_fresh_process(f"""
        import sys, torch
        torch.ops.load_library({spt.library_path()!r})   # the operators, no seqpack module
        assert "seqpack" not in sys.modules
        model = torch.jit.load("model.pt")
        inputs = torch.load("inputs.pt")
        with torch.no_grad():
            out, h = model(inputs["x"], inputs["lengths"])
        torch.save({{"out": out, "h": h}}, "outputs.pt")
    """, tmp_path)
    got = torch.load(tmp_path / "outputs.pt")
    assert_close(got["out"].numpy(), expected_out.numpy(), 0, 0, "output after load")
    assert_close(got["h"].numpy(), expected_h.numpy(), 0, 0, "h_n after load")
    # The zero-length sequence: all-zero output rows (the head adds its bias)
    # and h_n = h0 = 0.
    assert torch.all(got["h"][:, 1] == 0)


def test_load_without_the_operators_fails_clearly(tmp_path):
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(Tagger(layers()["gru"], 2)), str(path))
    script = tmp_path / "child.py"
    script.write_text("import torch\ntorch.jit.load('model.pt')\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode != 0
    assert "seqpack::" in result.stderr


@pytest.mark.parametrize("tagger", ["pack-pad", "lengths"])
def test_trace_with_lengths_generalises(tagger):
    rnn = layers()["lstm"].eval()
    model = (Tagger(rnn, 2, pad_to_input=False) if tagger == "pack-pad"
             else LengthsTagger(rnn)).eval()
    x, lengths = batch([4, 2, 3])
    with torch.no_grad():
        traced = torch.jit.trace(model, (x, lengths), check_trace=False)
    # Other lengths, batch size and padded length than the example input.
    for trial, other in enumerate(([6, 1, 6, 2, 5], [2, 2], [3, 0, 1])):
        x2, l2 = batch(other, seed=trial + 5)
        with torch.no_grad():
            expected = model(x2, l2)
            got = traced(x2, l2)
        for a, e, what in zip(got, expected, ("output", "h_n")):
            assert_close(a.numpy(), e.numpy(), 0, 0, f"traced {what}, lengths {other}")
