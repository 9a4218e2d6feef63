#include "seqpack/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "seqpack/json_limits.h"
#include "train/regular_file.h"

namespace seqpack {

// The data buffer is copied byte for byte into tensors, which is only right
// when the host's integers and floats are little-endian like the format.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

// The reference implementation refuses headers above 100 MB; so do we, so a
// hostile length cannot make us allocate or parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

const char* format_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::i64:
      return "I64";
  }
  throw std::invalid_argument("unknown dtype");
}

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw SafetensorsError("safetensors " + source + ": " + what);
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

std::string serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps insertion order: "__metadata__" first, then the tensors in
  // sorted key order (std::map order), byte-identical to tests/fixtures/gen_safetensors.py.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == kMetadataKey) {
      throw std::invalid_argument("save_safetensors: tensor name '__metadata__' is reserved");
    }
    if (!t.defined()) {
      throw std::invalid_argument("save_safetensors: tensor '" + name + "' is undefined");
    }
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = format_dtype(t.dtype());
    entry["shape"] = t.shape();
    entry["data_offsets"] = {offset, offset + t.nbytes()};
    offset += t.nbytes();
    header[name] = std::move(entry);
  }
  std::string json = header.dump();
  // Spaces up to a multiple of 8 keep the data buffer 8-byte aligned in the file,
  // as the reference implementation does.
  json.append((8 - json.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + json.size() + offset);
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += json;
  for (const auto& [name, t] : tensors) {
    out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  }
  return out;
}

std::map<std::string, Tensor> parse_safetensors(std::string_view bytes,
                                                std::map<std::string, std::string>* metadata,
                                                const std::string& source) {
  if (metadata) metadata->clear();
  if (bytes.size() < 8) {
    fail(source, "file is " + std::to_string(bytes.size()) +
                     " bytes, too short for the 8-byte header length");
  }
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) {
    header_len |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  if (header_len > kMaxHeaderBytes) {
    fail(source, "header length " + std::to_string(header_len) + " is larger than the limit " +
                     std::to_string(kMaxHeaderBytes));
  }
  if (header_len > bytes.size() - 8) {
    fail(source, "header length " + std::to_string(header_len) + " runs past the end of the " +
                     std::to_string(bytes.size()) + "-byte file");
  }
  const std::string_view header_text = bytes.substr(8, header_len);
  const std::string_view buffer = bytes.substr(8 + header_len);

  try {
    check_json_depth(header_text, "header");
  } catch (const std::invalid_argument& e) {
    fail(source, e.what());  // a SafetensorsError, as every refusal of the format
  }
  const nlohmann::json header = nlohmann::json::parse(header_text.begin(), header_text.end(),
                                                      nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) fail(source, "header is not valid JSON");
  if (!header.is_object()) {
    fail(source, "header is JSON " + std::string(header.type_name()) + ", expected an object");
  }

  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) fail(source, "__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) {
          fail(source, "__metadata__ value of '" + k + "' is " + json_excerpt(v) + ", expected a string");
        }
        if (metadata) (*metadata)[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!value.is_object()) fail(source, where + " is " + json_excerpt(value) + ", expected an object");
    Entry e{name, DType::f32, {}, 0, 0};

    const auto dt = value.find("dtype");
    if (dt == value.end() || !dt->is_string()) fail(source, where + " has no string dtype");
    const std::string dtype = dt->get<std::string>();
    if (dtype == "F32") {
      e.dtype = DType::f32;
    } else if (dtype == "F64") {
      e.dtype = DType::f64;
    } else if (dtype == "I64") {
      e.dtype = DType::i64;
    } else {
      fail(source,
           where + " has dtype '" + dtype + "', which seqpack does not support (F32, F64, I64)");
    }
    const uint64_t esize = dtype_size(e.dtype);

    const auto sh = value.find("shape");
    if (sh == value.end() || !sh->is_array()) fail(source, where + " has no shape array");
    for (const auto& d : *sh) {
      // nlohmann parses non-negative integers as unsigned: anything else (a
      // negative size, a float, a string) is invalid.
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        fail(source, where + " has shape " + json_excerpt(*sh) + " with invalid size " + json_excerpt(d));
      }
      e.shape.push_back(d.get<int64_t>());
    }
    // Overflow-checked product, so a hostile shape like [2^62, 2^62] cannot wrap
    // around to a small byte count; any zero size makes it empty.
    uint64_t numel = 1;
    bool overflow = false;
    for (int64_t d : e.shape)
      overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel);
    if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {
      numel = 0;
      overflow = false;
    }
    uint64_t nbytes = 0;
    overflow |= __builtin_mul_overflow(numel, esize, &nbytes);
    if (overflow) {
      fail(source, where + " has shape " + sh->dump() + " " + dtype +
                       ", whose byte size overflows 64 bits");
    }

    const auto off = value.find("data_offsets");
    if (off == value.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      fail(source, where + " has data_offsets " + (off == value.end() ? "missing" : off->dump()) +
                       ", expected [begin, end] with 0 <= begin <= end");
    }
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    if (e.begin > e.end || e.end > buffer.size()) {
      fail(source, where + " has data_offsets " + off->dump() + " outside the " +
                       std::to_string(buffer.size()) + "-byte data buffer");
    }
    if (e.end - e.begin != nbytes) {
      fail(source, where + " has data_offsets " + off->dump() + " spanning " +
                       std::to_string(e.end - e.begin) + " bytes but shape " + sh->dump() + " " +
                       dtype + " needs " + std::to_string(nbytes));
    }
    entries.push_back(std::move(e));
  }

  // The tensors must tile the buffer exactly, as the reference implementation
  // requires: overlaps would alias, gaps hide data nobody can name.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) by_offset.push_back(&e);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : by_offset) {
    if (e->begin < covered) {
      fail(source, "tensor '" + e->name + "' data_offsets [" + std::to_string(e->begin) + ", " +
                       std::to_string(e->end) + "] overlap tensor '" + prev->name + "' [" +
                       std::to_string(prev->begin) + ", " + std::to_string(prev->end) + "]");
    }
    if (e->begin > covered) {
      fail(source, "bytes [" + std::to_string(covered) + ", " + std::to_string(e->begin) +
                       ") of the data buffer belong to no tensor");
    }
    covered = e->end;
    if (e->end > e->begin || !prev) prev = e;
  }
  if (covered != buffer.size()) {
    fail(source, "bytes [" + std::to_string(covered) + ", " + std::to_string(buffer.size()) +
                     ") of the data buffer belong to no tensor");
  }

  std::map<std::string, Tensor> out;
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (t.nbytes()) std::memcpy(t.raw_data(), buffer.data() + e.begin, t.nbytes());
    out.emplace(e.name, std::move(t));
  }
  return out;
}

