// libseqpack_torch, seqpack's PyTorch operators for LibTorch programs
// (find_package(seqpack CONFIG COMPONENTS torch), target seqpack::torch).
//
// Linking seqpack::torch is enough: the library registers its operators
// (seqpack::rnn, seqpack::rnn_padded, seqpack::pack_padded_sequence,
// seqpack::pad_packed_sequence) with the dispatcher when it is loaded, so
// torch::jit::load finds them in a TorchScript model scripted from
// seqpack.torch, and c10::Dispatcher finds them by name. The target makes the
// linker keep the library even under --as-needed (it links it inside
// --no-as-needed), so this header is optional: include it to call the
// function below, e.g. to print the version of the operators a program runs.
#pragma once

extern "C" {
// The version of seqpack the operator library was built from ("0.1.0").
const char* seqpack_torch_version(void);
}
