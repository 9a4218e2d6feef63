#!/usr/bin/env python3
"""Example 5: Embedding(padding_idx=0) + GRU over a padded batch that is
sorted by length, packed (enforce_sorted=True), run, unpacked and restored to
the original order, in seqpack and in torch, with the same weights."""
import numpy as np
import torch
from torch.nn.utils import rnn as trnn

import seqpack

# Padded with 0 (the padding index); the rows are not sorted by length.
batch = np.array([[3, 1, 0, 0],
                  [4, 2, 5, 7],
                  [6, 0, 0, 0],
                  [2, 2, 3, 0]])
lengths = (batch != 0).sum(axis=1)

torch.manual_seed(2)
embedding = torch.nn.Embedding(8, 4, padding_idx=0)
tgru = torch.nn.GRU(4, 6, batch_first=True)
table = embedding.weight.detach().numpy()
assert not table[0].any()  # padding_idx row is zeros
gru = seqpack.nn.GRU(4, 6, batch_first=True)
gru.load_state_dict({k: v.numpy() for k, v in tgru.state_dict().items()})

# seqpack: sort by decreasing length (stable), pack, run, unpack, restore.
order = np.argsort(-lengths, kind="stable")
restore = seqpack.invert_permutation(order)
packed = seqpack.pack_padded_sequence(table[batch[order]], lengths[order], batch_first=True)
out, h_n = gru(packed)
output, out_lengths = seqpack.pad_packed_sequence(out, batch_first=True)
output, out_lengths, h_n = output[restore], out_lengths[restore], h_n[:, restore]
print("output in the original order:\n", output, "\nlengths:", out_lengths)

# torch, the same steps.
with torch.no_grad():
    tb = torch.from_numpy(batch)
    tlengths = torch.from_numpy(lengths)
    sorted_lengths, torder = tlengths.sort(descending=True, stable=True)
    tpacked = trnn.pack_padded_sequence(embedding(tb[torder]), sorted_lengths, batch_first=True)
    tout, th = tgru(tpacked)
    toutput, _ = trnn.pad_packed_sequence(tout, batch_first=True)
    trestore = torder.argsort()
    toutput, th = toutput[trestore], th[:, trestore]
assert np.array_equal(order, torder.numpy())
np.testing.assert_allclose(output, toutput.numpy(), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(h_n, th.numpy(), rtol=1e-5, atol=1e-6)
assert np.array_equal(out_lengths, lengths)
print("example 5: seqpack == torch")
