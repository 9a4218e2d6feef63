// Only regular files are read as models and data. A directory passed where a
// file is expected failed deep in the stream library without naming the path
// ("basic_filebuf::underflow ... Is a directory"), and a link to /dev/zero or
// a FIFO made a loader read forever.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace seqpack::detail {

// Throws std::invalid_argument naming `path` (`what`: "TSV file", ...) when it
// exists but, after following symbolic links, is not a regular file. A path
// that cannot be stat'ed is left to the caller's open, whose error says why.
// Returns the file's size (0 when it could not be stat'ed).
inline uint64_t require_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  if (S_ISREG(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "of an unknown kind";
  throw std::invalid_argument(what + " '" + path + "' is " + kind + ", not a regular file");
}

}  // namespace seqpack::detail
