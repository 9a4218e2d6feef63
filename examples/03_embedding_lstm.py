#!/usr/bin/env python3
"""Example 3: Embedding + pack + LSTM + unpack over the token ids
[1,2,3], [4,5], [6,7,8,9,10] (the embedding lookup done in NumPy)."""
import numpy as np
import torch
from torch.nn.utils import rnn as trnn

import seqpack

ids = [np.array([1, 2, 3]), np.array([4, 5]), np.array([6, 7, 8, 9, 10])]

torch.manual_seed(1)
embedding = torch.nn.Embedding(11, 4)
tlstm = torch.nn.LSTM(4, 5, batch_first=True)
table = embedding.weight.detach().numpy()
lstm = seqpack.nn.LSTM(4, 5, batch_first=True)
lstm.load_state_dict({k: v.numpy() for k, v in tlstm.state_dict().items()})

# seqpack: pad the ids, embed, pack (unsorted lengths), run, unpack.
padded_ids = seqpack.pad_sequence(ids, batch_first=True)            # [3, 5]
lengths = [len(s) for s in ids]
embedded = table[padded_ids]                                        # [3, 5, 4]
packed = seqpack.pack_padded_sequence(embedded, lengths, batch_first=True,
                                      enforce_sorted=False)
out, (h_n, c_n) = lstm(packed)
output, out_lengths = seqpack.pad_packed_sequence(out, batch_first=True)
print("output [batch, time, hidden]:\n", output, "\nlengths:", out_lengths)

# torch, the same pipeline.
with torch.no_grad():
    tpadded = trnn.pad_sequence([torch.from_numpy(s) for s in ids], batch_first=True)
    tpacked = trnn.pack_padded_sequence(embedding(tpadded), torch.tensor(lengths),
                                        batch_first=True, enforce_sorted=False)
    tout, (th, tc) = tlstm(tpacked)
    toutput, tlengths = trnn.pad_packed_sequence(tout, batch_first=True)
assert np.array_equal(padded_ids, tpadded.numpy())
np.testing.assert_allclose(output, toutput.numpy(), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(h_n, th.numpy(), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(c_n, tc.numpy(), rtol=1e-5, atol=1e-6)
assert np.array_equal(out_lengths, tlengths.numpy())
# Padding positions of the output are zeros, as torch's.
assert not output[1, 2:].any()
print("example 3: seqpack == torch")
