#!/usr/bin/env python3
"""Example 4: the word batch 'on your mark' / 'get set' / 'go', padded with
padding_value 42 (a batch-first id matrix), packed and restored."""
import numpy as np
import torch
from torch.nn.utils import rnn as trnn

import seqpack

sentences = ["on your mark", "get set", "go"]
vocab = {w: i for i, w in enumerate(sorted({w for s in sentences for w in s.split()}))}
words = {i: w for w, i in vocab.items()}
ids = [np.array([vocab[w] for w in s.split()]) for s in sentences]
print("vocab:", vocab)

padded = seqpack.pad_sequence(ids, batch_first=True, padding_value=42)
print("padded ids:\n", padded)
tpadded = trnn.pad_sequence([torch.from_numpy(s) for s in ids], batch_first=True,
                            padding_value=42)
assert np.array_equal(padded, tpadded.numpy())
assert padded.dtype == np.int64 and padded[2, 1] == 42 and padded[2, 2] == 42

lengths = [len(s) for s in ids]
packed = seqpack.pack_padded_sequence(padded, lengths, batch_first=True)
tpacked = trnn.pack_padded_sequence(tpadded, torch.tensor(lengths), batch_first=True)
print(packed)
print("packed words:", [words[i] for i in packed.data])
assert np.array_equal(packed.data, tpacked.data.numpy())
assert np.array_equal(packed.batch_sizes, tpacked.batch_sizes.numpy())
assert [words[i] for i in packed.data] == ["on", "get", "go", "your", "set", "mark"]

restored = seqpack.unpack_sequence(packed)
assert [" ".join(words[i] for i in s) for s in restored] == sentences
back, back_lengths = seqpack.pad_packed_sequence(packed, batch_first=True, padding_value=42)
assert np.array_equal(back, padded)
print("example 4: seqpack == torch")
