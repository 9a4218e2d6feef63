#include "seqpack/model_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <vector>


#include "seqpack/json_limits.h"
#include "seqpack/safetensors.h"
#include "train/regular_file.h"

namespace seqpack {

namespace {

namespace fs = std::filesystem;

const char kMarker[] = ".seqpack-save";
// The files of a model: what save_classifier writes, and the checkpoint.
const char* const kModelFiles[] = {"model.safetensors", "vocabulary.json", "config.json",
                                   "checkpoint.safetensors"};

std::string errno_text() { return std::strerror(errno); }

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw std::runtime_error("model directory: cannot " + what + " '" + path + "': " + errno_text());
}

void fsync_dir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open the directory", path);
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    fail("fsync", path);
  }
  ::close(fd);
}

void rename_or_fail(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail("rename '" + from + "' to", to);
}

// Names in `dir`, without "." and "..".
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) fail("list", dir);
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  return out;
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// rm -r with the plain system calls (so that fault-injection tests see them).
void remove_tree(const std::string& path) {
  if (is_dir(path)) {
    for (const std::string& n : entries(path)) remove_tree(path + "/" + n);
    if (::rmdir(path.c_str()) != 0) fail("remove", path);
  } else if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    fail("remove", path);
  }
}

// N of "previous-N", or 0.
int previous_number(const std::string& name) {
  if (name.rfind("previous-", 0) != 0 || name.size() == 9 || name.size() > 18) return 0;
  int n = 0;
  for (std::size_t i = 9; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return 0;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

int highest_previous(const std::string& dir) {
  int hi = 0;
  for (const std::string& n : entries(dir)) {
    if (is_dir(dir + "/" + n)) hi = std::max(hi, previous_number(n));
  }
  return hi;
}

// Temporary files of write_file_atomically (".NAME.tmp.XXXXXX") and of older
// seqpack versions ("checkpoint.safetensors.tmp-PID").
bool is_temporary(const std::string& name) {
  return (name.size() > 1 && name[0] == '.' && name.find(".tmp.") != std::string::npos) ||
         name.find(".safetensors.tmp-") != std::string::npos;
}

bool has_model_file(const std::string& dir) {
  for (const char* f : kModelFiles) {
    if (exists(dir + "/" + f)) return true;
  }
  return false;
}

struct Marker {
  std::string id;
  std::string state;  // "training" or "complete"
  bool keep_previous = true;
};

std::optional<Marker> read_marker(const std::string& dir) {
  std::ifstream in(dir + "/" + kMarker);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  try {
    const std::string text = s.str();
    check_json_depth(text, "marker");
    const auto j = nlohmann::json::parse(text);
    Marker m{j.at("id").get<std::string>(), j.at("state").get<std::string>(),
             j.at("keep_previous").get<bool>()};
    if (m.state != "training" && m.state != "complete") return std::nullopt;
    return m;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // written atomically, so only a foreign file gets here
  }
}

void write_marker(const std::string& dir, const Marker& m) {
  const nlohmann::json j = {{"id", m.id}, {"state", m.state}, {"keep_previous", m.keep_previous}};
  write_file_atomically(dir + "/" + kMarker, j.dump() + "\n");
}

std::string random_id() {
  std::random_device rd;
  std::uniform_int_distribution<uint64_t> u;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(u(rd)));
  return buf;
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// A save renames the whole model directory away: if that directory is the
// process's working directory or holds it, the shell that started the run is
// left in previous-N (or in a removed directory). `p` is absolute and normal,
// links resolved where it exists.
void refuse_working_directory(const fs::path& p, const std::string& shown) {
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (ec) return;
  const fs::path target = fs::weakly_canonical(p, ec);
  if (ec) return;
  const fs::path here = fs::weakly_canonical(cwd, ec);
  if (ec) return;
  auto t = target.begin(), h = here.begin();
  for (; t != target.end() && h != here.end() && *t == *h; ++t, ++h) {
  }
  if (t != target.end()) return;  // `target` is not `here` or one of its ancestors
  throw std::invalid_argument(
      "model directory '" + shown + "' is " +
      (h == here.end() ? "the current working directory ('" + here.string() + "')"
                       : "an ancestor of the current working directory ('" + here.string() + "')") +
      ": a save replaces the whole directory, which would move the working directory away; "
      "give a directory below it, such as '" +
      (here / "model").string() + "'");
}

}  // namespace

ModelDirWriter::ModelDirWriter(const std::string& dir, const std::string& holder) {
  if (dir.empty()) throw std::invalid_argument("model directory: the path is empty");
  const fs::path abs = fs::absolute(fs::path(dir)).lexically_normal();
  fs::path p = abs;
  if (!p.has_filename()) p = p.parent_path();  // "a/b/" -> "a/b"
  name_ = p.filename().string();
  if (name_.empty() || name_ == "." || name_ == ".." || p == p.root_path()) {
    throw std::invalid_argument("model directory '" + dir + "': name a directory below '/'");
  }
  dir_ = dir;
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  parent_ = p.parent_path().string();
  struct stat lst;
  if (::lstat(p.c_str(), &lst) == 0 && !S_ISDIR(lst.st_mode)) {
    struct stat st;
    if (S_ISLNK(lst.st_mode) && ::stat(p.c_str(), &st) != 0) {
      std::error_code ec;
      const fs::path target = fs::read_symlink(p, ec);
      throw std::invalid_argument(
          "model directory '" + dir_ + "' is a dangling symbolic link (to '" + target.string() +
          "', which does not exist): create that directory, or give another path");
    }
    if (::stat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      throw std::invalid_argument(
          "model directory '" + dir_ + "' exists and is not a directory (it is " +
          (S_ISLNK(lst.st_mode) ? std::string("a symbolic link to ") : std::string()) +
          detail::file_kind(S_ISLNK(lst.st_mode) ? st.st_mode : lst.st_mode) + ")");
    }
    // A link to a directory: the directory itself is what changes.
    p = fs::canonical(p);
    name_ = p.filename().string();
    parent_ = p.parent_path().string();
  }
  refuse_working_directory(p, dir_);
  const std::string full = p.string();
  std::error_code ec;
  fs::create_directories(parent_, ec);
  if (ec) {
    throw std::runtime_error("model directory: cannot create '" + parent_ + "': " + ec.message());
  }
  lock(holder);
  try {
    recover();
    if (is_dir(full)) {
      std::vector<std::string> foreign;
      for (const std::string& n : entries(full)) {
        bool ours = n == kMarker || is_temporary(n) || (previous_number(n) > 0 && is_dir(full + "/" + n));
        for (const char* f : kModelFiles) ours = ours || n == f;
        if (!ours) foreign.push_back("'" + n + "'");
      }
      if (!foreign.empty()) {
        std::string list;
        for (std::size_t i = 0; i < foreign.size() && i < 3; ++i) list += (i ? ", " : "") + foreign[i];
        if (foreign.size() > 3) list += ", ...";
        throw std::invalid_argument("model directory '" + dir_ +
                                    "' holds files that are not part of a seqpack model (" + list +
                                    "): give a new directory, an empty one or a model directory");
      }
      if (::access(full.c_str(), W_OK) != 0) fail("write to", dir_);
    }
  } catch (...) {
    ::close(lock_fd_);
    throw;
  }
}

ModelDirWriter::~ModelDirWriter() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing the descriptor drops the flock
}

