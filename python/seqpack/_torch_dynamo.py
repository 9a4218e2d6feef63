"""torch.compile of seqpack's recurrent layers without the user's
torch._dynamo.config.allow_rnn.

Dynamo refuses to wrap any instance of torch.nn.LSTM/GRU/RNN unless
allow_rnn ("TorchDynamo purposely graph breaks on RNN, GRU, LSTMs": the one
check, in VariableBuilder.wrap_module, from PyTorch 2.0 to 2.6 and in the
later sources read), because
torch's own layers run one opaque cuDNN/ATen call it cannot trace. seqpack's
layers subclass torch's but run operators with fake implementations, which
Dynamo traces. install() wraps wrap_module so that allow_rnn is on while it
wraps a seqpack layer, and only then: torch's own RNN modules meet the check
as before. Dynamo is imported lazily by torch.compile (about a second), so
the wrapping waits for the module that holds wrap_module to be imported.
Imports nothing of seqpack's.
"""
import functools
import importlib.abc
import importlib.util
import sys

_BUILDER = "torch._dynamo.variables.builder"
_layer_types: tuple = ()


def install(layer_type: type) -> None:
    """Let Dynamo wrap instances of `layer_type` as if allow_rnn were set."""
    global _layer_types
    _layer_types = (layer_type,)
    if _BUILDER in sys.modules:
        _wrap(sys.modules[_BUILDER])
    elif not any(isinstance(f, _BuilderFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _BuilderFinder())


def _wrap(builder) -> None:
    cls = getattr(builder, "VariableBuilder", None)
    wrap_module = getattr(cls, "wrap_module", None)
    if wrap_module is None or hasattr(wrap_module, "_seqpack_wrapped"):
        return
    try:
        from torch._dynamo import config
    except ImportError:
        return
    if not hasattr(config, "allow_rnn"):
        return

    @functools.wraps(wrap_module)
    def seqpack_wrap_module(self, value, *args, **kwargs):
        if isinstance(value, _layer_types) and not config.allow_rnn:
            with config.patch(allow_rnn=True):
                return wrap_module(self, value, *args, **kwargs)
        return wrap_module(self, value, *args, **kwargs)

    seqpack_wrap_module._seqpack_wrapped = wrap_module
    cls.wrap_module = seqpack_wrap_module


class _BuilderFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when torch._dynamo.variables.builder is imported,
    runs its module as the other finders found it, then _wrap."""

    def find_spec(self, name, path, target=None):
        if name != _BUILDER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                _wrap(module)

            def __getattr__(self, attr):  # get_source, get_filename, ... as the loader's
                return getattr(loader, attr)

        spec.loader = _Loader()
        return spec
