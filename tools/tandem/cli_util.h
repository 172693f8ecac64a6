// What every `tandem` subcommand shares: output paths checked before a run (a bad --json fails
// in a second, not after an hour of training), and --mode's help and check, both built from the
// one mode table (tandem/mode.h), so a front end never offers a mode its parser refuses.
#pragma once

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "posix_fs.h"
#include "tandem/error.h"
#include "tandem/mode.h"
#include "tandem/run/request.h"  // RunMode: the modes and auto

namespace tandem::cli {

/// Throws InvalidArgument naming `option` unless a file can be written at `path` at the end of a
/// run: not a folder, an existing file this process may overwrite, or a new name in an existing
/// folder it may write into. Creates nothing (the run writes the file, atomically or not).
inline void check_output_file(const std::string& option, const std::string& path) {
  auto refuse = [&](const std::string& why) {
    throw InvalidArgument(option + " path '" + path + "' cannot be written: " + why);
  };
  if (const fs::PathStatus s = fs::path_status(path); s.exists) {
    if (s.is_directory) refuse("it is a folder, expected a file name");
    if (::access(path.c_str(), W_OK) != 0) refuse(std::strerror(errno));
    return;
  }
  const std::string dir = fs::parent_of(path);
  const fs::PathStatus d = fs::path_status(dir);
  if (!d.exists) refuse("the folder " + dir + " does not exist");
  if (!d.is_directory) refuse(dir + " is a file, expected a folder");
  // W and X: a new entry needs both on its folder.
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    refuse("no permission to write into " + dir + " (" + std::strerror(errno) + ")");
}

/// Throws InvalidArgument naming `option` unless `path` is a folder this process may write into,
/// or can be made: its nearest existing ancestor is such a folder (the run makes the missing
/// levels, as mkdir -p). Creates nothing.
inline void check_output_folder(const std::string& option, const std::string& path) {
  auto refuse = [&](const std::string& why) {
    throw InvalidArgument(option + " " + path + " cannot be used: " + why);
  };
  if (const fs::PathStatus s = fs::path_status(path); s.exists) {
    if (!s.is_directory) refuse("it is a file, expected a folder (new, or a run to --resume)");
    if (::access(path.c_str(), W_OK | X_OK) != 0)
      refuse(std::string("no permission to write into it (") + std::strerror(errno) + ")");
    return;
  }
  // Up to the first level that exists; every level below it is made by the run.
  std::string dir = fs::parent_of(path);
  while (!fs::exists(dir) && dir != "." && dir != "/") dir = fs::parent_of(dir);
  const fs::PathStatus d = fs::path_status(dir);
  if (!d.exists) refuse("no folder above it exists");
  if (!d.is_directory) refuse(dir + " is a file, expected a folder");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    refuse("no permission to make it in " + dir + " (" + std::strerror(errno) + ")");
}

/// The names of `modes`, in the table's order ("serial", "pipelined", ..., "auto").
inline std::vector<std::string> mode_names(const std::vector<run::RunMode>& modes) {
  std::vector<std::string> names;
  for (const run::RunMode& m : modes) names.push_back(run::mode_name(m));
  return names;
}

/// "\n  serial             every stage ...": one line of a mode list in a help text.
inline std::string mode_help_line(const std::string& name, const std::string& what) {
  char line[256];
  std::snprintf(line, sizeof line, "\n  %-18s %s", name.c_str(), what.c_str());
  return line;
}

/// The help text's list of `modes`, a mode_help_line each.
inline std::string mode_help(const std::vector<run::RunMode>& modes) {
  std::string out;
  for (const run::RunMode& m : modes)
    out += mode_help_line(run::mode_name(m), run::describe_mode(m));
  return out;
}

/// A CLI11 check that a value is one of `choices`; refused: "<what> 'x' is not valid: expected
/// a, b or c" (CLI11 puts the option's name before it). No text in the help: the option's own
/// help lists the choices.
inline CLI::Validator choice_validator(const std::string& what, std::vector<std::string> choices) {
  const std::string expected = join_choices(choices);
  return CLI::Validator(
      [what, choices, expected](std::string& value) {
        return std::find(choices.begin(), choices.end(), value) != choices.end()
                   ? std::string()
                   : what + " '" + value + "' is not valid: expected " + expected;
      },
      "");
}

/// choice_validator for a --mode that offers `extra_names` (sweep's "all") and `modes`.
inline CLI::Validator mode_validator(const std::vector<run::RunMode>& modes,
                                     const std::vector<std::string>& extra_names = {}) {
  std::vector<std::string> names = extra_names;
  const std::vector<std::string> table = mode_names(modes);
  names.insert(names.end(), table.begin(), table.end());
  return choice_validator("mode", names);
}

/// Every workload mode and auto: what bench, sweep and data-bench run.
inline std::vector<run::RunMode> modes_with_auto() { return run::run_modes(); }

}  // namespace tandem::cli
