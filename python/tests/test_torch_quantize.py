"""seqpack.torch.quantize_dynamic: int8 recurrent layers for inference.

The references are independent of the code under test: the fp32 model run in
float64 by torch.nn (the error bound), torch's own quantize_dynamic on the same
model (its error, which seqpack's must not exceed twice over), and the same
quantized model run another way (alone against in a batch, packed against
padded, eager against TorchScript and torch.compile: identical bits)."""
import copy
import importlib.util
import os
import subprocess
import sys
import threading

import pytest
import torch
from torch.nn.utils import rnn as trnn

import seqpack
import seqpack.torch as st
from helpers import base_seed


# |int8 - float64 reference| on outputs and final states, weights
# U(-1/sqrt(H), 1/sqrt(H)) (torch's initialisation), inputs U(-1, 1): the C++
# parity grid's bound (docs/python.md, "int8 inference", gives the measured
# values: up to 0.005 for LSTM, 0.005 for GRU, 0.016 for RNN).
BOUND = 0.03

CLASSES = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN_TANH": torch.nn.RNN,
           "RNN_RELU": torch.nn.RNN}


def make(mode, input_size, hidden, seed, **kwargs):
    torch.manual_seed(seed)
    if mode.startswith("RNN_"):
        kwargs["nonlinearity"] = mode[4:].lower()
    return CLASSES[mode](input_size, hidden, **kwargs).eval()


def inputs(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) * 2 - 1


def states(hidden):
    """(h_n, c_n) of an LSTM's hidden tuple, (h_n, None) otherwise."""
    return hidden if isinstance(hidden, tuple) else (hidden, None)


def errors(mod, reference, x):
    """Largest |mod - reference| on the output, h_n and c_n (reference run in
    float64 on a copy)."""
    ref = copy.deepcopy(reference).double()
    with torch.no_grad():
        out, hidden = mod(x)
        r_out, r_hidden = ref(x.double())
    out = out.data if isinstance(out, trnn.PackedSequence) else out
    r_out = r_out.data if isinstance(r_out, trnn.PackedSequence) else r_out
    e = {"output": (out.double() - r_out).abs().max().item()}
    for name, a, b in zip(("h_n", "c_n"), states(hidden), states(r_hidden)):
        if a is not None:
            e[name] = (a.double() - b).abs().max().item()
    return e


GRID = [("LSTM", dict(num_layers=2, bidirectional=True)),
        ("LSTM", dict(num_layers=1, proj_size=8)),
        ("GRU", dict(num_layers=2, bidirectional=True)),
        ("RNN_TANH", dict(num_layers=2, bidirectional=True)),
        ("RNN_RELU", dict(num_layers=1))]


@pytest.mark.parametrize("hidden", [16, 96])
@pytest.mark.parametrize("mode,kwargs", GRID, ids=[f"{m}-{i}" for i, (m, _) in enumerate(GRID)])
def test_within_bound_of_float64_reference(mode, kwargs, hidden):
    seed = base_seed()
    m = make(mode, 24, hidden, seed, **kwargs)
    q = st.quantize_dynamic(m)
    x = inputs((30, 5, 24), seed + 1)
    e = errors(q, m, x)
    print(f"{mode} {kwargs} H={hidden}: int8 error {e} (seed {seed})")
    assert max(e.values()) <= BOUND, f"{e} (seed {seed})"
    # Not fp32 in disguise: int8 rounding shows.
    assert e["output"] > 1e-5, e


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_error_not_larger_than_torchs_quantize_dynamic(mode):
    seed = base_seed()
    m = make(mode, 32, 64, seed, num_layers=2, bidirectional=True)
    x = inputs((40, 6, 32), seed + 2)
    ours = errors(st.quantize_dynamic(m), m, x)
    # torch's convert swaps children only: the layer goes in a container.
    theirs_model = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(m))[0]
    assert type(theirs_model) is not type(m), "torch's quantize_dynamic did not swap the layer"
    theirs = errors(theirs_model, m, x)
    print(f"{mode}: seqpack int8 error {ours}, torch quantize_dynamic error {theirs} "
          f"(engine {torch.backends.quantized.engine}, torch {torch.__version__})")
    for k in ours:
        assert ours[k] <= 2 * theirs[k], f"{k}: seqpack {ours[k]} > 2 x torch {theirs[k]}"


