"""torch.onnx.export of seqpack.torch layers (seqpack/torch_onnx.py), run in ONNX
Runtime at other batch sizes and padded lengths than exported, against the
same model run eagerly on seqpack's kernels."""
import io
import os
import warnings

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import seqpack
import seqpack.torch as st
from helpers import assert_close, base_seed
import ort_runner

TOL = 1e-5  # float32
LAYERS = {"LSTM": (st.LSTM, {}), "GRU": (st.GRU, {}), "RNN_TANH": (st.RNN, {}),
          "RNN_RELU": (st.RNN, {"nonlinearity": "relu"})}


class Packed(torch.nn.Module):
    """pack_padded_sequence(enforce_sorted=False) -> seqpack layer -> pad_packed_sequence."""

    def __init__(self, mode, with_hx, **kw):
        super().__init__()
        cls, extra = LAYERS[mode]
        self.rnn = cls(3, 4, **extra, **kw)
        self.batch_first = kw.get("batch_first", False)
        self.with_hx = with_hx

    def forward(self, x, lengths, *hx):
        packed = pack_padded_sequence(x, lengths, batch_first=self.batch_first,
                                      enforce_sorted=False)
        if hx:
            hx = hx if len(hx) == 2 else hx[0]
        out, h = self.rnn(packed, hx if self.with_hx else None)
        y, _ = pad_packed_sequence(out, batch_first=self.batch_first)
        return (y,) + (h if isinstance(h, tuple) else (h,))


def export(model, args, names_in, names_out, opset=17, batch_first=False, record=None):
    axes = {}
    for n in names_in + names_out:
        if n in ("x", "y"):
            axes[n] = {0: "batch", 1: "time"} if batch_first else {0: "time", 1: "batch"}
        elif n == "tokens":
            axes[n] = {0: "batch", 1: "time"}
        elif n in ("lengths", "logits"):
            axes[n] = {0: "batch"}
        else:
            axes[n] = {1: "batch"}
    f = io.BytesIO()
    with warnings.catch_warnings(record=record is not None) as caught:
        warnings.simplefilter("always" if record is not None else "ignore")
        torch.onnx.export(model, args, f, opset_version=opset, input_names=names_in,
                          output_names=names_out, dynamic_axes=axes)
    if record is not None:
        record.extend(caught)
    return f.getvalue()


def grid():
    """(mode, options, with_hx): every mode x layers x directions x batch_first x hx,
    and each mode without biases, with dropout (eval: none), at opset 14."""
    for mode in LAYERS:
        for layers in (1, 2):
            for bidirectional in (False, True):
                for batch_first in (False, True):
                    for with_hx in (False, True):
                        yield mode, dict(num_layers=layers, bidirectional=bidirectional,
                                         batch_first=batch_first), with_hx, 17
    for mode in LAYERS:
        yield mode, dict(num_layers=3, bidirectional=True, bias=False, dropout=0.5,
                         batch_first=True), True, 14


def make_inputs(model, lengths, T, rng):
    rnn = model.rnn
    B = len(lengths)
    shape = (B, T, 3) if model.batch_first else (T, B, 3)
    x = torch.from_numpy(rng.uniform(-1, 1, shape).astype(np.float32))
    inputs = [x, torch.tensor(lengths, dtype=torch.int64)]
    if model.with_hx:
        LD = rnn.num_layers * (2 if rnn.bidirectional else 1)
        n = 2 if rnn.mode == "LSTM" else 1
        inputs += [torch.from_numpy(rng.uniform(-0.5, 0.5, (LD, B, 4)).astype(np.float32))
                   for _ in range(n)]
    return inputs


def names(model):
    n_in = ["x", "lengths"]
    if model.with_hx:
        n_in += ["h0", "c0"] if model.rnn.mode == "LSTM" else ["h0"]
    n_out = ["y", "h_n"] + (["c_n"] if model.rnn.mode == "LSTM" else [])
    return n_in, n_out


