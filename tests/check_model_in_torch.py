#!/usr/bin/env python3
"""Checks that a model saved by `seqpack train` loads into PyTorch under torch's
own state_dict names and gives the logits seqpack prints.

    /usr/bin/python3 tests/check_model_in_torch.py MODEL_DIR --seqpack build/seqpack
    /usr/bin/python3 tests/check_model_in_torch.py --seqpack build/seqpack --work /tmp/x

Without MODEL_DIR it first trains a tiny model with `seqpack train --data` on a
generated TSV into --work. Then it runs `seqpack predict --json` on a few words
(some with characters outside the vocabulary), loads model.safetensors into a
torch module with attributes embedding, lstm, fc (strict load_state_dict),
encodes the words with vocabulary.json and compares logits. Exit status 0 on a
match. Run with Debian's /usr/bin/python3.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import numpy as np
import torch
from torch.nn.utils.rnn import PackedSequence, pack_sequence

NP_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64}
WORDS = ["the", "house", "maison", "haus", "ça", "été", "straße", "zzq", "x", "a"]


from torch_char_classifier import CharClassifier

def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=np.dtype(NP_DTYPES[info["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out


def train_tiny(seqpack, work):
    os.makedirs(work, exist_ok=True)
    tsv = os.path.join(work, "tiny.tsv")
    words = {"en": ["the", "house", "water", "night", "light", "which", "there", "would",
                    "about", "think", "other", "these", "thing", "wrong"],
             "fr": ["maison", "eau", "nuit", "été", "château", "être", "très", "quelle",
                    "pensée", "chose", "année", "voilà", "déjà", "français"],
             "de": ["haus", "wasser", "nacht", "straße", "größe", "über", "schön", "welche",
                    "würde", "denken", "andere", "diese", "falsch", "mädchen"]}
    with open(tsv, "w", encoding="utf-8") as f:
        for label, ws in words.items():
            for w in ws:
                f.write(f"{label}\t{w}\n")
    model_dir = os.path.join(work, "model")
    subprocess.run([seqpack, "train", "--data", tsv, "--epochs", "2", "--hidden", "7",
                    "--embed", "5", "--batch-size", "8", "--seed", "3", "--quiet",
                    "--out", model_dir], check=True, stdout=subprocess.DEVNULL)
    return model_dir


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("--seqpack", required=True, help="the seqpack binary")
    ap.add_argument("--work", default="check_model_in_torch", help="where to train when no MODEL_DIR")
    args = ap.parse_args()
    model_dir = args.model_dir or train_tiny(args.seqpack, args.work)

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(os.path.join(model_dir, "vocabulary.json"), encoding="utf-8") as f:
        vocab_json = json.load(f)
    vocab = {c: i + 2 for i, c in enumerate(vocab_json["tokens"])}
    model = CharClassifier(config["vocab_size"], config["embed_dim"], config["hidden_size"],
                           config["num_classes"])
    state = load_safetensors(os.path.join(model_dir, "model.safetensors"))
    model.load_state_dict(state, strict=True)  # torch's names, or this raises
    model.eval()
    ids = [[vocab.get(c, 1) for c in w] for w in WORDS]
    with torch.no_grad():
        expected = model(pack_sequence([torch.tensor(i) for i in ids], enforce_sorted=False))

    out = subprocess.run([args.seqpack, "predict", "--model", model_dir, "--json", *WORDS],
                         check=True, capture_output=True, text=True)
    got = json.loads(out.stdout)
    failures = []
    if got["labels"] != config["labels"]:
        failures.append(f"labels {got['labels']} != config {config['labels']}")
    if float(model.embedding.weight[0].abs().sum()) != 0.0:
        failures.append("the <pad> row of embedding.weight is not zero")
    for i, p in enumerate(got["predictions"]):
        if p["ids"] != ids[i]:
            failures.append(f"{WORDS[i]!r}: seqpack ids {p['ids']} != torch-side ids {ids[i]}")
        diff = float((torch.tensor(p["logits"], dtype=torch.float64) - expected[i].double()).abs().max())
        if not diff <= 1e-4:
            failures.append(f"{WORDS[i]!r}: logits differ by {diff:.3g}: seqpack {p['logits']} "
                            f"torch {expected[i].tolist()}")
    if failures:
        print("check_model_in_torch: FAILED\n  " + "\n  ".join(failures))
        return 1
    print(f"check_model_in_torch: {len(WORDS)} words, seqpack's logits match torch "
          f"{torch.__version__} on {model_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
