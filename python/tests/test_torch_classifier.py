"""seqpack.torch.load_classifier: a model trained by the CLI, as a torch module.

Expected values come from `seqpack predict --json` on the same directory (the
issue's criterion) and from the same architecture built from torch.nn and
loaded with the module's state_dict (an independent implementation)."""
import json
import os
import subprocess

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence

import seqpack.torch as spt
from tolerance import assert_fp_close, module_reduction_length

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("SEQPACK_CLI") or os.path.join(
    ROOT, os.environ.get("SEQPACK_BUILD_DIR", "build"), "seqpack")
WORDS = ["the", "house", "maison", "haus", "ça", "été", "straße", "zzq", "x", "a", "日本"]
needs_cli = pytest.mark.skipif(not os.access(CLI, os.X_OK),
                               reason=f"no seqpack CLI at {CLI} (a wheel without the tool)")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    work = tmp_path_factory.mktemp("classifier")
    tsv = work / "tiny.tsv"
    words = {"en": ["the", "house", "water", "night", "light", "which", "there", "would"],
             "fr": ["maison", "eau", "nuit", "été", "château", "être", "très", "quelle"],
             "de": ["haus", "wasser", "nacht", "straße", "größe", "über", "schön", "welche"]}
    tsv.write_text("".join(f"{label}\t{w}\n" for label, ws in words.items() for w in ws),
                   encoding="utf-8")
    out = work / "model"
    subprocess.run([CLI, "train", "--data", str(tsv), "--epochs", "2", "--hidden", "7",
                    "--embed", "5", "--batch-size", "8", "--seed", "3", "--quiet",
                    "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


def cli_predict(model_dir, words):
    r = subprocess.run([CLI, "predict", "--model", str(model_dir), "--json", "--top", "3", *words],
                       check=True, capture_output=True, text=True)
    return json.loads(r.stdout)


@needs_cli
def test_same_logits_ids_and_labels_as_seqpack_predict(model_dir):
    model = spt.load_classifier(model_dir)
    got = cli_predict(model_dir, WORDS)
    assert model.labels == got["labels"] and sorted(model.labels) == ["de", "en", "fr"]
    logits = model.logits(WORDS)
    assert logits.shape == (len(WORDS), 3)
    for i, p in enumerate(got["predictions"]):
        assert model.encode(WORDS[i]) == p["ids"], WORDS[i]
        expected = torch.tensor(p["logits"], dtype=torch.float64)
        assert float((logits[i].double() - expected).abs().max()) <= 1e-5, WORDS[i]


@needs_cli
def test_predict_gives_the_top_labels_of_the_logits(model_dir):
    model = spt.load_classifier(model_dir)
    got = cli_predict(model_dir, WORDS)
    for word, p, top in zip(WORDS, got["predictions"], model.predict(WORDS, top=2)):
        probs = torch.softmax(torch.tensor(p["logits"], dtype=torch.float64), 0)
        best = sorted(range(3), key=lambda k: -float(probs[k]))[:2]
        assert [label for label, _ in top] == [got["labels"][k] for k in best], word
        assert [prob for _, prob in top] == pytest.approx([float(probs[k]) for k in best],
                                                          abs=1e-6)


@needs_cli
def test_matches_the_same_model_built_from_torch_nn(model_dir):
    model = spt.load_classifier(model_dir)
    assert isinstance(model.lstm, spt.LSTM)
    emb = torch.nn.Embedding(model.embedding.num_embeddings, model.embedding.embedding_dim,
                             padding_idx=0)
    lstm = torch.nn.LSTM(model.lstm.input_size, model.lstm.hidden_size, bidirectional=True)
    fc = torch.nn.Linear(model.fc.in_features, model.fc.out_features)
    state = model.state_dict()
    assert sorted(state) == sorted(
        ["embedding.weight", "fc.weight", "fc.bias"] +
        [f"lstm.{k}_l0{s}" for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
         for s in ("", "_reverse")])
    emb.load_state_dict({"weight": state["embedding.weight"]})
    lstm.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("lstm.")})
    fc.load_state_dict({"weight": state["fc.weight"], "bias": state["fc.bias"]})
    ids = [torch.tensor(model.encode(w)) for w in WORDS]
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
        packed = pack_sequence(ids, enforce_sorted=False)
        x = torch.nn.utils.rnn.PackedSequence(emb(packed.data), packed.batch_sizes,
                                              packed.sorted_indices, packed.unsorted_indices)
        _, (h_n, _) = lstm(x)
        expected = fc(torch.cat([h_n[0], h_n[1]], 1))
    # The LSTM over the longest word, then the output layer's sum over 2H.
    n = module_reduction_length(lstm, [max(len(i) for i in ids)]) + 2 * lstm.hidden_size
    assert_fp_close(model.logits(WORDS), expected, n, what="logits vs torch.nn")


