"""A model saved by `seqpack train`, as a torch module.

    import seqpack.torch as spt
    model = spt.load_classifier("seqpack-model")
    model.predict(["house", "maison"])      # [[("english", 0.97), ...], ...]
    model.logits(["house"])                 # tensor [1, num_classes], as `seqpack predict --json`

The module is the CLI's classifier: Embedding (padding_idx 0) -> bidirectional
seqpack.torch.LSTM over the packed characters -> both final hidden states ->
Linear. Its parameters carry torch's state_dict names (embedding.weight,
lstm.weight_ih_l0, ..., fc.bias), so `model.state_dict()` loads into the same
architecture built from torch.nn, and it trains, scripts and exports like any
module. The directory is read by the C++ loader that `seqpack predict` uses,
with the same checks and errors.
"""
from typing import List, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence, pack_sequence

from . import _seqpack, _torch_orig
from ._torch_layers import LSTM
from ._torch_ops import pack_padded_sequence

__all__ = ["CharClassifier", "load_classifier"]

PAD_ID = 0
UNK_ID = 1


class CharClassifier(torch.nn.Module):
    """Embedding -> packed bidirectional LSTM -> [h_n forward, h_n backward] -> Linear."""

    def __init__(self, vocab_size: int, embed_dim: int, hidden_size: int, num_classes: int,
                 labels: Sequence[str] = (), tokens: Sequence[str] = ()):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, embed_dim, padding_idx=PAD_ID)
        self.lstm = LSTM(embed_dim, hidden_size, bidirectional=True)
        self.fc = torch.nn.Linear(2 * hidden_size, num_classes)
        self.labels: List[str] = list(labels)
        self.tokens: List[str] = list(tokens)
        self._ids = {c: i + 2 for i, c in enumerate(self.tokens)}

    def forward(self, packed_ids: PackedSequence) -> Tensor:
        """Logits [batch, num_classes] of a PackedSequence of character ids."""
        x = PackedSequence(self.embedding(packed_ids.data), packed_ids.batch_sizes,
                           packed_ids.sorted_indices, packed_ids.unsorted_indices)
        _, (h_n, _) = self.lstm(x)
        return self.fc(torch.cat([h_n[0], h_n[1]], dim=1))

    def encode(self, word: str) -> List[int]:
        """Character ids of `word` (id = index in tokens + 2; unknown characters -> <unk> = 1)."""
        if not isinstance(word, str):
            raise TypeError(f"encode: a word must be a str, got {type(word).__name__} {word!r}")
        return [self._ids.get(c, UNK_ID) for c in word]

    def logits(self, words: Sequence[str]) -> Tensor:
        """Logits [len(words), num_classes], in eval mode without gradients, as
        `seqpack predict --json` prints them. An empty word is a zero-length
        sequence: the LSTM stays at its zero state."""
        if isinstance(words, str):
            raise TypeError(f"logits: words must be a sequence of str, got the str {words!r}")
        words = list(words)
        if not words:
            return torch.zeros(0, self.fc.out_features)
        ids = [torch.tensor(self.encode(w), dtype=torch.int64) for w in words]
        lengths = [len(i) for i in ids]
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                if min(lengths) > 0:
                    return self(pack_sequence(ids, enforce_sorted=False))
                # torch's packing refuses zero-length sequences; seqpack.torch's accepts them.
                padded = _torch_orig.pad_sequence(ids, padding_value=PAD_ID)
                return self(pack_padded_sequence(padded, torch.tensor(lengths),
                                                 enforce_sorted=False))
        finally:
            self.train(was_training)

    def predict(self, words: Sequence[str], top: int = 3) -> List[List[Tuple[str, float]]]:
        """The `top` labels of each word with their softmax probabilities, best first."""
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise ValueError(f"predict: top must be an int >= 1, got {top!r}")
        logits = self.logits(words)
        bad = (~torch.isfinite(logits)).nonzero()
        if len(bad):
            i, k = (int(v) for v in bad[0])
            word = words[i] if len(words[i]) <= 40 else words[i][:40] + "…"
            raise ValueError(
                f"predict: word {i} ({word!r}): logit {k} (label {self.labels[k]!r}) is "
                f"{float(logits[i, k])}: the model's weights overflow float32; no probability "
                f"is given for it")
        probs = torch.softmax(logits.double(), dim=1)
        out = []
        for row in probs:
            order = sorted(range(len(row)), key=lambda k: (-float(row[k]), k))[:top]
            out.append([(self.labels[k], float(row[k])) for k in order])
        return out


def load_classifier(model_dir: str) -> CharClassifier:
    """The model `seqpack train --out MODEL_DIR` saved, as a CharClassifier in eval mode.

    Raises ValueError naming the problem (a missing directory or file, a
    malformed config, a tensor of the wrong shape), as `seqpack predict` does.
    """
    import os
    if not isinstance(model_dir, (str, os.PathLike)):
        raise TypeError(f"load_classifier: model_dir must be a path, got "
                        f"{type(model_dir).__name__} {model_dir!r}")
    files = _seqpack._load_classifier(os.fspath(model_dir))
    c = files["config"]
    model = CharClassifier(c["vocab_size"], c["embed_dim"], c["hidden_size"], c["num_classes"],
                           files["labels"], files["tokens"])
    model.load_state_dict({k: torch.from_numpy(v) for k, v in files["state"].items()}, strict=True)
    model.eval()
    return model
