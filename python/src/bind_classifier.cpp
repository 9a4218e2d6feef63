// A model directory written by `seqpack train`, read by the C++ loader (every
// check of load_classifier: files, JSON schemas, sizes, tensor shapes, a save
// swapping the directory meanwhile) and handed to seqpack.torch.load_classifier
// as plain Python values.
#include <pybind11/stl.h>

#include <string>

#include "bind.h"
#include "seqpack/classifier.h"
#include "seqpack/vocabulary.h"
#include "tensor_caster.h"

namespace seqpack::python {

namespace py = pybind11;

void bind_classifier(py::module_& m) {
  m.def(
      "_load_classifier",
      [](const std::string& dir) {
        TrainedClassifier tc;
        {
          py::gil_scoped_release unlocked;
          tc = load_classifier(dir);
        }
        const CharClassifierOptions& o = tc.model->options();
        py::dict config;
        config["vocab_size"] = o.vocab_size;
        config["embed_dim"] = o.embed_dim;
        config["hidden_size"] = o.hidden_size;
        config["num_classes"] = o.num_classes;
        py::list tokens;
        for (const char32_t c : tc.vocabulary.code_points()) {
          tokens.append(encode_utf8(std::u32string(1, c)));
        }
        py::dict state;
        // Copies: the arrays outlive the model that owns the storage.
        for (const auto& [name, tensor] : tc.model->state_dict()) {
          state[py::str(name)] = array_from_tensor(tensor).attr("copy")();
        }
        py::dict out;
        out["config"] = config;
        out["labels"] = tc.labels;
        out["tokens"] = tokens;
        out["state"] = state;
        return out;
      },
      py::arg("dir"),
      "Reads a model directory written by `seqpack train`: config, labels, vocabulary tokens "
      "(id = index + 2) and the state dict under torch's names.");
}

}  // namespace seqpack::python
