"""What int8 costs on the main job's model: test accuracy and logit error of
seqpack's int8 (`seqpack predict --precision int8`) and of PyTorch's
`quantize_dynamic` on the same model, against the fp32 model in PyTorch.

    seqpack train --out model && seqpack data export --out data
    /usr/bin/python3 bench/int8_accuracy.py --model model --test data/test.tsv --seqpack build/seqpack

The model loads into the torch twin of seqpack's classifier
(tests/torch_char_classifier.py) under torch's state_dict names;
`torch.ao.quantization.quantize_dynamic(model, {nn.LSTM}, dtype=torch.qint8)`
quantizes its LSTM (per-tensor int8 weights, activations quantized per tensor
at run time), the Linear layer staying fp32 as in seqpack. seqpack's logits
come from `seqpack predict --json --stream` (one word per forward) at fp32 and
int8. Errors are |logit - torch fp32 logit| over every word and label.
"""
import argparse
import json
import os
import subprocess
import sys

import torch
from torch.nn.utils.rnn import pack_sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from check_model_in_torch import load_safetensors  # noqa: E402
from torch_char_classifier import CharClassifier  # noqa: E402


def read_split(path, model_labels):
    """(words, label indices into model_labels); the TSV's label is a name or
    an index into labels.txt beside it (what `seqpack data export` writes)."""
    names = None
    labels_txt = os.path.join(os.path.dirname(path), "labels.txt")
    if os.path.exists(labels_txt):
        with open(labels_txt, encoding="utf-8") as f:
            names = [line.rstrip("\n") for line in f if line.strip()]
    words, labels = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n").rstrip("\r")
            if not line:
                continue
            label, word = line.split("\t", 1)
            if label not in model_labels:
                label = names[int(label)] if names else model_labels[int(label)]
            words.append(word)
            labels.append(model_labels.index(label))
    return words, labels


def torch_logits(model, ids, batch=64):
    out = []
    with torch.no_grad():
        for s in range(0, len(ids), batch):
            seqs = [torch.tensor(i if i else [0], dtype=torch.int64) for i in ids[s:s + batch]]
            out.append(model(pack_sequence(seqs, enforce_sorted=False)))
    return torch.cat(out)


def seqpack_logits(binary, model_dir, words, precision):
    r = subprocess.run([binary, "predict", "--model", model_dir, "--json", "--stream",
                        "--precision", precision], input="\n".join(words) + "\n",
                       capture_output=True, text=True, check=True)
    rows = [json.loads(line)["predictions"][0]["logits"] for line in r.stdout.splitlines()]
    return torch.tensor(rows, dtype=torch.float32)


def summary(name, logits, reference, labels):
    acc = 100.0 * float((logits.argmax(1) == torch.tensor(labels)).double().mean())
    err = (logits.double() - reference.double()).abs()
    return {"what": name, "accuracy": round(acc, 3), "max_logit_error": float(err.max()),
            "mean_logit_error": float(err.mean())}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model directory of seqpack train")
    ap.add_argument("--test", required=True, help="test.tsv of seqpack data export")
    ap.add_argument("--seqpack", help="the seqpack binary (omit: PyTorch only)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with open(os.path.join(args.model, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(os.path.join(args.model, "vocabulary.json"), encoding="utf-8") as f:
        vocab = {c: i + 2 for i, c in enumerate(json.load(f)["tokens"])}
    model = CharClassifier(config["vocab_size"], config["embed_dim"], config["hidden_size"],
                           config["num_classes"])
    model.load_state_dict(load_safetensors(os.path.join(args.model, "model.safetensors")))
    model.eval()
    words, labels = read_split(args.test, config["labels"])
    ids = [[vocab.get(c, 1) for c in w] for w in words]
    if any(not i for i in ids):
        sys.exit("int8_accuracy: an empty word in the test split (torch cannot pack it)")
    reference = torch_logits(model, ids)
    q = torch.ao.quantization.quantize_dynamic(model, {torch.nn.LSTM}, dtype=torch.qint8)
    rows = [summary(f"torch {torch.__version__} fp32", reference, reference, labels),
            summary(f"torch {torch.__version__} quantize_dynamic int8 "
                    f"(engine {torch.backends.quantized.engine})",
                    torch_logits(q, ids), reference, labels)]
    if args.seqpack:
        for p in ("fp32", "int8"):
            rows.append(summary(f"seqpack {p}", seqpack_logits(args.seqpack, args.model, words, p),
                                reference, labels))
    print(f"# {len(words)} words, model {args.model} (hidden {config['hidden_size']}, "
          f"embed {config['embed_dim']}); errors against torch fp32's logits")
    print(f"{'':58} {'accuracy':>9} {'max |dlogit|':>13} {'mean |dlogit|':>14}")
    for r in rows:
        print(f"{r['what']:58} {r['accuracy']:8.2f}% {r['max_logit_error']:13.4g} "
              f"{r['mean_logit_error']:14.4g}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
