// Only regular files are read as models and data, and only regular files or new
// paths are written. A directory passed where a file is expected fails deep in
// the stream library without naming the path, a link to /dev/zero or a FIFO
// makes a reader read forever, opening a FIFO without a writer blocks, and a
// rename over a device node replaces the device.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

namespace seqpack::detail {

// "a directory", "a character device", ... for a message about `mode`.
inline const char* file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// Throws std::invalid_argument naming `path` (`what`: "TSV file", ...) when it
// exists but, after following symbolic links, is not a regular file. A path
// that cannot be stat'ed is left to the caller's open, whose error says why.
// Returns the file's size (0 when it could not be stat'ed).
inline uint64_t require_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  if (S_ISREG(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  throw std::invalid_argument(what + " '" + path + "' is " + file_kind(st.st_mode) + ", not a regular file");
}

// Reads the open descriptor `fd` (which it closes) to its end, after checking
// with fstat that it is a regular file of at most `max_bytes`. `path` and `what`
// name the file in messages. Throws std::invalid_argument.
inline std::string read_open_regular_file(int fd, const std::string& path, const std::string& what,
                                          uint64_t max_bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd);
    throw std::invalid_argument("cannot stat " + what + " '" + path + "': " + err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::invalid_argument(what + " '" + path + "' is not a regular file (it is " +
                                file_kind(st.st_mode) + ")");
  }
  const auto too_large = [&](const std::string& size) {
    ::close(fd);
    return std::invalid_argument(what + " '" + path + "' is " + size +
                                 " bytes, more than the limit of " + std::to_string(max_bytes) +
                                 " bytes");
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes) throw too_large(std::to_string(st.st_size));
  // One byte past the limit is read to tell a file that grew past it.
  const uint64_t cap = max_bytes == UINT64_MAX ? max_bytes : max_bytes + 1;
  std::string bytes;
  bytes.resize(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (true) {
    if (got == bytes.size()) {  // the file grew meanwhile
      if (got >= cap) throw too_large("more than " + std::to_string(max_bytes));
      bytes.resize(static_cast<std::size_t>(std::min<uint64_t>(cap, uint64_t{got} + 4096)));
    }
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      throw std::invalid_argument("cannot read " + what + " '" + path + "': " + err);
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  bytes.resize(got);
  return bytes;
}

// The whole contents of `path`. `what` names the file in messages ("vocabulary
// file"). Throws std::invalid_argument naming the path when it cannot be opened,
// is not a regular file (checked on the opened descriptor, so nothing swapped in
// between a check and the open is read), is larger than `max_bytes` or cannot
// be read.
inline std::string read_regular_file(const std::string& path, const std::string& what,
                                     uint64_t max_bytes = UINT64_MAX) {
  // O_NONBLOCK: opening a FIFO without a writer must not block; it is refused
  // below anyway. Regular files ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw std::invalid_argument("cannot open " + what + " '" + path + "': " + std::strerror(errno));
  }
  return read_open_regular_file(fd, path, what, max_bytes);
}

// The file `name` of the directory open as `dirfd`, as read_regular_file reads
// a path (links are followed, relative to that directory); `path` names it in
// messages. std::nullopt when there is no such file.
inline std::optional<std::string> read_regular_file_at(int dirfd, const std::string& name,
                                                       const std::string& path,
                                                       const std::string& what,
                                                       uint64_t max_bytes) {
  const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw std::invalid_argument("cannot open " + what + " '" + path + "': " + std::strerror(errno));
  }
  return read_open_regular_file(fd, path, what, max_bytes);
}

// The rule for every file seqpack writes (write_file_atomically): the path must
// be absent or a regular file. Writes go to a temporary file renamed over the
// path, which would replace a device node, a FIFO or a socket with a regular
// file (as root, `/dev/null`), fail on a directory after all the work, and
// replace a symbolic link itself rather than write to its target. Throws
// std::invalid_argument naming the path and what it is.
inline void require_output_path(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // absent (or unreachable: the write says why)
  if (S_ISREG(st.st_mode)) return;
  if (S_ISLNK(st.st_mode)) {
    std::string target(4096, '\0');
    const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
    target.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    struct stat to {};
    const bool dangling = ::stat(path.c_str(), &to) != 0;
    throw std::invalid_argument(
        "output file '" + path + "' is a " + (dangling ? "dangling " : "") + "symbolic link (to '" +
        target + "'): seqpack replaces an output file as a whole (a new file renamed over the " +
        "path), which would replace the link rather than write to its target; give the target's " +
        "path instead");
  }
  throw std::invalid_argument("output file '" + path + "' is " + file_kind(st.st_mode) +
                              ": seqpack writes only to a regular file or a new path");
}

}  // namespace seqpack::detail
