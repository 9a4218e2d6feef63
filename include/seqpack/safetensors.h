// The safetensors file format (https://github.com/huggingface/safetensors), so
// models move between seqpack and PyTorch under PyTorch's state_dict names.
//
//   std::map<std::string, Tensor> params = {{"embedding.weight", emb}, {"fc.bias", b}};
//   save_safetensors("model/model.safetensors", params, {{"format", "pt"}});
//   std::map<std::string, std::string> meta;
//   auto loaded = load_safetensors("model/model.safetensors", &meta);
//
// Layout: 8-byte little-endian header length N, then N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the data buffer; offsets are relative to the buffer's start. seqpack writes
// tensors in sorted key order, contiguous, and pads the header with spaces to a
// multiple of 8 bytes (as the reference implementation does) so the data is aligned.
// dtypes: "F32", "F64", "I64" (the three seqpack has). Other dtypes ("F16",
// "BF16", ...) are rejected by name rather than silently converted.
//
// Loading validates everything before touching the data: a corrupt, truncated
// or hostile file gives a SafetensorsError naming the file and the offending
// value, never a crash or an out-of-range read.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "seqpack/tensor.h"

namespace seqpack {

// Thrown for any malformed safetensors input; derives from std::invalid_argument.
class SafetensorsError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Writes `tensors` (any seqpack dtype, any shape including empty ones) and the
// optional string metadata to `path` atomically: the bytes go to a temporary
// file in the same directory, which is fsync'ed and then renamed over `path`, so
// a crash leaves either the old file or the new one, never half of one.
// Throws std::invalid_argument for an undefined tensor or an empty key, and
// std::runtime_error when the file cannot be written (naming the path and errno text).
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of a safetensors file. `metadata`, when given, receives the
// "__metadata__" entries (cleared first). Throws SafetensorsError for a malformed
// file and std::invalid_argument when it cannot be opened (naming the path).
std::map<std::string, Tensor> load_safetensors(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// The same, in memory: the complete file contents as bytes.
std::string serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});
// `source` names the bytes in error messages (a path, or "<memory>").
std::map<std::string, Tensor> parse_safetensors(
    std::string_view bytes, std::map<std::string, std::string>* metadata = nullptr,
    const std::string& source = "<memory>");

// Writes `bytes` to `path` atomically (temporary file in the same directory,
// fsync, rename, fsync of the directory). Used for every file seqpack writes:
// safetensors, the vocabulary and configuration files saved next to a model,
// checkpoints, ONNX models and exported data. `path` must be absent or a regular
// file (check_output_file), checked before the temporary file is written and
// again just before the rename.
void write_file_atomically(const std::string& path, std::string_view bytes);

// Several files that belong together (an exported data split): each is written
// in full to its temporary file and fsync'ed before the first is renamed into
// place, so a full disk or an I/O error while writing replaces none of them and
// says so. A rename that fails (rare: same directory) names the files already
// replaced. Every path is checked as above before anything is written.
void write_files_atomically(const std::vector<std::pair<std::string, std::string_view>>& files);

// The rule for output paths: absent, or a regular file. Throws
// std::invalid_argument naming the path and what it is for a directory, a device
// node, a FIFO or a socket (a rename would replace it), and for a symbolic link,
// dangling or not (a rename would replace the link, not its target).
void check_output_file(const std::string& path);

// A file or directory a command reads, for check_output_not_input:
// {"--model directory", "/tmp/m"}.
struct InputPath {
  std::string what;
  std::string path;
};

// The rule that nothing seqpack writes lands on one of its own inputs. Throws
// std::invalid_argument naming both paths when `output` (`output_what`:
// "--onnx file", "--out directory") is, or resolves to (symbolic links, hard
// links, ".."), one of `inputs`, lies inside one that is a directory (at any
// depth, or is a hard link to a file directly in it), or is a directory that
// holds one. Compared by device and inode where the paths exist, by the
// canonical path of the output's parent where it does not yet; an input that
// does not exist is skipped.
void check_output_not_input(const std::string& output, const std::string& output_what,
                            const std::vector<InputPath>& inputs);
// The same for an open descriptor, such as standard output redirected to a
// file (`seqpack predict --eval FILE >> FILE`): `name` names it ("standard
// output"). Only being one of the inputs counts (the same device and inode: a
// hard link to one too): name the files read, not their directory, since a
// new file in a directory read is no input.
void check_descriptor_not_input(int fd, const std::string& name,
                                const std::vector<InputPath>& inputs);

}  // namespace seqpack
