"""Who runs a layer's forward on CUDA tensors: seqpack's CUDA kernels or torch's.

SEQPACK_CUDA_LAYERS (read once per process):
  auto     (the default; unset or empty) the faster of the two for each
           configuration, timed on its first use and remembered, as cuDNN's
           benchmark mode does;
  seqpack  seqpack's kernels wherever they can run;
  torch    torch's kernels always.

A configuration is what decides the speed: the cell, sizes, layers, directions,
projection, bias, dtype and device, whether autograd records the call, the
training flag, the input's form (packed, padded with lengths, padded), and the
batch and the packed rows rounded up to powers of two. Its first call runs each
implementation once to warm it up and then `REPEATS` times under
torch.no_grad(), each call timed with the device synchronised before and after
(`timer`, replaceable: the tests inject times), and the faster one's result is
computed again for the caller; later calls of the configuration run the faster
one alone. With dropout in training, the timing calls draw masks of their own.

`last(layer)` says which implementation a layer's last CUDA forward ran and why
(seqpack.torch.cuda_choice).
"""
import os
import threading
import time
import weakref
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import torch

MODES = ("auto", "seqpack", "torch")
REPEATS = 3  # timed calls of each implementation, after one to warm it up


class Choice(NamedTuple):
    """Which implementation ran ("seqpack" or "torch") and why, in words."""
    impl: str
    why: str


_MODE: list = []  # [mode], once per process
_DECIDED: Dict[tuple, Choice] = {}
_LAST: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def mode() -> str:
    """SEQPACK_CUDA_LAYERS, checked: one of MODES (unset or empty: auto)."""
    if not _MODE:
        value = os.environ.get("SEQPACK_CUDA_LAYERS") or "auto"
        if value not in MODES:
            raise ValueError(f"SEQPACK_CUDA_LAYERS = {value!r}: use 'auto' (the faster of seqpack's "
                             f"CUDA kernels and torch's, per configuration; the default), 'seqpack' "
                             f"(seqpack's where they are built) or 'torch' (torch's)")
        _MODE.append(value)
    return _MODE[0]


def _synchronized_seconds(impl: str, run: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call of `run`, the device's queue drained before and after."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda _d=None: None)
    sync(device)
    t0 = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - t0


# timer(impl, run, device) -> seconds of one call of run; impl is "seqpack" or "torch".
timer: Callable[[str, Callable[[], object], torch.device], float] = _synchronized_seconds


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def key(layer, input: torch.Tensor, form: str, batch: int, rows: int) -> tuple:
    """The configuration of a forward of `layer` on `input` (see the module's text)."""
    grad = torch.is_grad_enabled() and (input.requires_grad or
                                        any(w.requires_grad for w in layer._flat_weights))
    return (layer.mode, layer.input_size, layer.hidden_size, layer.num_layers, layer.bidirectional,
            layer.proj_size, layer.bias, input.dtype, str(input.device), grad, layer.training,
            float(layer.dropout), form, _pow2(batch), _pow2(rows))


def decided(config: tuple) -> Optional[Choice]:
    with _LOCK:
        return _DECIDED.get(config)


def decide(config: tuple, runs: Dict[str, Callable[[], object]], device: torch.device) -> Choice:
    """Times each implementation of `runs` ({"seqpack": ..., "torch": ...}) and
    remembers the faster for `config`. A run that raises is not chosen (its
    error is in the reason); if both raise, the first error propagates."""
    seconds: Dict[str, float] = {}
    errors: Dict[str, BaseException] = {}
    with torch.no_grad():
        for impl, run in runs.items():
            try:
                run()  # warm-up: a first call's library loads and plans
                seconds[impl] = min(timer(impl, run, device) for _ in range(REPEATS))
            except Exception as e:  # noqa: BLE001 - the other implementation may run it
                errors[impl] = e
    if not seconds:
        raise next(iter(errors.values()))
    fast = min(seconds, key=lambda k: seconds[k])
    times = ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in seconds.items())
    why = f"SEQPACK_CUDA_LAYERS=auto: {fast} was faster for this configuration ({times}"
    why += "".join(f"; {k} failed: {type(e).__name__}: {e}" for k, e in errors.items()) + ")"
    choice = Choice(fast, why)
    with _LOCK:
        _DECIDED.setdefault(config, choice)
        return _DECIDED[config]


def record(layer, choice: Choice) -> None:
    with _LOCK:
        _LAST[layer] = choice


def last(layer) -> Optional[Choice]:
    """The implementation `layer`'s last forward on CUDA tensors ran and why, or
    None where none ran through this choice (no CUDA forward yet, or seqpack's
    CUDA library is not available: then torch's kernels run, and
    seqpack._cuda.why_unavailable() says why)."""
    with _LOCK:
        return _LAST.get(layer)


def forget() -> None:
    """Drops every remembered decision (and the mode read from the environment)."""
    with _LOCK:
        _DECIDED.clear()
        _MODE.clear()


def fixed(impl: str) -> Choice:
    return Choice(impl, f"SEQPACK_CUDA_LAYERS={impl}")


def run_chosen(layer, config: tuple, device: torch.device,
               runs: Dict[str, Callable[[], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward under SEQPACK_CUDA_LAYERS=auto: the remembered choice for
    `config`, or one made now, then the chosen implementation's run (recorded
    for last())."""
    choice = decided(config)
    if choice is None:
        choice = decide(config, runs, device)
    record(layer, choice)
    return runs[choice.impl]()
