#!/usr/bin/env python3
"""Example 2: an LSTM (input 2, hidden 3) over the batch
[[1,1],[2,2],[3,3],[4,4],[5,5]] and [[10,10],[20,20]], packed.

The same weights run in torch.nn.LSTM, seqpack.nn.LSTM (NumPy) and
seqpack.torch.LSTM; outputs, h_n and c_n must agree.
"""
import numpy as np
import torch
from torch.nn.utils import rnn as trnn

import seqpack
import seqpack.torch

a = np.array([[1, 1], [2, 2], [3, 3], [4, 4], [5, 5]], dtype=np.float32)
b = np.array([[10, 10], [20, 20]], dtype=np.float32)

torch.manual_seed(0)
tlstm = torch.nn.LSTM(input_size=2, hidden_size=3)
lstm = seqpack.nn.LSTM(input_size=2, hidden_size=3)
lstm.load_state_dict({k: v.numpy() for k, v in tlstm.state_dict().items()})

packed = seqpack.pack_sequence([a, b])
out, (h_n, c_n) = lstm(packed)
print("packed output data:\n", out.data, "\nbatch_sizes:", out.batch_sizes)
print("h_n:\n", h_n, "\nc_n:\n", c_n)
unpacked, lengths = seqpack.pad_packed_sequence(out, batch_first=True)
print("unpacked output:\n", unpacked, "\nlengths:", lengths)

with torch.no_grad():
    tout, (th, tc) = tlstm(trnn.pack_sequence([torch.from_numpy(a), torch.from_numpy(b)]))
    tunpacked, tlengths = trnn.pad_packed_sequence(tout, batch_first=True)
np.testing.assert_allclose(out.data, tout.data.numpy(), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(h_n, th.numpy(), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(c_n, tc.numpy(), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(unpacked, tunpacked.numpy(), rtol=1e-5, atol=1e-6)
assert np.array_equal(lengths, tlengths.numpy())

# The drop-in module: same constructor, same initialisation as torch's.
torch.manual_seed(0)
slstm = seqpack.torch.LSTM(input_size=2, hidden_size=3)
with torch.no_grad():
    sout, (sh, sc) = slstm(trnn.pack_sequence([torch.from_numpy(a), torch.from_numpy(b)]))
np.testing.assert_allclose(sout.data.numpy(), tout.data.numpy(), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(sc.numpy(), tc.numpy(), rtol=1e-5, atol=1e-6)
print("example 2: seqpack == torch")
