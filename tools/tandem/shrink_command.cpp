// `tandem shrink`: see shrink_command.h.
#include "shrink_command.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "cli_util.h"
#include "posix_fs.h"
#include "tandem/data/decode.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/shrink.h"
#include "tandem/error.h"
#include "tandem/loader.h"  // kMaxLoaderWorkers
#include "tandem/run/progress.h"

namespace tandem {

namespace {

// `path` with every level that exists resolved (symlinks, . and ..), the missing ones appended
// as given: where a folder that may not exist yet would be.
std::string resolved(const std::string& path) {
  if (fs::exists(path)) return fs::real_path(path, "shrink");
  std::string p = path;  // "a/b/" is "a/b"; its parent, parent_of's, exists or is shorter
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const std::string name = p.substr(p.rfind('/') + 1);  // the whole of a bare name
  const std::string parent = resolved(fs::parent_of(p));
  return name == "." ? parent : fs::join_path(parent, name);
}

bool inside(const std::string& path, const std::string& folder) {
  return path == folder ||
         (path.size() > folder.size() && path.compare(0, folder.size(), folder) == 0 &&
          (folder.back() == '/' || path[folder.size()] == '/'));
}

data::ChromaSubsampling parse_subsampling(const std::string& text) {
  if (text == "444") return data::ChromaSubsampling::k444;
  if (text == "422") return data::ChromaSubsampling::k422;
  return data::ChromaSubsampling::k420;
}

// What the workers found, under one lock.
struct Tally {
  std::mutex mu;
  int64_t shrunk = 0, made_baseline = 0, already_there = 0;
  std::vector<std::string> rewritten;  // "path: why": an earlier run's output that was damaged
  std::map<std::string, int64_t> kept;  // by why
  int64_t bytes_in = 0, bytes_out = 0;  // of the files shrunk
  double pixels_in = 0, pixels_out = 0;
  std::vector<std::string> bad;  // "path: why"
  std::string stopped_by;        // the first bad file's error (without --skip-bad), or a write's
  bool stopped_writing = false;
};

std::string megabytes(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

}  // namespace

void ShrinkCommand::add(CLI::App& parent) {
  app = parent.add_subcommand(
      "shrink",
      "Write an ImageFolder again with every JPEG and PNG larger than training needs made "
      "smaller: the least size at which each RandomResizedCrop box of --image-size (scale >= "
      "--min-scale, ratio 3/4 to 4/3) still has its pixels and the evaluation's Resize still "
      "shrinks, so nothing the model sees is enlarged where torchvision's crop of the original "
      "would be shrunk, and each photo decodes in a fraction of the time (a PNG stays a PNG: 8-bit "
      "gray or RGB, as training decodes it). CMYK JPEGs and images small enough are copied as "
      "they are, but a progressive JPEG is written as baseline without a loss (the same pixels, "
      "decoded in about a quarter of the CPU's time, and by the JPEG engines). The JPEGs written "
      "keep their metadata (EXIF, ICC profile, XMP, comments). A stopped run goes on where it "
      "stopped.");
  app->add_option("--data", data, "the ImageFolder to read: one subfolder of JPEG/PNG per class")
      ->required();
  app->add_option("--out", out,
                  "the folder to write, the same classes and file names (made where missing; "
                  "files already there are kept, unless damaged since: those are written again)")
      ->required();
  app->add_option("--image-size", image_size, "the square the model sees (tandem train's)")
      ->capture_default_str();
  app->add_option("--min-scale", min_scale,
                  "RandomResizedCrop's least share of the image's area (torchvision's 0.08)")
      ->capture_default_str();
  app->add_option("--quality", quality, "JPEG quality of the photos written, 1 to 100")
      ->capture_default_str();
  app->add_option("--subsampling", subsampling, "chroma subsampling of the photos written")
      ->check(CLI::IsMember({"420", "422", "444"}))
      ->capture_default_str();
  app->add_flag("--strip-metadata", strip_metadata,
                "write the shrunk photos without the originals' metadata (EXIF with its "
                "thumbnail, ICC profile, XMP, comments): a few KB less a file");
  app->add_option("--workers", workers, "threads [default: one per core]");
  app->add_flag("--skip-bad", skip_bad,
                "leave files that fail to read or decode out and report them (default: stop at "
                "the first, naming it)");
  app->add_option("--json", json, "write the summary as JSON to this file");
  app->add_flag("--quiet", quiet, "no progress line");
}

int ShrinkCommand::run(const std::string& command_line) {
  TANDEM_CHECK_ARG(quality >= 1 && quality <= 100, "--quality ", quality,
                   " is not valid: expected 1 to 100");
  TANDEM_CHECK_ARG(app->count("--workers") == 0 || (workers >= 1 && workers <= kMaxLoaderWorkers),
                   "--workers ", workers, " is not valid: expected 1 to ", kMaxLoaderWorkers,
                   " threads");
  TANDEM_CHECK_ARG(image_size >= 1, "--image-size ", image_size, " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(min_scale > 0 && min_scale <= 1, "--min-scale ", min_scale,
                   " is not valid: expected a share of the area in (0, 1]");
  TANDEM_CHECK_ARG(!out.empty() && !data.empty(), "--data and --out must name folders");
  const data::KeptSize kept = data::kept_size(image_size, min_scale);
  if (!json.empty()) cli::check_output_file("--json", json);
  cli::check_output_folder("--out", out);
  const data::ImageFolderDataset folder(data);  // names a missing or empty folder
  const std::string from = fs::real_path(data, "shrink"), to = resolved(out);
  TANDEM_CHECK_ARG(!inside(to, from) && !inside(from, to), "--out ", out, " cannot be used: it is ",
                   inside(to, from) ? "inside --data " : "above --data ", data,
                   ", and each would be read as the other's images");
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int threads = app->count("--workers") ? workers : static_cast<int>(cores);

  const std::vector<data::ImageFolderDataset::Sample>& samples = folder.samples();
  const std::string& root = folder.root();
  auto relative = [&](const std::string& path) {  // samples lie under the root given
    size_t at = root.size();
    while (at < path.size() && path[at] == '/') ++at;
    return path.substr(at);
  };
  {
    std::set<std::string> dirs;
    for (const auto& s : samples) dirs.insert(fs::parent_of(fs::join_path(out, relative(s.path))));
    for (const std::string& d : dirs) fs::make_dirs(d);
  }
  std::cerr << "shrink: " << samples.size() << " files in " << folder.classes().size()
            << " classes under " << data << " -> " << out << "; keeping " << kept.min_area
            << " px of area and a shorter side of " << kept.min_short_side << " px (" << image_size
            << " px crops of scale >= " << min_scale << "), " << threads << " threads\n";

  Tally tally;
  std::atomic<int64_t> next{0}, done{0};
  std::atomic<bool> stop{false};
  const data::ChromaSubsampling chroma = parse_subsampling(subsampling);
  auto work = [&] {
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (stop.load() || i >= static_cast<int64_t>(samples.size())) return;
      const std::string& path = samples[static_cast<size_t>(i)].path;
      const std::string target = fs::join_path(out, relative(path));
      // An earlier run's file, complete when it was renamed into place: kept unless it was
      // damaged since (cut short, emptied), which is written again.
      std::string damaged;
      const bool there = fs::path_status(target).is_regular_file;
      if (there) damaged = data::damaged_output(target);
      if (there && damaged.empty()) {
        std::lock_guard<std::mutex> lock(tally.mu);
        ++tally.already_there;
      } else {
        if (!damaged.empty()) {
          std::lock_guard<std::mutex> lock(tally.mu);
          tally.rewritten.push_back(target + ": " + first_line(damaged));
        }
        bool writing = false;  // a write that fails is the disk's, never a bad file's
        try {
          const std::vector<uint8_t> bytes = data::read_file(path);
          const data::ShrunkImage s =
              data::shrink_image(bytes, path, kept, quality, chroma, !strip_metadata);
          // Written whole under another name, then renamed: a run stopped mid-file leaves no
          // half photo under the real name (the next run writes it again).
          const std::string partial = target + ".partial";
          writing = true;
          data::write_file(partial, s.bytes);
          if (::rename(partial.c_str(), target.c_str()) != 0)
            throw Error("cannot rename " + partial + " to " + target + ": " +
                        fs::errno_text(errno));
          std::lock_guard<std::mutex> lock(tally.mu);
          if (s.shrunk) {
            ++tally.shrunk;
            tally.bytes_in += static_cast<int64_t>(bytes.size());
            tally.bytes_out += static_cast<int64_t>(s.bytes.size());
            tally.pixels_in += static_cast<double>(s.height * s.width);
            tally.pixels_out += static_cast<double>(s.out_height * s.out_width);
          } else if (s.made_baseline) {
            ++tally.made_baseline;
          } else {
            ++tally.kept[s.kept_because];
          }
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(tally.mu);
          if (skip_bad && !writing) {
            tally.bad.push_back(first_line(e.what()));
          } else if (tally.stopped_by.empty()) {
            tally.stopped_by = first_line(e.what());
            tally.stopped_writing = writing;
            stop = true;
          }
        }
      }
      ++done;
    }
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  {
    run::Progress progress("shrink", static_cast<int64_t>(samples.size()), !quiet);
    while (done.load() < static_cast<int64_t>(samples.size()) && !stop.load()) {
      progress.update(done.load());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (std::thread& t : pool) t.join();
    progress.finish();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!tally.stopped_by.empty())
    throw Error(tally.stopped_by + " (the files written so far are kept: run again to go on" +
                (tally.stopped_writing ? ")" : ", or with --skip-bad to leave such files out)"));

  int64_t kept_total = 0;
  std::string why;
  for (const auto& [reason, n] : tally.kept) {
    kept_total += n;
    why += (why.empty() ? "" : ", ") + reason + " " + std::to_string(n);
  }
  const int64_t files = static_cast<int64_t>(samples.size());
  std::printf("shrunk               %8lld  %s -> %s", static_cast<long long>(tally.shrunk),
              megabytes(tally.bytes_in).c_str(), megabytes(tally.bytes_out).c_str());
  if (tally.shrunk > 0)
    std::printf(", %.2f -> %.2f megapixels a photo", tally.pixels_in / 1e6 / tally.shrunk,
                tally.pixels_out / 1e6 / tally.shrunk);
  std::printf("\ncopied as they were  %8lld%s\n", static_cast<long long>(kept_total),
              why.empty() ? "" : ("  (" + why + ")").c_str());
  if (tally.made_baseline > 0)
    std::printf("made baseline        %8lld  (progressive JPEGs, the same pixels: no loss)\n",
                static_cast<long long>(tally.made_baseline));
  std::printf("already there        %8lld\n", static_cast<long long>(tally.already_there));
  if (!tally.rewritten.empty())
    std::printf("written again        %8lld  (damaged since an earlier run: %s%s)\n",
                static_cast<long long>(tally.rewritten.size()), tally.rewritten.front().c_str(),
                tally.rewritten.size() > 1 ? ", ..." : "");
  if (skip_bad) {
    std::printf("bad, left out        %8zu", tally.bad.size());
    for (size_t k = 0; k < tally.bad.size() && k < 3; ++k)
      std::printf("%s%s", k == 0 ? "  (" : "; ", tally.bad[k].c_str());
    std::printf("%s\n", tally.bad.empty() ? "" : tally.bad.size() > 3 ? "; ...)" : ")");
  }
  std::printf("%lld files in %.1f s: %.0f files/s on %d threads\n", static_cast<long long>(files),
              seconds, static_cast<double>(files) / seconds, threads);
  std::fflush(stdout);
  if (!json.empty()) {
    nlohmann::json j = {{"command", command_line},
                        {"data", data},
                        {"out", out},
                        {"image_size", image_size},
                        {"min_scale", min_scale},
                        {"quality", quality},
                        {"subsampling", subsampling},
                        {"metadata", strip_metadata ? "stripped" : "kept"},
                        {"min_area", kept.min_area},
                        {"min_short_side", kept.min_short_side},
                        {"files", files},
                        {"shrunk", tally.shrunk},
                        {"kept", tally.kept},
                        {"made_baseline", tally.made_baseline},
                        {"already_there", tally.already_there},
                        {"written_again", tally.rewritten},
                        {"bad", tally.bad},
                        {"bytes_in", tally.bytes_in},
                        {"bytes_out", tally.bytes_out},
                        {"seconds", seconds},
                        {"files_per_s", static_cast<double>(files) / seconds}};
    std::ofstream f(json);
    f << j.dump(2) << "\n";
    f.close();
    if (f.fail()) throw Error("writing '" + json + "' failed");
    std::cout << "wrote " << json << "\n";
  }
  return 0;
}

}  // namespace tandem
