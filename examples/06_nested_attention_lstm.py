#!/usr/bin/env python3
"""Example 6: self-attention and an LSTM on one jagged nested tensor (PyTorch 2.6+).

Episodes of 1 to 16 steps, each step an 8-feature observation, one nested
tensor per batch (torch.nested.nested_tensor(..., layout=torch.jagged)): no
padding, no lengths, no sorting. The model projects every step, runs
self-attention within each episode (scaled_dot_product_attention on the
nested tensor), then seqpack.torch.LSTM on the attention's nested output (a
residual sum: the LSTM's output keeps the input's offsets), and classifies
each episode from h_n: does the episode hold more "A" events (feature 0) than
"B" events (feature 1)? 200 training steps on batches of 16 generated episodes, a few
seconds on a CPU; then the LSTM's result on a nested batch is checked against
torch.nn.LSTM on the same batch packed.
"""
import sys

import torch
import torch.nn.functional as F

import seqpack.torch as st

NEEDS_TORCH = (2, 6)  # python/tests/test_examples.py skips the example on an older torch
if not hasattr(torch, "jagged") or \
        tuple(int(p) for p in torch.__version__.split(".")[:2]) < NEEDS_TORCH:
    sys.exit(f"this example needs PyTorch 2.6+ (jagged nested tensors); this is {torch.__version__}")

FEATURES, MODEL, HEADS = 8, 32, 4
STEPS, BATCH = 200, 16


def episodes(batch, g):
    """(nested observations (batch, ragged steps, FEATURES), labels (batch,))."""
    seqs, labels = [], []
    for _ in range(batch):
        n = int(torch.randint(1, 17, (1,), generator=g))
        x = torch.randn(n, FEATURES, generator=g) * 0.1
        events = torch.randint(0, 3, (n,), generator=g)  # 0: A, 1: B, 2: nothing
        x[events == 0, 0] = 1.0
        x[events == 1, 1] = 1.0
        seqs.append(x)
        labels.append(int((events == 0).sum() > (events == 1).sum()))
    return torch.nested.nested_tensor(seqs, layout=torch.jagged), torch.tensor(labels)


class EpisodeClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(FEATURES, MODEL)
        self.q = torch.nn.Linear(MODEL, MODEL)
        self.k = torch.nn.Linear(MODEL, MODEL)
        self.v = torch.nn.Linear(MODEL, MODEL)
        self.lstm = st.LSTM(MODEL, MODEL, batch_first=True)
        self.head = torch.nn.Linear(MODEL, 2)

    def forward(self, x):
        h = self.embed(x)  # nested (B, j, MODEL)
        # (B, j, HEADS, d) -> (B, HEADS, j, d): attention within each episode (on the
        # CPU torch's math kernel, which wants q, k, v contiguous before the transpose).
        q, k, v = (proj(h).unflatten(-1, (HEADS, MODEL // HEADS)).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2)
        out, (h_n, c_n) = self.lstm(h + a)  # nested in, nested out (same offsets)
        return self.head(h_n[-1])


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = EpisodeClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(STEPS):
        x, y = episodes(BATCH, g)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            print(f"step {step:3d}  loss {loss.item():.3f}")
    with torch.no_grad():
        x, y = episodes(512, g)
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    print(f"held-out accuracy {accuracy:.3f} (chance 0.5)")
    assert accuracy > 0.8, f"the model did not learn the episodes: accuracy {accuracy:.3f}"

    # The LSTM on a nested batch equals torch.nn.LSTM on the same batch packed.
    lstm = model.lstm
    twin = torch.nn.LSTM(MODEL, MODEL, batch_first=True)
    twin.load_state_dict(lstm.state_dict())
    x, _ = episodes(16, g)
    h = model.embed(x).detach()
    with torch.no_grad():
        out, (h_n, c_n) = lstm(h)
        ref, (ref_h, ref_c) = twin(torch.nn.utils.rnn.pack_sequence(list(h.unbind()),
                                                                    enforce_sorted=False))
    rows = torch.cat(torch.nn.utils.rnn.unpack_sequence(ref))
    diff = max((out.values() - rows).abs().max().item(), (h_n - ref_h).abs().max().item(),
               (c_n - ref_c).abs().max().item())
    print(f"nested LSTM vs torch.nn.LSTM packed: largest difference {diff:.2e}")
    assert diff < 1e-5, diff
    print("seqpack == torch")


if __name__ == "__main__":
    main()
