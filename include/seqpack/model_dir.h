// A model directory that changes as one unit.
//
//   ModelDirWriter w("seqpack-model", "seqpack train");  // locks it, finishes or cleans up
//   w.begin(/*keep_previous=*/true);                      // what an interrupted writer left
//   ... write files into w.staging() ...
//   w.commit();   // the directory now holds exactly the staged files
//
// How: the new files are written into a staging directory beside the model
// directory D (`.D.saving-ID/`, on the same filesystem), each fsync'ed; then one
// renameat2(RENAME_EXCHANGE) swaps the two directories. At every instant the path
// D names a complete directory: the old one or the new one. The old directory
// then moves, with one rename, to D/previous-N (or is removed when it is being
// replaced), and the previous-N directories it held move back into D first, each
// with one rename. A writer killed anywhere is finished by the next writer (or
// `seqpack train --resume D`), which reads the marker file `.seqpack-save` in the
// staging directory: its id tells a staging directory from an old directory
// waiting to be moved, and its state tells a finished save from a run still
// training. Other writers are kept out by an flock on `.D.lock` beside D, whose
// contents name the holder; the kernel drops the lock when its holder dies.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace seqpack {

// Another process holds the model directory's lock.
class ModelDirBusy : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ModelDirWriter {
 public:
  // Takes the lock on `dir` for `holder` (a short description such as
  // "seqpack train", stored in the lock file with the pid and the time) or throws
  // ModelDirBusy naming the holder. Then checks that `dir` can be written (its
  // parent directory and `dir` itself), finishing a commit an interrupted writer
  // had started, and removing leftovers (temporary files, empty staging
  // directories). A staging directory of an interrupted run that was still
  // training is kept: interrupted_checkpoint() names its checkpoint, and
  // begin(continue_interrupted=true) takes it over.
  ModelDirWriter(const std::string& dir, const std::string& holder);
  // Releases the lock. A begun, uncommitted staging directory stays, so that
  // `--resume` can continue from it.
  ~ModelDirWriter();
  ModelDirWriter(const ModelDirWriter&) = delete;
  ModelDirWriter& operator=(const ModelDirWriter&) = delete;

  const std::string& dir() const { return dir_; }
  // What recovery did, one line each, for the user ("finished an interrupted save: ...").
  const std::vector<std::string>& notes() const { return notes_; }

  // The checkpoint.safetensors of an interrupted run's staging directory, if one
  // is there (the run was killed while training, or during its final save).
  std::optional<std::string> interrupted_checkpoint() const;
  // Drops an interrupted run's staging directory (a new run that does not resume it).
  void discard_interrupted();

  // Starts a save: a new staging directory (or, with continue_interrupted, the
  // interrupted run's). keep_previous: on commit the model now in dir() moves
  // to dir()/previous-N; otherwise it is removed (its previous-N stay).
  void begin(bool keep_previous, bool continue_interrupted = false);
  // Where the new model's files go (after begin()).
  const std::string& staging() const;
  // Makes the staging directory the model directory (see the top of this file).
  // Returns the previous-N directory the old model moved to, or "" (none, or replaced).
  std::string commit();
  // Removes the staging directory (a run that failed and must leave dir() as it was).
  void abandon();
  // What abandon_keeping_checkpoint() did.
  struct Abandoned {
    std::string staging;               // the staging directory
    std::vector<std::string> removed;  // names removed from it (all of it when `kept` is "")
    std::string kept;                  // the checkpoint kept in it, or ""
  };
  // For a run that failed before commit(): removes the staging directory's files
  // but its checkpoint.safetensors (and the marker that lets the next writer find
  // it), so that `--resume` can continue the run; without a checkpoint, the whole
  // staging directory. dir() is not touched.
  Abandoned abandon_keeping_checkpoint();

 private:
  void recover();
  void lock(const std::string& holder);
  std::string put_away(const std::string& path, bool keep_previous);

  std::string dir_;     // as given, without trailing slashes
  std::string parent_;  // its parent directory
  std::string name_;    // its last component
  int lock_fd_ = -1;
  std::string staging_;  // "" before begin()
  std::string id_;
  bool keep_previous_ = true;
  std::optional<std::string> interrupted_;  // staging directory of an interrupted run
  std::vector<std::string> notes_;
};

}  // namespace seqpack
