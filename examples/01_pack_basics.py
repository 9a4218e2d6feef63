#!/usr/bin/env python3
"""Example 1: padding and packing the batch [1,2,3], [4,5], [6,7,8,9].

Shows what pack_sequence does (time-major rows of the sequences sorted by
length, batch_sizes[t] = sequences longer than t) and checks every result
against torch.nn.utils.rnn. Run with /usr/bin/python3.
"""
import numpy as np
import torch
from torch.nn.utils import rnn as trnn

import seqpack

seqs = [np.array([1., 2, 3]), np.array([4., 5]), np.array([6., 7, 8, 9])]
tseqs = [torch.from_numpy(s) for s in seqs]

padded = seqpack.pad_sequence(seqs, batch_first=True)
print("padded (batch_first):\n", padded)
assert np.array_equal(padded, trnn.pad_sequence(tseqs, batch_first=True).numpy())

packed = seqpack.pack_sequence(seqs, enforce_sorted=False)
print(packed)
tpacked = trnn.pack_sequence(tseqs, enforce_sorted=False)
assert np.array_equal(packed.data, [6, 1, 4, 7, 2, 5, 8, 3, 9])
assert np.array_equal(packed.batch_sizes, [3, 3, 2, 1])
assert np.array_equal(packed.sorted_indices, [2, 0, 1])
assert np.array_equal(packed.unsorted_indices, [1, 2, 0])
for name in ("data", "batch_sizes", "sorted_indices", "unsorted_indices"):
    assert np.array_equal(getattr(packed, name), getattr(tpacked, name).numpy()), name

# Reading the packed data step by step: step t holds batch_sizes[t] rows.
start = 0
for t, n in enumerate(packed.batch_sizes):
    print(f"step {t}: {packed.data[start:start + n]}")
    start += n

unpacked, lengths = seqpack.pad_packed_sequence(packed, batch_first=True)
tunpacked, tlengths = trnn.pad_packed_sequence(tpacked, batch_first=True)
print("unpacked:\n", unpacked, "\nlengths:", lengths)
assert np.array_equal(unpacked, tunpacked.numpy()) and np.array_equal(lengths, tlengths.numpy())
assert np.array_equal(unpacked, padded)

steps_padded = padded.size
steps_packed = packed.data.shape[0]
print(f"computation: {steps_padded} padded steps vs {steps_packed} packed, "
      f"{100 * (1 - steps_packed / steps_padded):.0f}% saved")
print("example 1: seqpack == torch")