def test_grid_matches_seqpack_in_onnx_runtime(tmp_path):
    seed = base_seed()
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    cases, runs = [], []
    for k, (mode, options, with_hx, opset) in enumerate(grid()):
        model = Packed(mode, with_hx, **options).eval()
        n_in, n_out = names(model)
        path = tmp_path / f"m{k}.onnx"
        path.write_bytes(export(model, tuple(make_inputs(model, [3, 1, 3], 3, rng)), n_in, n_out,
                                opset=opset, batch_first=model.batch_first))
        # Other batch sizes and padded lengths than exported: mixed unsorted
        # lengths with ties, a batch of 1, T = 1.
        for lengths, T in (([4, 1, 6, 3, 6, 2], 6), ([5], 5), ([1, 1], 1)):
            inputs = make_inputs(model, lengths, T, rng)
            with torch.no_grad():
                expected = [t.numpy() for t in model(*inputs)]
            cases.append((f"{mode} {options} hx={with_hx} opset={opset} lengths={lengths} "
                          f"(seed {seed})", n_out, expected))
            runs.append({"model": str(path),
                         "inputs": {n: t.numpy() for n, t in zip(n_in, inputs)}})
    results = ort_runner.run(runs)
    worst = 0.0
    for (what, n_out, expected), r in zip(cases, results):
        assert "error" not in r, f"{what}: {r.get('error')}"
        for name, e in zip(n_out, expected):
            assert_close(r["outputs"][name], e, 0, TOL, f"{what} {name}")
            worst = max(worst, float(np.abs(r["outputs"][name] - e).max()))
    print(f"{len(results)} runs of {len(results) // 3} exported models: "
          f"max |ONNX Runtime - seqpack| = {worst:.3g}")


@pytest.mark.parametrize("mode", list(LAYERS))
def test_zero_length_keeps_initial_state(tmp_path, mode):
    """ONNX Runtime gives zeros for a zero length; the export gives h0 (seqpack's meaning)."""
    rng = np.random.default_rng(base_seed() + 1)
    model = Packed(mode, True, num_layers=2, bidirectional=True, batch_first=True).eval()
    n_in, n_out = names(model)
    path = tmp_path / "m.onnx"
    path.write_bytes(export(model, tuple(make_inputs(model, [2, 3], 3, rng)), n_in, n_out,
                            batch_first=True))
    inputs = make_inputs(model, [3, 0, 5], 5, rng)
    # Expected: the two non-empty sequences run eagerly; the empty one keeps h0/c0
    # and has all-zero outputs.
    keep = torch.tensor([0, 2])
    sub = [inputs[0][keep], inputs[1][keep]] + [h[:, keep] for h in inputs[2:]]
    with torch.no_grad():
        part = model(*sub)
    expected = [np.zeros((3, 5, part[0].shape[2]), np.float32)]
    expected[0][[0, 2]] = part[0].numpy()
    for k, state in enumerate(part[1:]):
        e = inputs[2 + k].numpy().copy()
        e[:, [0, 2]] = state.numpy()
        expected.append(e)
    feeds = {n: t.numpy() for n, t in zip(n_in, inputs)}
    r = ort_runner.run([{"model": str(path), "inputs": feeds}])[0]
    assert "error" not in r, r.get("error")
    for name, e in zip(n_out, expected):
        assert_close(r["outputs"][name], e, 0, TOL, f"{mode} zero length {name}")