class Tagger(torch.nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn
        self.head = torch.nn.Linear(rnn.hidden_size * (2 if rnn.bidirectional else 1), 3)

    def forward(self, x, lengths):
        packed = st.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, hidden = self.rnn(packed)
        padded, _ = st.pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
        h_n = hidden[0] if isinstance(hidden, tuple) else hidden
        return self.head(padded), h_n


def batch(n, steps, features, seed):
    x = inputs((n, steps, features), seed)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, steps + 1, (n,), generator=g)
    lengths[0] = steps
    return x, lengths


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH"])
def test_batch_invariant_bits(mode):
    """A sequence gives the same bits alone and inside batches of others
    (torch's int8 quantizes activations per tensor, so its results move)."""
    seed = base_seed()
    q = st.quantize_dynamic(make(mode, 12, 40, seed, num_layers=2, bidirectional=True,
                                 batch_first=True))
    x, lengths = batch(9, 15, 12, seed + 3)
    with torch.no_grad():
        out, hidden = q(x, lengths=lengths)
        h_n = states(hidden)[0]
        for i in range(9):
            L = int(lengths[i])
            alone, alone_hidden = q(x[i:i + 1, :L])
            assert torch.equal(alone[0], out[i, :L]), f"sequence {i} output (seed {seed})"
            assert torch.equal(states(alone_hidden)[0][:, 0], h_n[:, i]), f"sequence {i} h_n"
        # And in another batch: reversed, with a scaled neighbour.
        x2 = torch.cat([x.flip(0), 10 * x[:1]])
        out2, _ = q(x2, lengths=torch.cat([lengths.flip(0), lengths[:1]]))
    assert torch.equal(out2[:9].flip(0), out)


def test_packed_and_padded_give_the_same_bits():
    seed = base_seed()
    q = st.quantize_dynamic(make("LSTM", 10, 20, seed, num_layers=2, bidirectional=True))
    x, lengths = batch(6, 11, 10, seed + 4)
    time_major = x.transpose(0, 1)
    with torch.no_grad():
        packed = st.pack_padded_sequence(time_major, lengths, enforce_sorted=False)
        out_p, (h_p, c_p) = q(packed)
        padded_p, _ = st.pad_packed_sequence(out_p, total_length=11)
        out_l, (h_l, c_l) = q(time_major, lengths=lengths)
        # torch's own PackedSequence goes in as well.
        out_t, (h_t, _) = q(trnn.pack_padded_sequence(time_major, lengths, enforce_sorted=False))
    assert torch.equal(padded_p, out_l) and torch.equal(h_p, h_l) and torch.equal(c_p, c_l)
    assert torch.equal(out_t.data, out_p.data) and torch.equal(h_t, h_p)
    # Full-length padded input without lengths: the same as packing it.
    full = torch.full((6,), 11)
    with torch.no_grad():
        out_f, _ = q(time_major)
        out_fl, _ = q(time_major, lengths=full)
    assert torch.equal(out_f, out_fl)


def test_model_swap_semantics_and_state_dict_round_trip():
    seed = base_seed()
    torch.manual_seed(seed)
    model = Tagger(st.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True))
    model.train()
    q = st.quantize_dynamic(model)
    assert isinstance(q.rnn, st.QuantizedLSTM) and type(q.head) is torch.nn.Linear
    assert type(model.rnn) is st.LSTM and model.training, "not inplace: the model is untouched"
    assert not q.training and not q.rnn.training
    assert not any(p.requires_grad for p in q.rnn.parameters())
    # state_dict: the fp32 model's names and values.
    sd, qsd = model.state_dict(), q.state_dict()
    assert list(sd) == list(qsd)
    assert all(torch.equal(sd[k], qsd[k]) for k in sd)
    # load_state_dict of another fp32 model: the next forward quantizes the
    # new weights (the operators key their cache on the version counters).
    x, lengths = batch(4, 9, 8, seed + 5)
    torch.manual_seed(seed + 100)
    other = Tagger(st.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True))
    with torch.no_grad():
        before = q(x, lengths)[0]
        q.load_state_dict(other.state_dict())
        after = q(x, lengths)[0]
        expected = st.quantize_dynamic(other)(x, lengths)[0]
    assert not torch.equal(before, after)
    assert torch.equal(after, expected)
    # An in-place change of one weight is seen too.
    with torch.no_grad():
        q.rnn.weight_hh_l1_reverse.mul_(0.5)
        other.rnn.weight_hh_l1_reverse.mul_(0.5)
        assert torch.equal(q(x, lengths)[0], st.quantize_dynamic(other)(x, lengths)[0])
    # And an fp32 model loads the int8 model's state_dict.
    fp32 = Tagger(torch.nn.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True))
    fp32.load_state_dict(q.state_dict())