namespace {

std::string dir_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

// Writes `bytes` to a new temporary file beside `path` (fsync'ed, mode 0644)
// and returns its name; `path` is checked first and left as it is.
std::string stage_file(const std::string& path, std::string_view bytes) {
  const std::size_t slash = path.rfind('/');
  const std::string dir = dir_of(path);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty())
    throw std::invalid_argument("write_file_atomically: '" + path + "' names a directory");
  // Absent or a regular file, checked before anything is written and again just
  // before the rename: nothing else at the path is ever replaced.
  detail::require_output_path(path);
  std::string tmp = (dir == "/" ? "" : dir) + "/." + base + ".tmp.XXXXXX";
  std::vector<char> tmpl(tmp.begin(), tmp.end());
  tmpl.push_back('\0');
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) {
    throw std::runtime_error("cannot create a temporary file in '" + dir + "' for '" + path +
                             "': " + errno_text());
  }
  tmp.assign(tmpl.data());
  auto abandon = [&](const std::string& what) {
    const std::string err = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot write '" + path + "': " + what + ": " + err);
  };
  // mkstemp creates 0600; a saved model should be readable like any other file.
  if (::fchmod(fd, 0644) != 0) abandon("chmod");
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      abandon("write");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  // fsync before rename: otherwise a crash can leave the new name pointing at
  // an empty or partial file on some filesystems.
  if (::fsync(fd) != 0) abandon("fsync");
  if (::close(fd) != 0) {
    const std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot write '" + path + "': close: " + err);
  }
  return tmp;
}

// Renames the staged `tmp` over `path` (checked again first). Throws, leaving
// `tmp` for the caller to remove.
void publish_staged(const std::string& path, const std::string& tmp) {
  detail::require_output_path(path);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("cannot write '" + path + "': rename: " + errno_text());
  }
  // Persist the directory entry too; failure here is not worth failing the save.
  const int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace

void write_files_atomically(const std::vector<std::pair<std::string, std::string_view>>& files) {
  for (const auto& f : files) detail::require_output_path(f.first);
  std::vector<std::string> staged;
  const auto remove_staged = [&](std::size_t from) {
    for (std::size_t k = from; k < staged.size(); ++k) ::unlink(staged[k].c_str());
  };
  try {
    for (const auto& f : files) staged.push_back(stage_file(f.first, f.second));
  } catch (const std::exception& e) {
    remove_staged(0);
    if (files.size() == 1) throw;
    throw std::runtime_error(std::string(e.what()) + " (nothing was replaced: every file is " +
                             "written in full before the first is renamed into place)");
  }
  for (std::size_t k = 0; k < files.size(); ++k) {
    try {
      publish_staged(files[k].first, staged[k]);
    } catch (const std::exception& e) {
      remove_staged(k);
      if (files.size() == 1) throw;
      if (k == 0) throw std::runtime_error(std::string(e.what()) + " (nothing was replaced)");
      std::string done;
      for (std::size_t r = 0; r < k; ++r) done += (r ? ", " : "") + files[r].first;
      throw std::runtime_error(std::string(e.what()) + " (already replaced: " + done + ")");
    }
  }
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  write_files_atomically({{path, bytes}});
}

