// Checkpoints of a training run: the model's weights, the optimizer's state, the random
// generators' states and the run's position, written so that a crash, a full disk or a kill at
// any moment never leaves a half-written checkpoint where a resume would read it, and never
// loses the last good one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tandem/models/safetensors.h"

namespace tandem::train {

/// The prefix of a loss scale's entries in Checkpoint::optimizer.
inline constexpr const char* kLossScalePrefix = "loss_scale.";

/// One checkpoint as it is saved and loaded: three tensor files and the run's state.
struct Checkpoint {
  int64_t step = 0;            ///< training steps done (the global step to resume at)
  models::NamedTensors model;  ///< the model's state_dict
  /// Optimizer::state(), then, for a run with a loss scale, LossScale::state() with each name
  /// prefixed kLossScalePrefix.
  models::NamedTensors optimizer;
  models::NamedTensors rng;  ///< generator states, "generator.<i>", "default"
  nlohmann::json state;      ///< epoch, config, metrics so far (trainer.h)
};

/// The state.json format save() writes. 1 (no "format" key): before the data fingerprints, the
/// epoch's running sums and the files' checksums; such checkpoints still load (trainer.cpp says
/// what a resume of one cannot check).
constexpr int kCheckpointFormat = 2;

/// A folder of checkpoints, RUN_DIR/checkpoints/step-<step, 9 digits>/, each holding
/// model.safetensors, optimizer.safetensors, rng.safetensors and state.json.
///
///   save:  write every file into step-N.tmp/ ── fsync each ── rename to step-N ── fsync folder
///          ── only then remove the oldest beyond `keep`
///
/// A folder without ".tmp" is complete by construction (rename is atomic), so latest() never
/// sees a partial checkpoint, and the previous ones stay until the new one is whole. state.json,
/// written last, holds each tensor file's size and checksum: a file damaged later (a bad disk, a
/// copy cut short) is found by load(), not trained on.
class CheckpointStore {
 public:
  /// `dir`: the checkpoints folder (made when missing, with its parents); `keep` >= 1.
  CheckpointStore(std::string dir, int keep);

  /// Writes `checkpoint` as step-<checkpoint.step>, replacing one of that step. Throws
  /// tandem::Error naming the path and the system's reason (read-only, disk full, ...); the
  /// half-written folder is removed then, the earlier checkpoints are untouched.
  std::string save(const Checkpoint& checkpoint);
  /// The newest complete checkpoint's folder, or nullopt when there is none.
  std::optional<std::string> latest() const;
  /// Every complete checkpoint's folder, oldest first.
  std::vector<std::string> list() const;
  const std::string& dir() const { return dir_; }

  /// Reads a checkpoint folder. Throws tandem::Error naming the file that is missing or corrupt
  /// (unreadable, not JSON or safetensors, of another size or checksum than state.json records)
  /// or a state.json whose step is not the folder's.
  static Checkpoint load(const std::string& folder);

 private:
  std::string dir_;
  int keep_;
};

/// The identity of a dataset folder by content, so a resume finds the same data under another
/// spelling and refuses other data under the same one. Every file a dataset reads is counted
/// (images: .jpg, .jpeg, .png in any case; IDX: *-idx*-ubyte[.gz]), found by walking `dir`
/// recursively (symlinks followed, a cycle not re-entered, names starting with '.' skipped):
/// {"files": N, "bytes": B, "hash": 16 hex digits over each file's relative name and size and,
/// for IDX files, its content (the same sizes hold MNIST or Fashion-MNIST), "parts": the same
/// three per top-level entry (a class folder, images/ or masks/, an IDX file)}. Parts are left
/// out beyond 10 000. Throws tandem::Error naming a folder that cannot be listed.
/// IdxIdentity::kContent (what a run saves, marked "idx": "content"): an IDX file is its
/// uncompressed content, under its name without ".gz" — gzipped again, or unzipped, it is the
/// same data. kFileBytes: its bytes as stored, as fingerprints without that mark were made (a
/// resume compares such a checkpoint's the same way).
enum class IdxIdentity { kContent, kFileBytes };
nlohmann::json fingerprint_data(const std::string& dir, IdxIdentity idx = IdxIdentity::kContent);
/// What differs between two fingerprints, for a refusal: the counts, the sizes, and up to five
/// parts ("class_b: 12 files now, 10 in the checkpoint"); empty when they are the same.
std::string fingerprint_difference(const nlohmann::json& saved, const nlohmann::json& now);
/// `path` resolved (realpath: absolute, no symlink, no "..") or, when it cannot be, as given.
std::string resolve_path(const std::string& path);

/// Makes `path` and its missing parents (mkdir -p). Throws tandem::Error naming the path.
void make_dirs(const std::string& path);
/// Writes `text` to `path` atomically (path.tmp, fsync, rename, fsync the folder). Throws
/// tandem::Error naming the path and the reason.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace tandem::train
