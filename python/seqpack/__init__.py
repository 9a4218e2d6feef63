"""seqpack: variable-length sequence batching and RNN/LSTM/GRU on packed batches.

NumPy level::

    import numpy as np, seqpack
    p = seqpack.pack_sequence([np.array([1., 2, 3]), np.array([4., 5])])
    out, h_n = seqpack.nn.GRU(1, 4)(seqpack.pack_sequence(...))

``import seqpack.torch`` gives drop-in replacements for torch.nn.LSTM/GRU/RNN.
"""
from ._seqpack import DType, cpu_info  # noqa: F401
# The compiled library's version (CMake's project VERSION), so that it always
# names the library this package runs: "0.1.0".
from ._seqpack import __version__  # noqa: F401
from .packing import (  # noqa: F401
    PackedSequence,
    invert_permutation,
    pack_padded_sequence,
    pack_sequence,
    pad_packed_sequence,
    pad_sequence,
    unpack_sequence,
    unpad_sequence,
)
from .threading import get_num_threads, set_num_threads  # noqa: F401
from . import nn  # noqa: F401
from . import streaming  # noqa: F401
from . import data  # noqa: F401

__all__ = [
    "PackedSequence",
    "pad_sequence",
    "pack_padded_sequence",
    "pack_sequence",
    "pad_packed_sequence",
    "unpad_sequence",
    "unpack_sequence",
    "invert_permutation",
    "set_num_threads",
    "get_num_threads",
    "cpu_info",
    "nn",
    "streaming",
    "data",
]