@needs_cli
def test_an_empty_word_is_a_zero_length_sequence(model_dir):
    model = spt.load_classifier(model_dir)
    got = cli_predict(model_dir, ["", "the"])
    logits = model.logits(["", "the"])
    # Hand-worked: the LSTM stays at zero, so the logits are fc's bias.
    torch.testing.assert_close(logits[0], model.fc.bias.detach(), rtol=0, atol=0)
    for i in range(2):
        expected = torch.tensor(got["predictions"][i]["logits"], dtype=torch.float64)
        assert float((logits[i].double() - expected).abs().max()) <= 1e-5


@needs_cli
def test_it_trains_like_any_module(model_dir):
    model = spt.load_classifier(model_dir)
    assert not model.training
    model.train()
    ids = [torch.tensor(model.encode(w)) for w in ["the", "maison"]]
    loss = torch.nn.functional.cross_entropy(model(pack_sequence(ids, enforce_sorted=False)),
                                             torch.tensor([0, 1]))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.logits(["the"])
    assert model.training  # logits() restores the mode it found


def test_bad_directories_and_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="model directory '.*nothing' does not exist"):
        spt.load_classifier(tmp_path / "nothing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not a model directory: it is a regular file"):
        spt.load_classifier(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        spt.load_classifier(tmp_path / "empty")
    with pytest.raises(TypeError, match="model_dir must be a path, got int 3"):
        spt.load_classifier(3)


@needs_cli
def test_bad_words_are_named(model_dir):
    model = spt.load_classifier(model_dir)
    with pytest.raises(TypeError, match="got the str 'house'"):
        model.logits("house")
    with pytest.raises(TypeError, match="a word must be a str, got int 5"):
        model.logits(["a", 5])
    with pytest.raises(ValueError, match="top must be an int >= 1, got 0"):
        model.predict(["a"], top=0)


@needs_cli
def test_non_finite_logits_are_an_error_not_a_probability(model_dir):
    # Finite weights whose products overflow float32: the logits are ±inf or
    # NaN, and predict names the word and the label instead of serving NaN.
    model = spt.load_classifier(model_dir)
    with torch.no_grad():
        model.fc.weight.fill_(3.4e38)
        model.fc.bias.fill_(3.4e38)
    assert not torch.isfinite(model.logits(["hello"])).all()
    with pytest.raises(ValueError, match=r"word 0 \('hello'\): logit \d \(label '[^']+'\) is"):
        model.predict(["hello"])


@needs_cli
@pytest.mark.parametrize("name", ["config.json", "vocabulary.json"])
def test_deeply_nested_json_is_refused_not_a_crash(model_dir, tmp_path, name):
    # A value nested 100,000 levels deep where a number or string belongs
    # killed the interpreter (the message dumped it recursively). Run in a
    # child, so a crash fails this test rather than ending the suite.
    import shutil
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    doc = json.loads((copy / name).read_text(encoding="utf-8"))
    key = next(iter(doc))
    text = json.dumps({**doc, key: "@DEEP@"}).replace('"@DEEP@"', "[" * 100000 + "]" * 100000)
    (copy / name).write_text(text, encoding="utf-8")
    code = ("import sys, seqpack.torch as spt\n"
            "try:\n"
            "    spt.load_classifier(sys.argv[1])\n"
            "except ValueError as e:\n"
            "    print('refused:', e)\n")
    r = subprocess.run([os.sys.executable, "-c", code, str(copy)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused:" in r.stdout and "JSON nested deeper than 64 levels" in r.stdout, r.stdout
