"""Random recurrent configurations over the grid of the recurrent-layer issue
(cell type x layers x bidirectional x batch_first x proj x bias x packed or
padded x h0 given or not, sorted/unsorted/tied lengths), and torch's results
for them: outputs, h_n, c_n and every gradient for a random upstream gradient."""
import numpy as np
import torch
from torch.nn.utils import rnn as trnn

from tolerance import rnn_reduction_length

MODES = ["RNN_TANH", "RNN_RELU", "LSTM", "GRU"]


def make_configs(seed, count):
    rng = np.random.default_rng(seed)
    configs = []
    for i in range(count):
        mode = MODES[i % 4]  # every cell type equally often
        hidden = int(rng.choice([3, 5, 7, 11]))
        b = int(rng.integers(1, 6))
        kind = rng.choice(["unsorted", "sorted", "ties", "equal"])
        if kind == "equal":
            lengths = [int(rng.integers(1, 6))] * b
        else:
            lengths = rng.integers(1, 7, size=b).tolist()
            if kind == "ties" and b > 1:
                lengths[-1] = lengths[0]
            if kind == "sorted":
                lengths.sort(reverse=True)
        configs.append(dict(
            index=i, seed=int(seed * 1000 + i), mode=mode,
            input_size=int(rng.integers(1, 7)), hidden_size=hidden,
            num_layers=int(rng.integers(1, 4)), bias=bool(rng.random() < 0.75),
            batch_first=bool(rng.random() < 0.5), bidirectional=bool(rng.random() < 0.5),
            proj_size=int(rng.integers(1, hidden)) if mode == "LSTM" and rng.random() < 0.4 else 0,
            packed=bool(rng.random() < 0.6), h0=bool(rng.random() < 0.5), lengths=lengths,
            dtype=torch.float64 if i % 5 == 4 else torch.float32))
    return configs


def config_id(c):
    return (f"{c['index']}-{c['mode']}-L{c['num_layers']}{'-bi' if c['bidirectional'] else ''}"
            f"{'-bf' if c['batch_first'] else ''}{'-p' + str(c['proj_size']) if c['proj_size'] else ''}"
            f"{'' if c['bias'] else '-nobias'}-{'packed' if c['packed'] else 'padded'}"
            f"{'-h0' if c['h0'] else ''}-{str(c['dtype'])[6:]}-seed{c['seed']}")


def torch_module(c, cls=None):
    """torch.nn.<mode> (or `cls`, a drop-in subclass) built after torch.manual_seed."""
    torch.manual_seed(c["seed"])
    kwargs = dict(num_layers=c["num_layers"], bias=c["bias"], batch_first=c["batch_first"],
                  bidirectional=c["bidirectional"], dtype=c["dtype"])
    mode = c["mode"]
    if cls is None:
        cls = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}.get(mode, torch.nn.RNN)
    if mode == "LSTM":
        kwargs["proj_size"] = c["proj_size"]
    if mode.startswith("RNN"):
        kwargs["nonlinearity"] = "tanh" if mode == "RNN_TANH" else "relu"
    return cls(c["input_size"], c["hidden_size"], **kwargs)


def make_inputs(c):
    """Inputs as NumPy arrays (the same values feed torch and seqpack)."""
    g = torch.Generator().manual_seed(c["seed"] + 1)
    dt = c["dtype"]
    lengths, b, i = c["lengths"], len(c["lengths"]), c["input_size"]
    dirs = 2 if c["bidirectional"] else 1
    hr = c["proj_size"] or c["hidden_size"]
    inputs = {}
    if c["packed"]:
        inputs["seqs"] = [torch.randn(n, i, generator=g, dtype=dt).numpy() for n in lengths]
    else:
        t = max(lengths)
        shape = (b, t, i) if c["batch_first"] else (t, b, i)
        inputs["padded"] = torch.randn(*shape, generator=g, dtype=dt).numpy()
    if c["h0"]:
        inputs["h0"] = torch.randn(c["num_layers"] * dirs, b, hr, generator=g, dtype=dt).numpy()
        if c["mode"] == "LSTM":
            inputs["c0"] = torch.randn(c["num_layers"] * dirs, b, c["hidden_size"],
                                       generator=g, dtype=dt).numpy()
    return inputs