def test_inplace_and_the_model_itself():
    m = make("GRU", 5, 7, base_seed())
    q = st.quantize_dynamic(m)
    assert type(q) is st.QuantizedGRU and type(m) is torch.nn.GRU
    container = torch.nn.Sequential(torch.nn.RNN(5, 7), torch.nn.Linear(7, 2))
    same = st.quantize_dynamic(container, inplace=True)
    assert same is container and type(container[0]) is st.QuantizedRNN


def test_qconfig_spec_as_torch_reads_it():
    torch.manual_seed(base_seed())
    model = torch.nn.ModuleDict({
        "a": torch.nn.LSTM(4, 5), "b": st.LSTM(4, 5), "c": torch.nn.GRU(4, 5),
        "d": torch.nn.Sequential(torch.nn.RNN(4, 5)), "head": torch.nn.Linear(5, 2)})

    def kinds(m):
        return {k: type(v).__name__ for k, v in m.items()}

    q = kinds(st.quantize_dynamic(model))
    assert q == {"a": "QuantizedLSTM", "b": "QuantizedLSTM", "c": "QuantizedGRU",
                 "d": "Sequential", "head": "Linear"}
    assert type(st.quantize_dynamic(model)["d"][0]) is st.QuantizedRNN
    # Other types are left alone (torch would swap Linear for its int8 Linear).
    assert kinds(st.quantize_dynamic(model, {torch.nn.Linear})) == kinds(model)
    # torch.nn.LSTM selects seqpack.torch.LSTM as well; a name its subtree.
    assert kinds(st.quantize_dynamic(model, {torch.nn.LSTM, "d"})) == {
        "a": "QuantizedLSTM", "b": "QuantizedLSTM", "c": "GRU", "d": "Sequential",
        "head": "Linear"}
    # A dict: a None qconfig excludes, a name overrides a type.
    spec = {torch.nn.LSTM: torch.ao.quantization.default_dynamic_qconfig, "b": None}
    assert kinds(st.quantize_dynamic(model, spec))["b"] == "LSTM"
    with pytest.raises(TypeError, match="qconfig_spec entry 3"):
        st.quantize_dynamic(model, {3})
    with pytest.raises(TypeError, match="qconfig_spec must be"):
        st.quantize_dynamic(model, "a")


@pytest.mark.parametrize("dtype", [torch.float16, torch.quint8, torch.float32])
def test_dtype_other_than_qint8_is_refused(dtype):
    with pytest.raises(ValueError, match=f"dtype = {dtype} is not supported"):
        st.quantize_dynamic(torch.nn.LSTM(3, 4), dtype=dtype)


def test_float64_model_is_refused():
    with pytest.raises(ValueError, match="torch.float64 weights"):
        st.quantize_dynamic(torch.nn.LSTM(3, 4).double())


def test_inference_only():
    q = st.quantize_dynamic(torch.nn.Sequential(torch.nn.LSTM(3, 4)))
    x = inputs((5, 2, 3), 0)
    # eval mode, grad mode on: runs, and nothing records a graph.
    out, _ = q(x)
    assert not out.requires_grad and out.grad_fn is None
    with torch.no_grad():
        assert torch.equal(q(x)[0], out)
    with pytest.raises(ValueError, match="input or initial state requires grad"):
        q(x.clone().requires_grad_())
    with torch.no_grad():  # no graph wanted: fine
        q(x.clone().requires_grad_())
    q.train()
    with pytest.raises(ValueError, match="QuantizedLSTM is for inference only.*training mode"):
        q(x)
    # The operator refuses training on its own (the C++ core's error).
    layer = q[0]
    with pytest.raises(ValueError, match="int8 is for inference only"):
        torch.ops.seqpack.rnn_padded(x, None, None, None, layer._flat_weights, "LSTM", 4, 1, True,
                                     False, False, 0, 0.0, True, None, "int8")


