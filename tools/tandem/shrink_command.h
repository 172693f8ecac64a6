// `tandem shrink --data DIR --out DIR`: an ImageFolder written again with each photo larger than
// training needs made smaller (data::shrink_image), on every core, with a progress line, a
// summary and JSON; a stopped run goes on where it stopped. Built where the data layer is.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace tandem {

struct ShrinkCommand {
  std::string data, out, json;
  int64_t image_size = 224;
  double min_scale = 0.08;
  int quality = 95;
  std::string subsampling = "420";
  int workers = 0;  // not given: one per core
  bool strip_metadata = false;
  bool skip_bad = false;
  bool quiet = false;
  CLI::App* app = nullptr;

  /// Adds the subcommand and its flags to `parent`.
  void add(CLI::App& parent);
  /// Checks the flags and the folders, then writes --out. Throws InvalidArgument naming a bad
  /// flag or folder (--out inside --data, or the other way round, included); tandem::Error
  /// naming the first bad file without --skip-bad (the files written until then stay, and a
  /// second run goes on from there).
  int run(const std::string& command_line);
};

}  // namespace tandem