void ModelDirWriter::lock(const std::string& holder) {
  const std::string path = parent_ + "/." + name_ + ".lock";
  // The lock is written (its holder line): like every output, never through a
  // symbolic link (O_NOFOLLOW) and only into a regular file (fstat; O_NONBLOCK
  // keeps a FIFO put there from blocking the open).
  lock_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (lock_fd_ < 0 && errno == ELOOP) {
    throw std::invalid_argument("lock file '" + path +
                                "' is a symbolic link: seqpack writes no file through a link; "
                                "remove it");
  }
  if (lock_fd_ < 0) fail("create the lock file", path);
  struct stat st {};
  if (::fstat(lock_fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = ::fstat(lock_fd_, &st) == 0 ? detail::file_kind(st.st_mode) : "unreadable";
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw std::invalid_argument("lock file '" + path + "' is " + kind +
                                ", not a regular file; remove it");
  }
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    // The holder writes its line (ending in a newline) just after it takes
    // the lock: one that took it a moment ago may not have written it yet,
    // so read again for up to 100 ms before calling the holder unknown.
    std::string who;
    char buf[512];
    for (int tries = 0; e == EWOULDBLOCK && tries < 50; ++tries) {
      const ssize_t n = ::pread(lock_fd_, buf, sizeof buf - 1, 0);
      who.assign(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
      if (!who.empty() && who.back() == '\n') break;
      ::usleep(2000);
    }
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    ::close(lock_fd_);
    lock_fd_ = -1;
    if (e == EWOULDBLOCK) {
      throw ModelDirBusy("model directory '" + dir_ + "' is in use by another process (" +
                         (who.empty() ? std::string("holder unknown") : who) + ", lock " + path +
                         "): wait for it to finish, or stop it");
    }
    errno = e;
    fail("lock", path);
  }
  const std::string me = "pid " + std::to_string(::getpid()) + ", " + holder + ", since " + now_text() + "\n";
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, me.data(), me.size(), 0) < 0) {
    const int e = errno;
    ::close(lock_fd_);
    lock_fd_ = -1;
    errno = e;
    fail("write the lock file", path);
  }
}