def test_torchscript_gives_the_eager_bits(tmp_path):
    seed = base_seed()
    torch.manual_seed(seed)
    q = st.quantize_dynamic(Tagger(torch.nn.GRU(8, 16, num_layers=2, bidirectional=True,
                                                batch_first=True)))
    x, lengths = batch(5, 7, 8, seed + 6)
    scripted = torch.jit.script(q)
    path = str(tmp_path / "q.pt")
    scripted.save(path)
    loaded = torch.jit.load(path)
    # The bare layer scripts as torch.nn.GRU does (its overloaded forward is
    # called from a scripted model, as above).
    torch.jit.script(q.rnn)
    with torch.no_grad():
        eager = q(x, lengths)
        for got in (scripted(x, lengths), loaded(x, lengths)):
            assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    scripted.train()
    with pytest.raises(Exception, match="training mode"):
        scripted(x, lengths)


needs_compile = pytest.mark.skipif(
    not hasattr(torch.library, "register_fake"),
    reason=f"torch.compile of seqpack.torch needs PyTorch 2.4+ (torch.library.register_fake); "
           f"this is {torch.__version__}")


# Inductor builds its kernels with setuptools' C++ extension machinery.
HAS_SETUPTOOLS = importlib.util.find_spec("setuptools.command") is not None


@needs_compile
@pytest.mark.parametrize("backend", [
    "aot_eager",
    pytest.param("inductor", marks=pytest.mark.skipif(
        not HAS_SETUPTOOLS, reason="inductor needs setuptools (python3-setuptools)"))])
def test_torch_compile_gives_the_eager_bits(backend):
    import torch._dynamo
    seed = base_seed()
    torch.manual_seed(seed)
    q = st.quantize_dynamic(Tagger(torch.nn.LSTM(8, 16, num_layers=2, bidirectional=True,
                                                 batch_first=True)))
    torch._dynamo.reset()
    # No allow_rnn: seqpack.torch lets Dynamo trace its layers (docs/python.md).
    compiled = torch.compile(q, backend=backend, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for n, steps, s in [(4, 7, 1), (6, 9, 2)]:
            x, lengths = batch(n, steps, 8, seed + s)
            got, eager = compiled(x, lengths), q(x, lengths)
            assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    torch._dynamo.reset()


def test_threads_share_the_quantized_weights():
    """Several threads, several models: each result is the serial one (the
    operators' cache of quantized weights is shared and locked)."""
    seed = base_seed()
    models = [st.quantize_dynamic(make("LSTM", 6, 12, seed + i)) for i in range(3)]
    x = inputs((8, 3, 6), seed)
    with torch.no_grad():
        expected = [m(x)[0] for m in models]
    failures = []

    def run(k):
        with torch.no_grad():
            for _ in range(20):
                i = (k + _) % 3
                if not torch.equal(models[i](x)[0], expected[i]):
                    failures.append((k, i))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_without_vnni_int8_runs_on_avx2_and_asking_for_vnni_names_the_isa():
    """Capped below VNNI, a quantized layer runs on AVX2's kernel within the
    bound of its quantization (tolerance.int8_rnn_bound: two steps, so the
    first-order bound is tight) of the float64 reference; SEQPACK_INT8_KERNEL=vnni
    there is refused naming the ISA."""
    code = (
        "import copy, torch, seqpack, seqpack.torch as st\n"
        f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "from tolerance import int8_rnn_bound\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.LSTM(3, 4)\n"
        "q = st.quantize_dynamic(m)\n"
        "x = torch.rand(2, 1, 3) * 2 - 1\n"
        "try:\n"
        "    with torch.no_grad():\n"
        "        out = q(x)[0]\n"
        "except ValueError as e:\n"
        "    assert 'oneDNN ISA' in str(e), str(e)\n"
        "    print('refused:', e)\n"
        "else:\n"
        "    info = seqpack.cpu_info()\n"
        "    assert not info['native_int8'] and info['int8_kernel'] == 'avx2', info\n"
        "    with torch.no_grad():\n"
        "        ref = copy.deepcopy(m).double()(x.double())[0]\n"
        "    err = (out.double() - ref).abs().max().item()\n"
        "    bound = int8_rnn_bound(m, x.abs().max().item(), steps=2)\n"
        "    print('ran, error', err, 'bound', bound)\n")
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX512_CORE")
    env.pop("SEQPACK_INT8_KERNEL", None)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ran, error" in res.stdout, res.stdout
    err, bound = float(res.stdout.split()[-3]), float(res.stdout.split()[-1])
    assert 0 < err <= bound, res.stdout  # int8's rounding shows, within its bound
    env["SEQPACK_INT8_KERNEL"] = "vnni"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "refused" in res.stdout and "'vnni' needs AVX512-VNNI" in res.stdout, res.stdout


class _Exported(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.rnn = layer

    def forward(self, x):
        out, (h_n, _) = self.rnn(x)
        return out, h_n


def test_onnx_export_writes_the_float32_model():
    """torch.onnx.export of a quantized model gives the float32 model's graph
    and weights (ONNX's float LSTM): the int8 scheme is not exported."""
    onnx = pytest.importorskip("onnx")
    import io
    import warnings

    def export(model):
        f = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.zeros(3, 2, 4),), f, opset_version=17,
                              input_names=["x"], output_names=["y", "h"],
                              dynamic_axes={"x": {0: "time", 1: "batch"},
                                            "y": {0: "time", 1: "batch"}, "h": {1: "batch"}})
        return onnx.load_from_string(f.getvalue())

    torch.manual_seed(base_seed())
    fp32 = _Exported(st.LSTM(4, 5)).eval()
    a, b = export(fp32), export(st.quantize_dynamic(fp32))
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]

    def ops(graph):  # with the subgraphs of If and Loop
        for n in graph.node:
            yield n.op_type
            for attr in n.attribute:
                if attr.HasField("g"):
                    yield from ops(attr.g)

    assert "LSTM" in set(ops(b.graph))
    assert [i.raw_data for i in a.graph.initializer] == [i.raw_data for i in b.graph.initializer]


