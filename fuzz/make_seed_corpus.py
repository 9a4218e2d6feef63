#!/usr/bin/env python3
"""Writes the seed corpus under fuzz/corpus/<target>/ (committed; rerun to
regenerate). Seeds are small valid inputs plus a few near-misses, so libFuzzer
starts from the interesting parts of each format instead of random bytes.

Usage: python3 fuzz/make_seed_corpus.py
"""
import json
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, raw bytes), in buffer order."""
    header, offset, buf = {}, 0, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        buf += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + buf


# Arrays nested 1500 levels: deeper than any reader takes (64), within
# fuzz.sh's -max_len of 4096 bytes.
DEEP = "[" * 1500 + "]" * 1500


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def f64(*v):
    return struct.pack("<%dd" % len(v), *v)


def i64(*v):
    return struct.pack("<%dq" % len(v), *v)


def safetensors_seeds():
    w = lambda n, d: write("safetensors", n, d)
    w("one_f32", safetensors([("w", "F32", [2, 3], f32(1, 2, 3, 4, 5, 6))]))
    w("three_dtypes", safetensors([
        ("a.weight", "F32", [2], f32(0.5, -1)),
        ("b.bias", "F64", [1, 1], f64(3.25)),
        ("c.index", "I64", [3], i64(0, -1, 2**40)),
    ], {"format": "pt"}))
    w("empty_tensor", safetensors([("e", "F32", [0, 4], b""), ("s", "F64", [], f64(1.0))]))
    w("metadata_only", safetensors([], {"k": "v", "format": "pt"}))
    w("no_padding", safetensors([("x", "I64", [1], i64(7))], pad=False))
    w("lstm_like", safetensors([
        ("weight_ih_l0", "F32", [8, 2], f32(*[i / 8 for i in range(16)])),
        ("weight_hh_l0", "F32", [8, 2], f32(*[-i / 8 for i in range(16)])),
        ("bias_ih_l0", "F32", [8], f32(*range(8))),
        ("bias_hh_l0", "F32", [8], f32(*range(8))),
    ]))
    # Near-misses: each must be rejected with a SafetensorsError.
    good = safetensors([("w", "F32", [2], f32(1, 2))])
    w("truncated", good[:-3])
    w("header_too_long", struct.pack("<Q", 1 << 20) + good[8:])
    w("f16", safetensors([("h", "F16", [2], b"\0\0\0\0")]))
    w("gap", safetensors([("w", "F32", [1], f32(1))]) + b"\0\0\0\0")
    w("short_file", b"\x05\0\0")
    # Nested 1500 levels where a dtype belongs (refused before parsing: json_limits.h).
    deep = ('{"w":{"dtype":' + DEEP + ',"shape":[1],"data_offsets":[0,4]}}').encode()
    w("deep_header", struct.pack("<Q", len(deep)) + deep + f32(1))


def tsv_vocabulary_seeds():
    w = lambda n, d: write("tsv_vocabulary", n, d)
    w("tsv_basic", "english\tcat\nfrench\tété\ngerman\tstraße\n".encode())
    w("tsv_crlf_blank", "a\tx\r\n\r\n\nb\tyz\r\n".encode())
    w("tsv_tab_in_text", "label\ttext\twith\ttabs\n".encode())
    w("tsv_emoji", "emoji\t\U0001F600\u2019s\n".encode())
    w("tsv_no_tab", b"english cat\n")
    w("tsv_bad_utf8", b"x\t\xc3\x28\n")
    vocab = {"format": "seqpack-vocabulary", "version": 1,
             "special_tokens": ["<pad>", "<unk>"], "tokens": ["a", "b", "é", "\U0001F600"]}
    w("vocab_valid", (json.dumps(vocab, ensure_ascii=False) + "\n").encode())
    w("vocab_escaped", json.dumps(vocab).encode())
    dup = dict(vocab, tokens=["a", "a"])
    w("vocab_duplicate", json.dumps(dup).encode())
    two = dict(vocab, tokens=["ab"])
    w("vocab_two_chars", json.dumps(two).encode())


def model_files_seeds():
    """The first byte picks the file (fuzz/fuzz_checks.h, check_model_files): 0 config.json,
    1 vocabulary.json, 2 edits of a valid training checkpoint ('key=value' sets a metadata
    field, '@nan:T' and friends corrupt tensor T; one edit per line)."""
    w = lambda n, mode, text: write("model_files", n, bytes([mode]) + text.encode())
    config = {"format": "seqpack-char-classifier", "version": 1, "vocab_size": 19, "embed_dim": 6,
              "hidden_size": 5, "num_classes": 3, "labels": ["english", "french", "german"]}
    w("config_valid", 0, json.dumps(config, indent=2))
    w("config_limits", 0, json.dumps(dict(config, vocab_size=1112066, embed_dim=16384,
                                          hidden_size=16384)))
    for name, key, value in [("config_fraction", "hidden_size", 16.5),
                             ("config_exponent", "hidden_size", 1e23),
                             ("config_huge", "hidden_size", 1152921504606846976),
                             ("config_negative", "embed_dim", -1),
                             ("config_version_2", "version", 2),
                             ("config_format", "format", "pt"),
                             ("config_duplicate_labels", "labels", ["a", "b", "a"]),
                             ("config_empty_label", "labels", ["a", "", "c"])]:
        w(name, 0, json.dumps(dict(config, **{key: value})))
    vocab = {"format": "seqpack-vocabulary", "version": 1,
             "special_tokens": ["<pad>", "<unk>"], "tokens": ["a", "b", "\u00e9", "\U0001F600"]}
    w("vocab_valid", 1, json.dumps(vocab, ensure_ascii=False))
    w("vocab_version_float", 1, json.dumps(dict(vocab, version=1.0)))
    w("vocab_duplicate", 1, json.dumps(dict(vocab, tokens=["a", "a"])))
    w("config_deep", 0, json.dumps(dict(config, hidden_size="@DEEP@")).replace('"@DEEP@"', DEEP))
    w("vocab_deep", 1, json.dumps(dict(vocab, version="@DEEP@")).replace('"@DEEP@"', DEEP))
    w("ckpt_train_config_deep", 2, "train_config=" + DEEP)
    model_config = {"vocab_size": 5, "embed_dim": 2, "hidden_size": 2, "num_classes": 2,
                    "dtype": "F32"}
    w("ckpt_unchanged", 2, "")
    w("ckpt_model_config", 2, "model_config=" + json.dumps(model_config))
    w("ckpt_dtype_int8", 2, "model_config=" + json.dumps(dict(model_config, dtype="int8")))
    w("ckpt_hidden_fraction", 2, "model_config=" + json.dumps(dict(model_config, hidden_size=2.5)))
    w("ckpt_counts", 2, "epoch=12abc\nadam_step=99999999999999999999")
    w("ckpt_labels", 2, 'labels=["x","x"]')
    w("ckpt_vocabulary", 2, "vocabulary=" + json.dumps(dict(vocab, tokens=["a", "b", "\u00e9"])))
    w("ckpt_train_config", 2, "train_config=[1]\nformat=seqpack-train-checkpoint\nversion=1")
    w("ckpt_missing_field", 2, "labels")
    w("ckpt_tensors", 2, "@nan:model.fc.weight\n@neg:adam.exp_avg_sq.fc.bias\n@grow:model.fc.bias\n"
      "@f64:adam.exp_avg.fc.bias\n@drop:model.lstm.bias_hh_l0\n@add:model.extra")


def packing_seeds():
    rng = random.Random(20240229)
    for i in range(24):
        n = rng.choice([8, 16, 24, 40, 64])
        write("packing", "random_%02d" % i, bytes(rng.randrange(256) for _ in range(n)))
    # dtype f32, time-major, sorted, B=3, T=4, one trailing dim of 2, lengths 4 3 0.
    write("packing", "demo_like", bytes([0, 0, 1, 3, 4, 1, 2, 0, 4, 3, 0, 0, 3, 1, 0]))


if __name__ == "__main__":
    safetensors_seeds()
    tsv_vocabulary_seeds()
    packing_seeds()
    model_files_seeds()
