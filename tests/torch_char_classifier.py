"""The torch twin of seqpack's CharClassifier (Embedding -> packed BiLSTM ->
both final states -> Linear), with the same state_dict names. Shared by
tests/check_model_in_torch.py, tests/fixtures/gen_model.py and
bench/train_torch.py."""
import torch
from torch.nn.utils.rnn import PackedSequence


class CharClassifier(torch.nn.Module):
    def __init__(self, vocab, embed, hidden, classes):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, embed, padding_idx=0)
        self.lstm = torch.nn.LSTM(embed, hidden, bidirectional=True)
        self.fc = torch.nn.Linear(2 * hidden, classes)

    def forward(self, packed_ids):
        x = PackedSequence(self.embedding(packed_ids.data), packed_ids.batch_sizes,
                           packed_ids.sorted_indices, packed_ids.unsorted_indices)
        _, (h_n, _) = self.lstm(x)
        return self.fc(torch.cat([h_n[0], h_n[1]], dim=1))