class Classifier(torch.nn.Module):
    """The main job's shape: embedding, packed bidirectional LSTM, both final states, linear."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(20, 6, padding_idx=0)
        self.lstm = st.LSTM(6, 7, bidirectional=True, batch_first=True)
        self.fc = torch.nn.Linear(14, 3)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.embedding(tokens), lengths, batch_first=True,
                                      enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)
        return self.fc(torch.cat([h_n[0], h_n[1]], dim=1))


class Stacked(torch.nn.Module):
    """Two seqpack layers on one PackedSequence, the second fed the first's packed
    output; lengths sorted by the caller (enforce_sorted=True: no permutation)."""

    def __init__(self):
        super().__init__()
        self.a = st.GRU(3, 4, bidirectional=True)
        self.b = st.LSTM(8, 5)

    def forward(self, x, lengths):
        out, _ = self.a(pack_padded_sequence(x, lengths, enforce_sorted=True))
        out, (h, _) = self.b(out)
        y, _ = pad_packed_sequence(out)
        return y, h


def test_classifier_and_stacked_layers(tmp_path):
    rng = np.random.default_rng(base_seed() + 2)
    torch.manual_seed(base_seed() + 2)
    clf, stacked = Classifier().eval(), Stacked().eval()
    tokens = torch.randint(1, 20, (3, 4))
    (tmp_path / "clf.onnx").write_bytes(
        export(clf, (tokens, torch.tensor([4, 2, 3])), ["tokens", "lengths"], ["logits"]))
    (tmp_path / "stk.onnx").write_bytes(
        export(stacked, (torch.randn(4, 3, 3), torch.tensor([4, 3, 2])), ["x", "lengths"],
               ["y", "h_n"]))
    lengths = [7, 2, 5, 7, 1]
    tokens = torch.randint(1, 20, (5, 7))
    for b, n in enumerate(lengths):
        tokens[b, n:] = 0
    x = torch.from_numpy(rng.uniform(-1, 1, (7, 5, 3)).astype(np.float32))
    L = torch.tensor(lengths)
    L_sorted = torch.tensor(sorted(lengths, reverse=True))
    with torch.no_grad():
        e_clf = clf(tokens, L).numpy()
        e_stk = [t.numpy() for t in stacked(x, L_sorted)]
    r = ort_runner.run([{"model": str(tmp_path / "clf.onnx"),
                         "inputs": {"tokens": tokens.numpy(), "lengths": L.numpy()}},
                        {"model": str(tmp_path / "stk.onnx"),
                         "inputs": {"x": x.numpy(), "lengths": L_sorted.numpy()}}])
    assert "error" not in r[0] and "error" not in r[1], r
    assert_close(r[0]["outputs"]["logits"], e_clf, 0, TOL, "classifier logits")
    assert_close(r[1]["outputs"]["y"], e_stk[0], 0, TOL, "stacked y")
    assert_close(r[1]["outputs"]["h_n"], e_stk[1], 0, TOL, "stacked h_n")


def test_padded_input_without_lengths(tmp_path):
    """A plain [B, T, I] tensor (every sequence of length T) exports without sequence_lens."""
    rng = np.random.default_rng(base_seed() + 3)
    rnn = st.GRU(3, 4, num_layers=2, batch_first=True).eval()
    (tmp_path / "g.onnx").write_bytes(
        export(rnn, (torch.randn(2, 3, 3),), ["x"], ["y", "h_n"], batch_first=True))
    x = torch.from_numpy(rng.uniform(-1, 1, (5, 6, 3)).astype(np.float32))
    with torch.no_grad():
        y, h = rnn(x)
    r = ort_runner.run([{"model": str(tmp_path / "g.onnx"), "inputs": {"x": x.numpy()}}])[0]
    assert "error" not in r, r.get("error")
    assert_close(r["outputs"]["y"], y.numpy(), 0, TOL, "padded y")
    assert_close(r["outputs"]["h_n"], h.numpy(), 0, TOL, "padded h_n")


def test_unbatched_input_with_state(tmp_path):
    """An unbatched [T, I] input with an unbatched (h0, c0), as torch accepts it."""
    rng = np.random.default_rng(base_seed() + 4)

    class Unbatched(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = st.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True)

        def forward(self, x, h0, c0):
            y, (h, c) = self.rnn(x, (h0, c0))
            return y, h, c

    model = Unbatched().eval()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(3, 3), torch.randn(4, 4), torch.randn(4, 4)), f,
                          opset_version=17, input_names=["x", "h0", "c0"],
                          output_names=["y", "h_n", "c_n"], dynamic_axes={"x": {0: "time"}})
    (tmp_path / "u.onnx").write_bytes(f.getvalue())
    args = [torch.from_numpy(rng.uniform(-1, 1, s).astype(np.float32))
            for s in ((6, 3), (4, 4), (4, 4))]
    with torch.no_grad():
        expected = model(*args)
    r = ort_runner.run([{"model": str(tmp_path / "u.onnx"),
                         "inputs": dict(zip(["x", "h0", "c0"], [a.numpy() for a in args]))}])[0]
    assert "error" not in r, r.get("error")
    for name, e in zip(["y", "h_n", "c_n"], expected):
        assert_close(r["outputs"][name], e.numpy(), 0, TOL, f"unbatched {name}")


def test_graph_uses_standard_operators_with_sequence_lens():
    onnx = pytest.importorskip("onnx")
    model = Packed("LSTM", False, bidirectional=True).eval()
    data = export(model, (torch.randn(3, 2, 3), torch.tensor([3, 2])), ["x", "lengths"],
                  ["y", "h_n", "c_n"])
    m = onnx.load_from_string(data)
    onnx.checker.check_model(m, full_check=True)  # with strict shape inference
    def nodes(graph):
        for n in graph.node:
            yield n
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    yield from nodes(a.g)

    lstm = [n for n in nodes(m.graph) if n.op_type == "LSTM"]
    assert len(lstm) == 1 and lstm[0].input[4] != "", "LSTM without sequence_lens"
    # The LSTM runs in the then branch of an If on "the input has elements".
    (guard,) = [n for n in m.graph.node if n.op_type == "If"]
    assert [n.op_type for n in guard.attribute[0].g.node] == ["LSTM"] or \
        [n.op_type for n in guard.attribute[1].g.node] == ["LSTM"]
    kinds = {n.op_type for n in nodes(m.graph)}
    assert not kinds & {"Expand", "Loop", "Scan"}, kinds
    assert all(n.domain in ("", "ai.onnx") for n in nodes(m.graph))


@pytest.mark.parametrize("mode", list(LAYERS))
def test_empty_batch_runs(tmp_path, mode):
    """Batch 0 (ONNX Runtime 1.20.1 crashes the process on an LSTM or GRU at batch 0,
    so the export runs the operator only on a non-empty input). Expected, written
    out: torch's shapes for an empty batch (nn.LSTM on [T, 0, I] gives output
    [T, 0, dirs * H] and h_n [layers * dirs, 0, H]); the padded output is cut to the
    longest length, which for no sequence is 0. Also T = 0 with every length 0:
    each sequence keeps h0 (zeros without) and has no output steps; any other
    length at T = 0 is an error."""
    rng = np.random.default_rng(base_seed() + 2)
    runs, cases = [], []
    for k, (bidirectional, batch_first, with_hx) in enumerate(
            [(False, False, False), (True, True, True), (True, False, True), (False, True, False)]):
        model = Packed(mode, with_hx, num_layers=2, bidirectional=bidirectional,
                       batch_first=batch_first).eval()
        n_in, n_out = names(model)
        path = tmp_path / f"m{k}.onnx"
        path.write_bytes(export(model, tuple(make_inputs(model, [2, 3], 3, rng)), n_in, n_out,
                                batch_first=batch_first))
        LD, DH = 2 * (2 if bidirectional else 1), 4 * (2 if bidirectional else 1)
        for B, T in ((0, 4), (0, 0), (3, 0)):
            inputs = [t.numpy() for t in make_inputs(model, [0] * B, T, rng)]
            states = inputs[2:] if with_hx else \
                [np.zeros((LD, B, 4), np.float32)] * (len(n_out) - 1)
            expected = [np.zeros((B, 0, DH) if batch_first else (0, B, DH), np.float32)] + states
            cases.append((f"{mode} bidirectional={bidirectional} batch_first={batch_first} "
                          f"hx={with_hx} B={B} T={T}", n_out, expected))
            runs.append({"model": str(path), "inputs": dict(zip(n_in, inputs))})
        # At T = 0 a length other than 0 is rejected, as the operator rejects
        # lengths outside [0, T] at T >= 1.
        for bad in ([0, 2, 0], [-1, 0, 0]):
            inputs = [t.numpy() for t in make_inputs(model, bad, 0, rng)]
            cases.append((f"{mode} lengths={bad} at T=0", None, None))
            runs.append({"model": str(path), "inputs": dict(zip(n_in, inputs))})
    results = ort_runner.run(runs)
    for (what, n_out, expected), r in zip(cases, results):
        if expected is None:
            assert "indices element out of data bounds" in r.get("error", ""), f"{what}: {r}"
            continue
        assert "error" not in r, f"{what}: {r.get('error')}"
        for name, e in zip(n_out, expected):
            assert r["outputs"][name].shape == e.shape, \
                f"{what} {name}: shape {r['outputs'][name].shape}, expected {e.shape}"
            assert_close(r["outputs"][name], e, 0, TOL, f"{what} {name}")


def test_unsupported_cases_raise_named_errors():
    class Projected(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = st.LSTM(3, 4, proj_size=2)

        def forward(self, x, lengths):
            return self.rnn(pack_padded_sequence(x, lengths, enforce_sorted=False))[1][0]

    class EmbedAfterPacking(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(10, 3)
            self.rnn = st.GRU(3, 4)

        def forward(self, tokens, lengths):
            packed = pack_padded_sequence(tokens, lengths, enforce_sorted=False)
            x = PackedSequence(self.embedding(packed.data), packed.batch_sizes,
                               packed.sorted_indices, packed.unsorted_indices)
            return self.rnn(x)[1]

    args = (torch.randn(3, 2, 3), torch.tensor([3, 2]))
    with pytest.raises(ValueError, match="proj_size = 2"):
        export(Projected().eval(), args, ["x", "lengths"], ["h_n"])
    with pytest.raises(ValueError, match="must come straight from pack_padded_sequence"):
        export(EmbedAfterPacking().eval(), (torch.randint(0, 10, (3, 2)), torch.tensor([3, 2])),
               ["x", "lengths"], ["h_n"])
    with pytest.raises(ValueError, match="opset_version = 13"):
        export(Packed("GRU", False).eval(), args, ["x", "lengths"], ["y", "h_n"], opset=13)


class PaddedLayer(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.rnn = layer

    def forward(self, x):
        return self.rnn(x)[0]


class PackedLayer(PaddedLayer):
    def forward(self, x, lengths):
        out = self.rnn(pack_padded_sequence(x, lengths, enforce_sorted=False))[0]
        return pad_packed_sequence(out)[0]


@pytest.mark.parametrize("wrapper", [PaddedLayer, PackedLayer])
@pytest.mark.parametrize("cls", [st.LSTM, st.GRU, st.RNN])
def test_dropout_in_training_mode_is_refused_by_name(wrapper, cls):
    """Dropout between layers has no ONNX operator: training (or preserve) mode wrote
    the eval graph for packed input and hit a torch internal assert for padded input;
    torch.nn's layers are refused in that case, and so are seqpack's, by name."""
    from torch.onnx import TrainingMode
    args = (torch.randn(5, 2, 4), torch.tensor([5, 3]))
    names = ["x", "lengths"]
    if wrapper is PaddedLayer:
        args, names = args[:1], names[:1]
    axes = {"x": {0: "time", 1: "batch"}}  # (a fixed shape trips a torch assert on the If)
    model = wrapper(cls(4, 6, num_layers=2, dropout=0.5))
    for mode in (TrainingMode.TRAINING, TrainingMode.PRESERVE):
        model.train()
        with pytest.raises(ValueError, match=r"dropout = 0\.5 in training mode"):
            torch.onnx.export(model, args, io.BytesIO(), opset_version=17, training=mode,
                              input_names=names, output_names=["y"], dynamic_axes=axes)
    # In eval mode (TrainingMode.EVAL, or PRESERVE of an eval model) the export is
    # the eval forward, with dropout or without.
    for mode, train in ((TrainingMode.EVAL, True), (TrainingMode.PRESERVE, False)):
        model.train(train)
        f = io.BytesIO()
        torch.onnx.export(model, args, f, opset_version=17, training=mode,
                          input_names=names, output_names=["y"], dynamic_axes=axes)
        assert len(f.getvalue()) > 0
    # Dropout 0 in training mode has nothing to drop.
    f = io.BytesIO()
    torch.onnx.export(wrapper(cls(4, 6, num_layers=2)).train(), args, f, opset_version=17,
                      training=TrainingMode.TRAINING, input_names=names, output_names=["y"], dynamic_axes=axes)
    assert len(f.getvalue()) > 0


# What torch itself still warns during these exports (docs/onnx.md lists them):
# torch 1.13's tracer on the torch.as_tensor in torch.nn.utils.rnn's
# pack_padded_sequence, and its exporter's shape inference on the prim:: nodes of
# packing and on the placeholder for an absent input (a layer on padded input
# given hx); torch 2.6 prints the latter from C++ to stderr, not as Python warnings.
TORCH_WARNINGS = ("torch.as_tensor results are registered as constants in the trace",
                  "The shape inference of prim::PackPadded type is missing",
                  "The shape inference of prim::PadPacked type is missing",
                  "The shape inference of prim::Constant type is missing")


def test_export_warns_nothing_of_seqpack():
    """No warning from seqpack's files, nothing deprecated and no private torch.onnx
    module named (seqpack used torch.onnx._patch_torch._graph_op, deprecated since
    1.13: 27 of an export's 33 warnings); torch's own warnings only those known."""
    torch.manual_seed(base_seed() + 5)
    caught = []
    for mode in LAYERS:
        model = Packed(mode, True, num_layers=2, bidirectional=True, batch_first=True).eval()
        rng = np.random.default_rng(base_seed() + 5)
        export(model, tuple(make_inputs(model, [3, 1, 2], 3, rng)), *names(model),
               batch_first=True, record=caught)
    export(Classifier().eval(), (torch.randint(1, 20, (3, 4)), torch.tensor([4, 2, 3])),
           ["tokens", "lengths"], ["logits"], record=caught)
    export(Stacked().eval(), (torch.randn(4, 3, 3), torch.tensor([4, 3, 2])), ["x", "lengths"],
           ["y", "h_n"], record=caught)
    export(st.GRU(3, 4, num_layers=2, batch_first=True).eval(), (torch.randn(2, 3, 3),), ["x"],
           ["y", "h_n"], batch_first=True, record=caught)
    no_bias = Packed("GRU", False, bias=False).eval()
    export(no_bias, (torch.randn(3, 2, 3), torch.tensor([3, 2])), *names(no_bias), record=caught)
    check_warnings(caught)


def check_warnings(caught):
    package = os.path.dirname(os.path.abspath(seqpack.__file__))
    sources = os.path.dirname(os.path.realpath(st.__file__))
    torch_dir = os.path.dirname(os.path.realpath(torch.__file__))
    for w in caught:
        where = f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}"
        path = os.path.abspath(w.filename)
        assert not path.startswith(package + os.sep), f"seqpack's own warning: {where}"
        assert not os.path.realpath(path).startswith(sources + os.sep), \
            f"seqpack's own warning: {where}"
        text = str(w.message)
        assert "torch.onnx._" not in text and "_graph_op" not in text, where
        if os.path.realpath(path).startswith(torch_dir + os.sep):
            assert not issubclass(w.category, (DeprecationWarning, FutureWarning)), where
            assert text.startswith(TORCH_WARNINGS), f"a new warning from torch: {where}"


class SeqpackPacking(torch.nn.Module):
    """seqpack.torch.pack_padded_sequence -> 2-layer bidirectional LSTM ->
    seqpack.torch.pad_packed_sequence (with padding_value and total_length)."""

    def __init__(self, enforce_sorted, batch_first, padding_value, total_length):
        super().__init__()
        self.lstm = st.LSTM(3, 5, num_layers=2, bidirectional=True, batch_first=batch_first)
        self.options = (enforce_sorted, batch_first, padding_value, total_length)

    def forward(self, x, lengths):
        enforce_sorted, batch_first, padding_value, total_length = self.options
        packed = st.pack_padded_sequence(x, lengths, batch_first=batch_first,
                                         enforce_sorted=enforce_sorted)
        out, (h_n, c_n) = self.lstm(packed)
        y, out_lengths = st.pad_packed_sequence(out, batch_first=batch_first,
                                                padding_value=padding_value,
                                                total_length=total_length)
        return y, h_n, c_n, out_lengths


@pytest.mark.parametrize("enforce_sorted,batch_first,padding_value,total_length,opset",
                         [(False, True, 0.0, None, 17), (False, False, -1.5, 9, 17),
                          (True, True, 2.0, 9, 14), (True, False, 0.0, None, 17)])
def test_seqpack_packing_functions_export(tmp_path, enforce_sorted, batch_first, padding_value,
                                          total_length, opset):
    """seqpack.torch's packing functions export too (symbolics for
    seqpack::pack_padded_sequence / pad_packed_sequence), zero lengths included
    when traced and when run, at other batch sizes and padded lengths than traced,
    batch 0 and padded length 0 included."""
    rng = np.random.default_rng(base_seed() + 6)
    torch.manual_seed(base_seed() + 6)
    model = SeqpackPacking(enforce_sorted, batch_first, padding_value, total_length).eval()
    names_out = ["y", "h_n", "c_n", "out_lengths"]
    # Traced with a zero length (which seqpack's packing keeps, without rows).
    traced = [6, 4, 0] if enforce_sorted else [0, 6, 4]
    x0 = torch.randn((3, 6, 3) if batch_first else (6, 3, 3))
    (tmp_path / "m.onnx").write_bytes(
        export(model, (x0, torch.tensor(traced)), ["x", "lengths"], names_out, opset=opset,
               batch_first=batch_first))
    runs, expected = [], []
    for lengths, T in (([7, 5, 3, 1, 0], 8) if enforce_sorted else ([3, 0, 7, 5, 1], 8),
                       ([4], 4), ([0, 0], 2) if not enforce_sorted else ([2, 0], 2),
                       ([], 4), ([0, 0, 0], 0)):  # empty inputs, as in test_empty_batch_runs
        shape = (len(lengths), T, 3) if batch_first else (T, len(lengths), 3)
        x = torch.from_numpy(rng.uniform(-1, 1, shape).astype(np.float32))
        L = torch.tensor(lengths, dtype=torch.int64)
        with torch.no_grad():
            expected.append((lengths, [t.numpy() for t in model(x, L)]))
        runs.append({"model": str(tmp_path / "m.onnx"),
                     "inputs": {"x": x.numpy(), "lengths": L.numpy()}})
    for (lengths, e), r in zip(expected, ort_runner.run(runs)):
        assert "error" not in r, f"lengths {lengths}: {r.get('error')}"
        for name, v in zip(names_out, e):
            got = r["outputs"][name]
            assert got.shape == v.shape, f"lengths {lengths} {name}: {got.shape} vs {v.shape}"
            assert_close(got, v, 0, TOL, f"seqpack packing lengths={lengths} {name}")


def test_seqpack_packing_export_warns_nothing_of_seqpack():
    caught = []
    export(SeqpackPacking(False, True, 0.0, None).eval(),
           (torch.randn(3, 4, 3), torch.tensor([4, 0, 2])), ["x", "lengths"],
           ["y", "h_n", "c_n", "out_lengths"], batch_first=True, record=caught)
    check_warnings(caught)


@pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                    reason="torch 1.13 exports up to opset 17")
@pytest.mark.parametrize("opset", [18, 20])
def test_newer_opsets_on_torch2(tmp_path, opset):
    """PyTorch 2.x exports opsets 18 to 20 too: every mode, run at another batch."""
    rng = np.random.default_rng(base_seed() + 7)
    torch.manual_seed(base_seed() + 7)
    runs, cases = [], []
    for mode in LAYERS:
        model = Packed(mode, True, num_layers=2, bidirectional=True, batch_first=True).eval()
        n_in, n_out = names(model)
        path = tmp_path / f"{mode}.onnx"
        path.write_bytes(export(model, tuple(make_inputs(model, [3, 1, 2], 3, rng)), n_in, n_out,
                                opset=opset, batch_first=True))
        inputs = make_inputs(model, [4, 1, 6, 2], 6, rng)
        with torch.no_grad():
            cases.append((mode, n_out, [t.numpy() for t in model(*inputs)]))
        runs.append({"model": str(path), "inputs": {n: t.numpy() for n, t in zip(n_in, inputs)}})
    for (mode, n_out, expected), r in zip(cases, ort_runner.run(runs)):
        assert "error" not in r, f"{mode} opset {opset}: {r.get('error')}"
        for name, e in zip(n_out, expected):
            assert_close(r["outputs"][name], e, 0, TOL, f"{mode} opset {opset} {name}")