// The old directory of a swapped-in commit, at `path`: its previous-N move back
// into the model directory (same numbers where free), then it becomes the next
// previous-N (keep_previous, when it holds a model) or is removed. Returns
// where it went as the caller named the model directory ("DIR/previous-N"), or "".
std::string ModelDirWriter::put_away(const std::string& path, bool keep_previous) {
  const std::string full = parent_ + "/" + name_;
  for (const std::string& e : entries(path)) {
    const int n = previous_number(e);
    if (n > 0 && is_dir(path + "/" + e)) {
      const int to = exists(full + "/previous-" + std::to_string(n)) ? highest_previous(full) + 1 : n;
      rename_or_fail(path + "/" + e, full + "/previous-" + std::to_string(to));
    }
  }
  std::string kept;
  if (keep_previous && has_model_file(path)) {
    for (const std::string& e : entries(path)) {
      if (e == kMarker || is_temporary(e)) remove_tree(path + "/" + e);
    }
    kept = "previous-" + std::to_string(highest_previous(full) + 1);
    rename_or_fail(path, full + "/" + kept);
    kept = dir_ + "/" + kept;
  } else {
    remove_tree(path);
  }
  fsync_dir(full);
  fsync_dir(parent_);
  return kept;
}

void ModelDirWriter::recover() {
  const std::string full = parent_ + "/" + name_;
  const std::string saving = "." + name_ + ".saving-";
  const std::string old_prefix = "." + name_ + ".old-";
  // A commit killed between the two renames of the fallback (no RENAME_EXCHANGE)
  // left the old directory at .NAME.old-ID and no NAME: finish the swap if the
  // new model was complete, else put the old one back.
  if (!exists(full)) {
    for (const std::string& n : entries(parent_)) {
      if (n.rfind(old_prefix, 0) != 0 || !is_dir(parent_ + "/" + n)) continue;
      const std::string id = n.substr(old_prefix.size());
      const std::string staged = parent_ + "/" + saving + id;
      const auto sm = is_dir(staged) ? read_marker(staged) : std::nullopt;
      rename_or_fail(sm && sm->id == id && sm->state == "complete" ? staged : parent_ + "/" + n, full);
      fsync_dir(parent_);
      break;
    }
  }
  const std::optional<Marker> dm = is_dir(full) ? read_marker(full) : std::nullopt;
  for (const std::string& n : entries(parent_)) {
    const bool is_saving = n.rfind(saving, 0) == 0, is_old = n.rfind(old_prefix, 0) == 0;
    const std::string path = parent_ + "/" + n;
    if ((!is_saving && !is_old) || !is_dir(path)) continue;
    const std::string id = n.substr(is_saving ? saving.size() : old_prefix.size());
    const auto sm = read_marker(path);
    if (is_saving && sm && sm->id == id) {
      if (sm->state == "complete") {
        staging_ = path;
        id_ = id;
        keep_previous_ = sm->keep_previous;
        const std::string kept = commit();
        notes_.push_back("finished the save that an interrupted run had begun: '" + dir_ +
                         "' holds its model" + (kept.empty() ? "" : "; the one before is in " + kept));
        return;  // commit() has recovered the rest
      }
      if (!exists(path + "/checkpoint.safetensors") ||
          (interrupted_ && fs::last_write_time(*interrupted_) >= fs::last_write_time(path))) {
        remove_tree(path);  // killed before its first checkpoint, or older than the one kept
        continue;
      }
      if (interrupted_) remove_tree(*interrupted_);
      interrupted_ = path;
    } else if (dm && dm->id == id) {
      const std::string kept = put_away(path, dm->keep_previous);
      notes_.push_back("finished putting away the model that an interrupted save replaced" +
                       (kept.empty() ? std::string() : ": it is in " + kept));
    } else if (has_model_file(path)) {
      // Of unknown history (not written by this protocol): kept, never deleted.
      if (is_dir(full)) {
        const std::string k = full + "/previous-" + std::to_string(highest_previous(full) + 1);
        rename_or_fail(path, k);
        fsync_dir(full);
        notes_.push_back("moved a leftover model directory '" + path + "' to " + k);
      } else {
        notes_.push_back("left alone a leftover model directory '" + path + "'");
      }
    } else {
      remove_tree(path);  // a staging directory killed before its marker was written
    }
  }
  if (is_dir(full)) {
    bool changed = false;
    for (const std::string& n : entries(full)) {
      if (is_temporary(n) || n == kMarker) {
        remove_tree(full + "/" + n);
        changed = true;
      }
    }
    if (changed) fsync_dir(full);
  }
  if (interrupted_) {
    for (const std::string& n : entries(*interrupted_)) {
      if (is_temporary(n)) remove_tree(*interrupted_ + "/" + n);
    }
  }
}