void check_output_file(const std::string& path) { detail::require_output_path(path); }

namespace {

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileId&) const = default;
};

// Where a path is: its own identity (when it exists), whether it is a
// directory, and the directories that hold it, innermost first, found from
// its canonical path (or its parent's, when it does not exist yet).
struct Place {
  std::optional<FileId> self;
  bool is_dir = false;
  std::vector<FileId> holders;
};

Place place_of_stat(const struct stat& st, const std::filesystem::path& canonical_parent) {
  Place p;
  p.self = FileId{st.st_dev, st.st_ino};
  p.is_dir = S_ISDIR(st.st_mode);
  for (std::filesystem::path d = canonical_parent;; d = d.parent_path()) {
    struct stat ds {};
    if (::stat(d.c_str(), &ds) == 0) p.holders.push_back({ds.st_dev, ds.st_ino});
    if (d == d.root_path() || d.empty()) break;
  }
  return p;
}

std::optional<Place> place_of(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    const fs::path c = fs::canonical(path, ec);
    return place_of_stat(st, ec ? fs::path() : c.parent_path());
  }
  // Not there yet: only the directories it would be written into.
  const fs::path parent = fs::weakly_canonical(fs::absolute(path, ec).parent_path(), ec);
  if (ec) return std::nullopt;
  Place p;
  struct stat none {};
  p = place_of_stat(none, parent);
  p.self.reset();
  p.is_dir = false;
  return p;
}

// How `out` meets `in` ("is", "lies inside", ...), or "" when it does not.
// `inside`: whether lying inside an input directory counts (for a path; a
// descriptor already open only clashes with a file the command reads).
std::string clash(const Place& out, const Place& in, const std::string& in_path, bool inside) {
  if (out.self && in.self && *out.self == *in.self) return "is";
  if (inside && in.is_dir && in.self &&
      std::find(out.holders.begin(), out.holders.end(), *in.self) != out.holders.end()) {
    return "lies inside";
  }
  if (out.is_dir && out.self &&
      std::find(in.holders.begin(), in.holders.end(), *out.self) != in.holders.end()) {
    return "holds";
  }
  if (inside && in.is_dir && out.self && !out.is_dir) {  // a hard link elsewhere to one of its files
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(in_path, ec)) {
      struct stat st {};
      if (::stat(e.path().c_str(), &st) == 0 && FileId{st.st_dev, st.st_ino} == *out.self) {
        return "is a hard link to " + e.path().filename().string() + " in";
      }
    }
  }
  return "";
}

void check_place_not_input(const Place& out, const std::string& output, const std::string& output_what,
                           const std::vector<InputPath>& inputs, bool inside) {
  for (const InputPath& in : inputs) {
    const std::optional<Place> at = place_of(in.path);
    if (!at || !at->self) continue;
    const std::string how = clash(out, *at, in.path, inside);
    if (how.empty()) continue;
    const std::string subject =
        output_what.empty() ? output : output_what + " '" + output + "'";
    throw std::invalid_argument(subject + " " + how + " the " + in.what +
                                " '" + in.path + "' that this command reads: a command never writes " +
                                "onto its own input (give another path)");
  }
}

}  // namespace

void check_output_not_input(const std::string& output, const std::string& output_what,
                            const std::vector<InputPath>& inputs) {
  const std::optional<Place> out = place_of(output);
  if (out) check_place_not_input(*out, output, output_what, inputs, /*inside=*/true);
}

void check_descriptor_not_input(int fd, const std::string& name,
                                const std::vector<InputPath>& inputs) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) return;
  std::error_code ec;
  const std::filesystem::path self =
      std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
  const Place out = place_of_stat(st, ec ? std::filesystem::path() : self.parent_path());
  check_place_not_input(out, name, "", inputs, /*inside=*/false);
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  write_file_atomically(path, serialize_safetensors(tensors, metadata));
}

std::map<std::string, Tensor> load_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata) {
  // A directory, device or FIFO is refused before reading (a link to /dev/zero
  // was read forever), checked on the open descriptor; a regular file is read
  // through that one descriptor, so a file renamed over the path meanwhile is
  // not mixed in.
  detail::require_regular_file(path, "safetensors file");
  const std::string bytes = detail::read_regular_file(path, "safetensors file", kMaxTensorBytes);
  return parse_safetensors(bytes, metadata, "'" + path + "'");
}

}  // namespace seqpack
