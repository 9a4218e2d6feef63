"""precision= of the seqpack.nn layers: bf16 mixed precision against fp32 (the
bounds docs/performance.md gives), 'auto', the refusal on a CPU without
native bf16 and bf16's emulated products (SEQPACK_BF16=emulated), tested on
any CPU by capping oneDNN's ISA in a subprocess."""
import os
import subprocess
import sys

import numpy as np
import pytest

import seqpack
from seqpack import nn

NATIVE = seqpack.cpu_info()["native_bf16"]
# bf16 runs natively, or emulated (SEQPACK_BF16=emulated)
needs_bf16 = pytest.mark.skipif(seqpack.cpu_info()["bf16"] == "none",
                                reason=f"no bf16 on {seqpack.cpu_info()['isa']}")


def _env(**changes):
    """os.environ without SEQPACK_BF16, with `changes`: a subprocess's."""
    env = {k: v for k, v in os.environ.items() if k != "SEQPACK_BF16"}
    env.update(changes)
    return env


def _run(layer, seed=0):
    rng = np.random.default_rng(seed)
    seqs = [rng.uniform(-1, 1, (n, layer.input_size)).astype(np.float32) for n in (7, 0, 12, 3)]
    out, state = layer(seqpack.pack_sequence(seqs, enforce_sorted=False))
    return out, state


@needs_bf16
@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_bf16_close_to_fp32(cls):
    # Step weights of 96 x 96 and up: past bf16_step's 8192 elements, so bf16 runs.
    a = cls(24, 96, num_layers=2, bidirectional=True, seed=3)
    b = cls(24, 96, num_layers=2, bidirectional=True, seed=3, precision="bf16")
    assert a.precision == "fp32" and b.precision == "bf16"
    out_a, _ = _run(a)
    out_b, _ = _run(b)
    err = np.max(np.abs(out_a.data - out_b.data))
    assert 0 < err <= 0.03, err  # rounded (not fp32 by mistake), within the documented bound
    assert out_b.data.dtype == np.float32


@needs_bf16
def test_bf16_gradients_agree_with_fp32():
    a = nn.LSTM(16, 64, seed=1)
    b = nn.LSTM(16, 64, seed=1, precision="bf16")
    grads = []
    for layer in (a, b):
        out, _ = _run(layer, seed=4)
        layer.zero_grad()
        layer.backward(np.ones_like(out.data), None, None)
        grads.append({k: v.copy() for k, v in layer.grads.items()})
    for k in grads[0]:
        x, y = grads[0][k].ravel(), grads[1][k].ravel()
        cos = x @ y / np.sqrt((x @ x) * (y @ y))
        assert cos >= 0.999, (k, cos)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_int8_close_to_fp32_in_eval_and_refused_in_training(cls):
    a = cls(24, 96, num_layers=2, bidirectional=True, seed=3)
    b = cls(24, 96, num_layers=2, bidirectional=True, seed=3, precision="int8")
    assert b.precision == "int8"
    a.eval()
    b.eval()
    out_a, _ = _run(a)
    out_b, _ = _run(b)
    err = np.max(np.abs(out_a.data - out_b.data))
    assert 0 < err <= 0.03, err  # quantized (not fp32 by mistake), within the documented bound
    with pytest.raises(ValueError, match="int8 is for inference only"):
        b.backward(np.ones_like(out_b.data), None, None)
    b.train()
    with pytest.raises(ValueError, match="int8 is for inference only, but this forward is in "
                                         "training mode"):
        _run(b)


def test_int8_streams_give_the_layers_forward():
    """seqpack.StreamingRNN over an int8 layer: chunks of a sequence, beside
    another stream, give the values of the layer's forward over it."""
    layer = nn.LSTM(5, 32, num_layers=2, seed=2, precision="int8")
    layer.eval()
    rng = np.random.default_rng(6)
    x = rng.uniform(-1, 1, (13, 5)).astype(np.float32)
    whole, _ = layer(seqpack.pack_sequence([x]))
    from seqpack.streaming import StreamingRNN
    streams = StreamingRNN(layer)
    a, b = streams.open(), streams.open()
    got = [streams.push([a, b], [x[i:j], x[:3]])[0] for i, j in ((0, 4), (4, 4), (4, 13))]
    assert np.array_equal(np.concatenate(got), whole.data)