std::optional<std::string> ModelDirWriter::interrupted_checkpoint() const {
  if (!interrupted_) return std::nullopt;
  const std::string ck = *interrupted_ + "/checkpoint.safetensors";
  if (!exists(ck)) return std::nullopt;
  return ck;
}

void ModelDirWriter::discard_interrupted() {
  if (!interrupted_) return;
  remove_tree(*interrupted_);
  fsync_dir(parent_);
  interrupted_.reset();
}

void ModelDirWriter::begin(bool keep_previous, bool continue_interrupted) {
  if (!staging_.empty()) throw std::logic_error("ModelDirWriter::begin: a save is already begun");
  if (continue_interrupted) {
    if (!interrupted_) throw std::logic_error("ModelDirWriter::begin: no interrupted run to continue");
    const auto m = read_marker(*interrupted_);
    staging_ = *interrupted_;
    id_ = m->id;
    keep_previous_ = m->keep_previous;
    interrupted_.reset();
    return;
  }
  if (interrupted_) throw std::logic_error("ModelDirWriter::begin: discard or continue the interrupted run first");
  id_ = random_id();
  keep_previous_ = keep_previous;
  staging_ = parent_ + "/." + name_ + ".saving-" + id_;
  if (::mkdir(staging_.c_str(), 0755) != 0) {
    const std::string s = staging_;
    staging_.clear();
    fail("create the staging directory", s);
  }
  try {
    fsync_dir(parent_);
    write_marker(staging_, {id_, "training", keep_previous_});
  } catch (...) {
    abandon();
    throw;
  }
}

const std::string& ModelDirWriter::staging() const {
  if (staging_.empty()) throw std::logic_error("ModelDirWriter::staging: call begin() first");
  return staging_;
}

std::string ModelDirWriter::commit() {
  const std::string s = staging();
  const std::string full = parent_ + "/" + name_;
  write_marker(s, {id_, "complete", keep_previous_});
  std::string old;  // where the old directory is after the swap
  if (!exists(full)) {
    rename_or_fail(s, full);
  } else if (::renameat2(AT_FDCWD, s.c_str(), AT_FDCWD, full.c_str(), RENAME_EXCHANGE) == 0) {
    old = s;
  } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
    // A filesystem without RENAME_EXCHANGE: two renames; recover() finishes or
    // undoes a commit killed between them.
    old = parent_ + "/." + name_ + ".old-" + id_;
    rename_or_fail(full, old);
    rename_or_fail(s, full);
  } else {
    fail("swap in the new model: rename '" + s + "' and", full);
  }
  fsync_dir(parent_);
  staging_.clear();
  const std::string kept = old.empty() ? "" : put_away(old, keep_previous_);
  // The marker goes last: until then it tells recover() how to put the old one away.
  if (::unlink((full + "/" + kMarker).c_str()) != 0) fail("remove", full + "/" + kMarker);
  fsync_dir(full);
  id_.clear();
  return kept;
}

void ModelDirWriter::abandon() {
  if (staging_.empty()) return;
  const std::string s = staging_;
  staging_.clear();
  remove_tree(s);
  fsync_dir(parent_);
}

ModelDirWriter::Abandoned ModelDirWriter::abandon_keeping_checkpoint() {
  Abandoned r;
  if (staging_.empty()) return r;
  r.staging = staging_;
  staging_.clear();
  const std::string checkpoint = r.staging + "/checkpoint.safetensors";
  if (!exists(checkpoint)) {
    r.removed = entries(r.staging);
    std::sort(r.removed.begin(), r.removed.end());
    remove_tree(r.staging);
    fsync_dir(parent_);
    return r;
  }
  for (const std::string& n : entries(r.staging)) {
    if (n == kMarker || n == "checkpoint.safetensors") continue;
    remove_tree(r.staging + "/" + n);
    r.removed.push_back(n);
  }
  std::sort(r.removed.begin(), r.removed.end());
  fsync_dir(r.staging);
  r.kept = checkpoint;
  return r;
}

}  // namespace seqpack