def test_new_models_at_freed_addresses_are_quantized_afresh():
    """Models made and dropped one after another (their weights' memory is
    reused): each is within the bound of its own float64 reference, so no
    result came from another model's cached quantized weights."""
    seed = base_seed()
    x = inputs((6, 2, 5), seed)
    for i in range(12):
        m = make("GRU", 5, 6, seed + 10 + i)
        e = errors(st.quantize_dynamic(m), m, x)
        assert max(e.values()) <= BOUND, f"model {i}: {e}"
        del m


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_streaming_an_int8_layer_equals_its_forward_and_sees_weight_changes(mode):
    """seqpack.torch.StreamingRNN over a quantized layer streams at int8: a
    sequence fed in chunks, beside another stream, gives the layer's forward
    over the whole sequence (equal values: the rows are quantized one by one),
    and an in-place change to the weights is seen at the next push."""
    from seqpack.torch_streaming import StreamingRNN
    q = st.quantize_dynamic(make(mode, 6, 24, base_seed() + 3, num_layers=2))
    x = inputs((17, 1, 6), base_seed() + 4)
    other = inputs((9, 6), base_seed() + 5)
    streams = StreamingRNN(q)
    assert streams.precision == "int8"
    a, b = streams.open(), streams.open()
    got = []
    at = 0
    for n, m in ((1, 3), (7, 0), (0, 4), (9, 2)):
        ya, _ = streams.push([a, b], [x[at:at + n, 0], other[:m]])
        got.append(ya)
        at += n
    with torch.no_grad():
        whole, _ = q(x)
    assert torch.equal(torch.cat(got), whole[:, 0])
    with torch.no_grad():
        for name in q._flat_weights_names:
            if name.startswith("weight"):
                getattr(q, name).mul_(0.5)
        halved, _ = q(x)
    c = streams.open()
    (yc,) = streams.push([c], [x[:, 0]])
    assert torch.equal(yc, halved[:, 0])