def test_auto_follows_the_cpu():
    layer = nn.GRU(4, 5, precision="auto")
    assert layer.precision == ("bf16" if NATIVE else "fp32")


@pytest.mark.parametrize("bad", ["fp16", "BF16", None, 16])
def test_bad_precision_names(bad):
    with pytest.raises(ValueError, match="precision"):
        nn.LSTM(4, 5, precision=bad)


@needs_bf16
def test_bf16_needs_float32():
    with pytest.raises(ValueError, match="float64"):
        nn.LSTM(4, 5, dtype=np.float64, precision="bf16")


@pytest.mark.parametrize("cap", ["AVX2", "AVX512_CORE"])
def test_capped_isa_refuses_bf16_and_auto_falls_back(cap):
    code = (
        "import seqpack\n"
        "from seqpack import nn\n"
        "info = seqpack.cpu_info()\n"
        "assert not info['native_bf16'], info\n"
        "assert nn.LSTM(3, 4, precision='auto').precision == 'fp32'\n"
        "try:\n"
        "    nn.LSTM(3, 4, precision='bf16')\n"
        "except ValueError as e:\n"
        "    assert 'ISA is ' + info['isa'] in str(e), str(e)\n"
        "    print('refused:', e)\n"
        "else:\n"
        "    raise SystemExit('bf16 accepted on ' + info['isa'])\n")
    res = subprocess.run([sys.executable, "-c", code], env=_env(ONEDNN_MAX_CPU_ISA=cap),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "refused" in res.stdout
    assert "SEQPACK_BF16=emulated" in res.stdout  # the refusal says how bf16 runs anyway


def test_emulated_bf16_runs_on_a_cpu_without_bf16():
    """SEQPACK_BF16=emulated on oneDNN capped to AVX2 (no bf16 on any CPU):
    precision='bf16' runs, rounded (not fp32 by mistake) and within bf16's
    documented bound of fp32, forward and backward; 'auto' stays fp32."""
    code = (
        "import numpy as np, seqpack\n"
        "from seqpack import nn\n"
        "info = seqpack.cpu_info()\n"
        "assert not info['native_bf16'] and info['bf16'] == 'emulated', info\n"
        "assert nn.LSTM(3, 4, precision='auto').precision == 'fp32'\n"
        "rng = np.random.default_rng(0)\n"
        "seqs = [rng.uniform(-1, 1, (n, 24)).astype(np.float32) for n in (7, 0, 12, 3)]\n"
        "x = seqpack.pack_sequence(seqs, enforce_sorted=False)\n"
        "for cls in (nn.LSTM, nn.GRU, nn.RNN):\n"
        "    a = cls(24, 96, num_layers=2, bidirectional=True, seed=3)\n"
        "    b = cls(24, 96, num_layers=2, bidirectional=True, seed=3, precision='bf16')\n"
        "    assert b.precision == 'bf16'\n"
        "    grads = []\n"
        "    for layer in (a, b):\n"
        "        out, _ = layer(x)\n"
        "        layer.zero_grad()\n"
        "        layer.backward(np.ones_like(out.data), None, None)\n"
        "        grads.append((out.data, {k: v.copy() for k, v in layer.grads.items()}))\n"
        "    err = np.max(np.abs(grads[0][0] - grads[1][0]))\n"
        "    assert 0 < err <= 0.03, (cls, err)\n"
        "    for k in grads[0][1]:\n"
        "        u, v = grads[0][1][k].ravel(), grads[1][1][k].ravel()\n"
        "        cos = u @ v / np.sqrt((u @ u) * (v @ v))\n"
        "        assert cos >= 0.999, (cls, k, cos)\n"
        "print('emulated ok')\n")
    res = subprocess.run([sys.executable, "-c", code],
                         env=_env(ONEDNN_MAX_CPU_ISA="AVX2", SEQPACK_BF16="emulated"),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "emulated ok" in res.stdout


def test_bad_bf16_setting_is_refused_at_import_by_name():
    res = subprocess.run([sys.executable, "-c", "import seqpack"],
                         env=_env(SEQPACK_BF16="software"), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode != 0
    assert "SEQPACK_BF16: 'software' is not native or emulated" in res.stderr, res.stderr
