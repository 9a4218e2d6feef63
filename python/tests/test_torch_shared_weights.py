"""Weights another process changes in place (Hogwild training: share_memory(),
a worker stepping the parameters under no_grad, the documented torch way) are
seen by the next forward. Such a change moves no version counter of this
process, so seqpack never caches a plan of weights in shared memory."""
import torch
import torch.multiprocessing as mp

import seqpack.torch as spt
from tolerance import assert_fp_close, module_reduction_length


def _worker_step(params, delta):
    # The worker's update: in place, under no_grad, on the shared storages.
    torch.set_num_threads(1)
    with torch.no_grad():
        for p in params:
            p.add_(delta * torch.sign(p))


def _torch_twin(layer, cls):
    twin = cls(layer.input_size, layer.hidden_size, num_layers=layer.num_layers,
               bidirectional=layer.bidirectional)
    twin.load_state_dict(layer.state_dict())
    return twin.eval()


def test_a_worker_process_updating_shared_weights_is_seen():
    torch.manual_seed(0)
    layer = spt.LSTM(5, 6, num_layers=2, bidirectional=True).eval()
    layer.share_memory()
    assert all(p.is_shared() for p in layer.parameters())
    x = torch.randn(4, 3, 5)
    with torch.no_grad():
        before = layer(x)[0]  # would cache a plan of these weights
    ctx = mp.get_context("spawn")
    worker = ctx.Process(target=_worker_step, args=(list(layer.parameters()), 0.25))
    worker.start()
    worker.join(timeout=120)
    assert worker.exitcode == 0, worker.exitcode
    twin = _torch_twin(layer, torch.nn.LSTM)  # the updated weights, as torch reads them
    with torch.no_grad():
        got, (h, c) = layer(x)
        want, (wh, wc) = twin(x)
    assert (got - before).abs().max() > 1e-3  # the update changed the output
    n = module_reduction_length(layer, [4] * 3)
    assert_fp_close(got, want, n, what="output")
    assert_fp_close(h, wh, n, what="h_n")
    assert_fp_close(c, wc, n, what="c_n")


def test_in_place_update_in_this_process_is_still_seen():
    # The ordinary path: a version counter moves, the cached plan is made again.
    torch.manual_seed(1)
    layer = spt.GRU(3, 4).eval()
    x = torch.randn(5, 2, 3)
    with torch.no_grad():
        layer(x)
        for p in layer.parameters():
            p.mul_(0.5)
        got = layer(x)[0]
    want = _torch_twin(layer, torch.nn.GRU)(x)[0]
    assert_fp_close(got, want.detach(), module_reduction_length(layer, [5] * 2), what="output")