def run_torch(module, c, inputs):
    """Forward, then backward of sum(out * g_out) + sum(h_n * g_h) + sum(c_n * g_c).
    Returns results, upstream gradients and gradients as NumPy arrays."""
    is_lstm = c["mode"] == "LSTM"
    if c["packed"]:
        tp = trnn.pack_sequence([torch.from_numpy(s) for s in inputs["seqs"]],
                                enforce_sorted=False)
        leaf = tp.data.detach().clone().requires_grad_()
        x = trnn.PackedSequence(leaf, tp.batch_sizes, tp.sorted_indices, tp.unsorted_indices)
    else:
        leaf = torch.from_numpy(inputs["padded"]).clone().requires_grad_()
        x = leaf
    hx = None
    h0 = c0 = None
    if c["h0"]:
        h0 = torch.from_numpy(inputs["h0"]).clone().requires_grad_()
        hx = h0
        if is_lstm:
            c0 = torch.from_numpy(inputs["c0"]).clone().requires_grad_()
            hx = (h0, c0)
    out, hidden = module(x, hx)
    out_t = out.data if c["packed"] else out
    h_n, c_n = hidden if is_lstm else (hidden, None)

    g = torch.Generator().manual_seed(c["seed"] + 2)
    g_out = torch.randn(out_t.shape, generator=g, dtype=c["dtype"])
    g_h = torch.randn(h_n.shape, generator=g, dtype=c["dtype"])
    g_c = torch.randn(c_n.shape, generator=g, dtype=c["dtype"]) if is_lstm else None
    loss = (out_t * g_out).sum() + (h_n * g_h).sum()
    if is_lstm:
        loss = loss + (c_n * g_c).sum()
    module.zero_grad()
    loss.backward()

    def np_(t):
        return None if t is None else t.detach().numpy().copy()
    return dict(
        output=np_(out_t), h_n=np_(h_n), c_n=np_(c_n),
        g_out=np_(g_out), g_h=np_(g_h), g_c=np_(g_c),
        grad_input=np_(leaf.grad), grad_h0=np_(h0.grad) if h0 is not None else None,
        grad_c0=np_(c0.grad) if c0 is not None else None,
        grad_params={n: np_(p.grad) for n, p in module.named_parameters()})


def reduction_length(c):
    """n of tolerance.assert_fp_close for every value and gradient of a config:
    its recurrence over every token of the batch (docs/testing.md)."""
    return rnn_reduction_length(c["input_size"], c["hidden_size"], c["num_layers"],
                                c["bidirectional"], sum(c["lengths"]), c["proj_size"])


def make_wide_configs(seed):
    """Hidden sizes 37 and 130, past one SIMD vector (4-16 floats) and the kernels'
    4-vector unrolled loops, so that the vector bodies of the gate kernels meet
    torch and not only their scalar tails. Per mode: H = 37 and H = 130, both
    2 layers, bidirectional, packed with mixed lengths; a float64 padded case at
    H = 37; for LSTM also proj_size 33 at H = 130 and proj_size 5 at H = 37."""
    rng = np.random.default_rng(seed)
    configs = []

    def add(mode, hidden, **kw):
        b = int(rng.integers(2, 5))
        lengths = rng.integers(1, 6, size=b).tolist()
        if len(set(lengths)) == 1:
            lengths[0] += 1  # mixed lengths: some sequences end before others
        c = dict(index=100 + len(configs), seed=int(seed * 1000 + 100 + len(configs)), mode=mode,
                 input_size=int(rng.integers(1, 5)), hidden_size=hidden, num_layers=2, bias=True,
                 batch_first=bool(rng.random() < 0.5), bidirectional=True, proj_size=0,
                 packed=True, h0=bool(rng.random() < 0.5), lengths=lengths, dtype=torch.float32)
        c.update(kw)
        configs.append(c)

    for mode in MODES:
        add(mode, 37, h0=True)
        add(mode, 130)
        add(mode, 37, num_layers=1, packed=False, h0=True, dtype=torch.float64)
        if mode == "LSTM":
            add(mode, 130, proj_size=33, h0=True)
            add(mode, 37, proj_size=5, bidirectional=False)
    return configs
