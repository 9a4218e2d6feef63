// Only regular files are read as models and data. A directory passed where a
// file is expected failed deep in the stream library without naming the path
// ("basic_filebuf::underflow ... Is a directory"), a link to /dev/zero or a FIFO
// made a loader read forever, and opening a FIFO without a writer blocked.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
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

// The whole contents of `path`. `what` names the file in messages ("vocabulary
// file"). Throws std::invalid_argument naming the path when it cannot be opened,
// is not a regular file (checked on the opened descriptor, so nothing swapped in
// between a check and the open is read) or cannot be read.
inline std::string read_regular_file(const std::string& path, const std::string& what) {
  // O_NONBLOCK: opening a FIFO without a writer must not block; it is refused
  // below anyway. Regular files ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw std::invalid_argument("cannot open " + what + " '" + path + "': " + std::strerror(errno));
  }
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
  std::string bytes;
  bytes.resize(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (true) {
    if (got == bytes.size()) bytes.resize(bytes.size() + 4096);  // the file grew meanwhile
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

}  // namespace seqpack::detail
