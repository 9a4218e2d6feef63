"""seqpack.torch under torch.autocast("cpu", dtype=torch.bfloat16): bf16 mixed
precision where the CPU has native bf16 (fp32 elsewhere), results in the
input's dtype, gradients for the fp32 parameters; fp32 outside autocast."""
import os
import subprocess
import sys

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence

import seqpack
import seqpack.torch as st

NATIVE = seqpack.cpu_info()["native_bf16"]
needs_bf16 = pytest.mark.skipif(not NATIVE, reason=f"no native bf16 on {seqpack.cpu_info()['isa']}")


def _packed(dtype=torch.float32, seed=0, features=24):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.rand(n, features, generator=g) * 2 - 1 for n in (9, 4, 0 + 1, 7)]
    return pack_sequence([s.to(dtype) for s in seqs], enforce_sorted=False)


@needs_bf16
@pytest.mark.parametrize("cls", [st.LSTM, st.GRU, st.RNN])
def test_autocast_runs_bf16_and_keeps_the_input_dtype(cls):
    torch.manual_seed(0)
    m = cls(24, 96, num_layers=2, bidirectional=True)  # step weights past bf16_step's 8192
    x = _packed()
    with torch.no_grad():
        ref, _ = m(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = m(x)
    assert out.data.dtype == torch.float32
    err = (out.data - ref.data).abs().max().item()
    assert 0 < err <= 0.03, err  # rounded products, within docs/performance.md's bound


@needs_bf16
def test_autocast_with_bf16_input_returns_bf16_and_trains_fp32_weights():
    torch.manual_seed(1)
    m = st.LSTM(24, 64)
    ref_m = torch.nn.LSTM(24, 64)
    ref_m.load_state_dict(m.state_dict())
    x = _packed(torch.bfloat16, seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (h, c) = m(x)
    assert out.data.dtype == torch.bfloat16 and h.dtype == torch.bfloat16
    out.data.float().sum().backward()
    # The torch reference in fp32 on the same (bf16-valued) input.
    xf = torch.nn.utils.rnn.PackedSequence(x.data.float(), x.batch_sizes, x.sorted_indices,
                                           x.unsorted_indices)
    ref_m(xf)[0].data.sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref_m.parameters()):
        assert p.grad.dtype == torch.float32
        cos = torch.nn.functional.cosine_similarity(p.grad.flatten(), q.grad.flatten(), dim=0)
        assert cos >= 0.999, (name, cos.item())


def test_outside_autocast_stays_fp32_exact():
    torch.manual_seed(3)
    m = st.GRU(24, 37)
    ref = torch.nn.GRU(24, 37)
    ref.load_state_dict(m.state_dict())
    x = _packed(seed=4)
    with torch.no_grad():
        a, _ = m(x)
        b, _ = ref(x)
    assert (a.data - b.data).abs().max().item() <= 1e-5


def test_capped_isa_autocast_falls_back_to_fp32_and_explicit_bf16_is_refused():
    code = (
        "import torch, seqpack, seqpack.torch as st\n"
        "from torch.nn.utils.rnn import pack_sequence\n"
        "assert not seqpack.cpu_info()['native_bf16']\n"
        "torch.manual_seed(0)\n"
        "m = st.LSTM(5, 7); ref = torch.nn.LSTM(5, 7); ref.load_state_dict(m.state_dict())\n"
        "x = pack_sequence([torch.rand(4, 5), torch.rand(2, 5)])\n"
        "with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "    a = m(x)[0].data\n"
        "with torch.no_grad():\n"
        "    b = ref(x)[0].data\n"
        "assert (a - b).abs().max().item() <= 1e-5, 'autocast without native bf16 must be fp32'\n"
        "try:\n"
        "    torch.ops.seqpack.rnn(x.data, x.batch_sizes, None, None, None, None,\n"
        "        m._flat_weights, 'LSTM', 7, 1, True, False, 0, 0.0, False, None, 'bf16')\n"
        "except (ValueError, RuntimeError) as e:\n"
        "    assert 'ISA is ' + seqpack.cpu_info()['isa'] in str(e), str(e)\n"
        "    print('refused')\n")
    env = {k: v for k, v in os.environ.items() if k != "SEQPACK_BF16"}  # bf16 not emulated
    env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "refused" in res.stdout
