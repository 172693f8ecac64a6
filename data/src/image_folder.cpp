// ImageFolderDataset: the file index (torchvision's find_classes + make_dataset order) and the
// per-sample load.
#include "tandem/data/image_folder.h"

#include <ATen/ops/empty.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <utility>

#include "codec_util.h"
#include "dataset_util.h"
#include "jpeg_markers.h"
#include "posix_fs.h"
#include "tandem/data/decode.h"
#include "tandem/data/engine_share.h"
#include "tandem/data/image_mask_pairs.h"
#include "tandem/detail/thread_sched.h"
#include "tandem/error.h"
#include "tandem/resized_crop.h"

namespace tandem::data {
namespace {

constexpr const char* kWho = "ImageFolder";

// One folder met by the walk: its path as os.walk spells it (root joined with the names below
// it) and the names of the image files directly in it.
struct WalkedFolder {
  std::string path;
  std::vector<std::string> files;
};

// A folder's identity, (st_dev, st_ino) of what its path leads to: two paths to one folder
// (symlinks) have the same.
using FolderId = std::pair<dev_t, ino_t>;

// What the walk of the whole root remembers: every folder read so far with the path it was
// read through (the root and every class folder are there from the start: they are read as
// themselves), and the folders on the current branch, which tell a loop from a second way in.
struct WalkState {
  std::map<FolderId, std::string> read;
  std::set<FolderId> branch;
  std::vector<std::string> warnings;
  std::map<std::string, int64_t> unread;  // image files of kinds tandem does not decode, by kind
  std::string first_unread;               // the first of them by path
};

// "5 .webp, 3 .bmp": the unread files by kind, the commonest first.
std::string describe_unread(const std::map<std::string, int64_t>& unread) {
  std::vector<std::pair<std::string, int64_t>> kinds(unread.begin(), unread.end());
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string text;
  for (const auto& [ext, n] : kinds)
    text += (text.empty() ? "" : ", ") + std::to_string(n) + " " + ext;
  return text;
}

// os.walk(dir, followlinks=True), except that a folder is read once: a subfolder that leads to
// a folder already read (a symlink loop, or a second link to one folder) is skipped with one
// warning naming it, so no file is counted twice. Subfolders are entered in name order, so
// which of two links is read is fixed.
void walk(const std::string& dir, WalkState& state, std::vector<WalkedFolder>& out) {
  WalkedFolder folder{dir, {}};
  std::vector<fs::DirEntry> subfolders;
  for (fs::DirEntry& entry : fs::list_dir(dir, kWho)) {
    if (entry.is_folder())
      subfolders.push_back(std::move(entry));
    else if (detail::has_image_extension(entry.name))  // broken links and FIFOs count too:
      folder.files.push_back(entry.name);  // the load names them (read_file never blocks)
    else if (const std::string ext = detail::lower_extension(entry.name);
             detail::is_unread_image_extension(ext)) {
      const std::string path = fs::join_path(dir, entry.name);
      if (state.first_unread.empty() || path < state.first_unread) state.first_unread = path;
      ++state.unread[ext];
    }
  }
  std::sort(folder.files.begin(), folder.files.end());
  out.push_back(std::move(folder));
  std::sort(subfolders.begin(), subfolders.end(),
            [](const fs::DirEntry& a, const fs::DirEntry& b) { return a.name < b.name; });
  for (const fs::DirEntry& sub : subfolders) {
    const std::string path = fs::join_path(dir, sub.name);
    const FolderId id{sub.device, sub.inode};
    const auto [first, fresh] = state.read.emplace(id, path);
    if (!fresh) {
      state.warnings.push_back(
          state.branch.count(id) != 0
              ? tandem::detail::concat("skipped '", path, "': a symlink loop back to '",
                                       first->second, "'")
              : tandem::detail::concat("skipped '", path, "': it leads to '", first->second,
                                       "', which is read there (its files count once)"));
      continue;
    }
    state.branch.insert(id);
    walk(path, state, out);
    state.branch.erase(id);
  }
}

std::string join(const std::vector<std::string>& names, const char* separator) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i > 0 ? separator : "") + names[i];
  return text;
}

// InvalidArgument unless kCenterRegion's Resize side `resize` is 0 (ImageNet's ratio) or at
// least the center crop's `image_size`.
void check_resize_size(int64_t resize, int64_t image_size) {
  TANDEM_CHECK_ARG(resize == 0 || resize >= image_size, "ImageFolder: resize size ", resize,
                   " is smaller than the center crop's ", image_size,
                   ": expected 0 (ImageNet's ratio) or at least the image size");
}

// Whether `output`'s samples are regions decoded for a box chosen in the worker (with a
// "crop_box" field).
bool is_region(ImageFolderOutput output) {
  return output == ImageFolderOutput::kCropRegion || output == ImageFolderOutput::kCenterRegion;
}

// InvalidArgument where a split (`split`: there is one) is asked of an output whose samples
// cannot be split between the workers and the JPEG engines.
void check_split_output(bool split, ImageFolderOutput output) {
  TANDEM_CHECK_ARG(!split || is_region(output) || output == ImageFolderOutput::kDecoded,
                   "ImageFolder: an engine share needs crop regions or decoded images "
                   "(kCropRegion, kCenterRegion, kDecoded)");
}

// The split of a fixed `share` for `output` (null for 0); InvalidArgument outside [0, 1] or for
// an output that does not split (check_split_output).
std::shared_ptr<EngineShare> fixed_engine_share(double share, ImageFolderOutput output) {
  TANDEM_CHECK_ARG(share >= 0 && share <= 1, "ImageFolder: engine share ", share,
                   " is not valid: expected 0 to 1");
  check_split_output(share > 0, output);
  return share > 0 ? std::make_shared<EngineShare>(share) : nullptr;
}
}  // namespace

ImageFolderDataset::ImageFolderDataset(std::string root, ImageFolderOptions options)
    : root_(std::move(root)), options_(options) {
  TANDEM_CHECK_ARG(options_.image_size >= 1, "ImageFolder: image_size must be >= 1, got ",
                   options_.image_size);
  TANDEM_CHECK_ARG(options_.channels == 1 || options_.channels == 3,
                   "ImageFolder: channels must be 1 or 3, got ", options_.channels);
  check_resize_size(options_.resize_size, options_.image_size);
  engine_share_ = fixed_engine_share(options_.engine_share, options_.output);
  const fs::PathStatus status = fs::path_status(root_);
  TANDEM_CHECK_ARG(status.exists, "ImageFolder: root '", root_, "' does not exist (",
                   fs::errno_text(status.error), ")");
  TANDEM_CHECK_ARG(status.is_directory, "ImageFolder: root '", root_,
                   "' is not a folder (expected one subfolder of images per class)");
  // Read as classes, a segmentation set's masks would be resized as photos and trained on as a
  // class of their own: every front end that reads an ImageFolder refuses it here.
  TANDEM_CHECK_ARG(!is_image_mask_pairs_folder(root_), "ImageFolder: '", root_,
                   "' holds images/ and masks/ (image + mask pairs), which an ImageFolder would "
                   "read as two classes: read it as pairs (tandem train --data DIR --classes N, "
                   "tandem.data.ImageMaskPairs)");

  // find_classes: the subfolders of root (symlinks followed), sorted by name.
  std::vector<fs::DirEntry> class_entries;
  for (fs::DirEntry& entry : fs::list_dir(root_, kWho))
    if (entry.is_folder()) class_entries.push_back(std::move(entry));
  TANDEM_CHECK_ARG(!class_entries.empty(), "ImageFolder: found no class folder in '", root_,
                   "' (expected one subfolder of images per class)");
  std::sort(class_entries.begin(), class_entries.end(),
            [](const fs::DirEntry& a, const fs::DirEntry& b) { return a.name < b.name; });

  // The root and every class folder are read as themselves: a link back to one from below is a
  // loop or a second way in, never a second copy of its files under another class.
  WalkState state;
  state.read.emplace(FolderId{status.device, status.inode}, root_);
  std::vector<size_t> alias_of(class_entries.size());  // the first class with the same folder
  for (size_t label = 0; label < class_entries.size(); ++label) {
    const fs::DirEntry& entry = class_entries[label];
    classes_.push_back(entry.name);
    const auto [first, fresh] =
        state.read.emplace(FolderId{entry.device, entry.inode}, fs::join_path(root_, entry.name));
    alias_of[label] = label;
    if (fresh) continue;
    for (size_t k = 0; k < label && alias_of[label] == label; ++k)
      if (FolderId{class_entries[k].device, class_entries[k].inode} == first->first)
        alias_of[label] = k;
    state.warnings.push_back(
        tandem::detail::concat("class folders '", classes_[alias_of[label]], "' and '", entry.name,
                               "' are one folder: its files count in both classes"));
  }

  // make_dataset: per class, the folders of sorted(os.walk(...)) — ordered by path string —
  // and in each the files sorted by name. A class whose folder is an earlier class's (a
  // symlink) gets that class's files under its own name, as torchvision would.
  std::vector<std::string> empty_classes;
  std::vector<std::pair<size_t, size_t>> class_range(classes_.size());  // [begin, end) in samples_
  for (size_t label = 0; label < classes_.size(); ++label) {
    const std::string dir = fs::join_path(root_, classes_[label]);
    const size_t before = samples_.size();
    if (alias_of[label] != label) {
      const std::string original = fs::join_path(root_, classes_[alias_of[label]]);
      const auto [begin, end] = class_range[alias_of[label]];
      for (size_t i = begin; i < end; ++i)
        samples_.push_back(
            {dir + samples_[i].path.substr(original.size()), static_cast<int64_t>(label)});
    } else {
      std::vector<WalkedFolder> folders;
      const FolderId id{class_entries[label].device, class_entries[label].inode};
      state.branch = {FolderId{status.device, status.inode}, id};
      walk(dir, state, folders);
      std::sort(folders.begin(), folders.end(),
                [](const WalkedFolder& a, const WalkedFolder& b) { return a.path < b.path; });
      for (const WalkedFolder& folder : folders)
        for (const std::string& file : folder.files)
          samples_.push_back({fs::join_path(folder.path, file), static_cast<int64_t>(label)});
    }
    class_range[label] = {before, samples_.size()};
    if (samples_.size() == before) empty_classes.push_back(classes_[label]);
  }
  const std::string unread = describe_unread(state.unread);
  TANDEM_CHECK_ARG(empty_classes.empty(), "ImageFolder '", root_,
                   "': found no valid file for the classes ", join(empty_classes, ", "),
                   ". Supported extensions are: .jpg, .jpeg, .png (any letter case)",
                   unread.empty() ? "" : "; the folder's " + unread + " files are not read");
  if (!unread.empty()) {
    int64_t files = 0;
    for (const auto& kind : state.unread) files += kind.second;
    // Torchvision's ImageFolder would train on most of these: a run here must not be smaller
    // without a word.
    state.warnings.push_back(tandem::detail::concat(
        "left out ", files, " image file(s) of kinds tandem does not decode (", unread,
        "; the first by name: '", state.first_unread,
        "'): it reads JPEG and PNG, so convert them (to JPEG) to train on them"));
  }
  for (std::string& warning : state.warnings) {
    warning = "ImageFolder '" + root_ + "': " + warning;
    std::cerr << "warning: " << warning << "\n";
  }
  warnings_ = std::move(state.warnings);
}

std::vector<FieldSpec> ImageFolderDataset::fields() const {
  const int64_t s = options_.image_size;
  if (options_.output == ImageFolderOutput::kEncoded)  // typical: a 4:2:0 JPEG of 2S x 2S
    return {{"jpeg", {s * s}, at::kByte, true, true}, {"label", {}, at::kLong}};
  if (options_.output == ImageFolderOutput::kDecoded && engine_share_)
    return {{"image", {3 * s / 2, 3 * s / 2, options_.channels}, at::kByte, true},
            {"jpeg", {s * s}, at::kByte, true, true},
            {"label", {}, at::kLong}};
  if (options_.output == ImageFolderOutput::kDecoded)  // typical: between S and 2S a side
    return {{"image", {3 * s / 2, 3 * s / 2, options_.channels}, at::kByte, true},
            {"label", {}, at::kLong}};
  const bool region = is_region(options_.output);
  if (region && engine_share_)
    return {{"image", {3 * s / 2, 3 * s / 2, options_.channels}, at::kByte, true},
            {"jpeg", {s * s}, at::kByte, true, true},
            {"crop_box", {kCropBoxFields}, at::kInt},
            {"label", {}, at::kLong}};
  if (region)
    return {{"image", {3 * s / 2, 3 * s / 2, options_.channels}, at::kByte, true},
            {"crop_box", {kCropBoxFields}, at::kInt},
            {"label", {}, at::kLong}};
  return {{"image", {options_.channels, s, s}, at::kByte}, {"label", {}, at::kLong}};
}

std::vector<ImageFolderDataset::Sample> ImageFolderDataset::spread_samples(int64_t n) const {
  const int64_t total = size();
  n = std::min(n, total);
  std::vector<Sample> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(samples_[static_cast<size_t>(i * total / n)]);
  return out;
}

ImageFolderDataset ImageFolderDataset::with_output(ImageFolderOutput output) const {
  ImageFolderDataset copy = *this;
  copy.options_.output = output;
  if (output != options_.output) {  // a split is of one output's samples
    copy.options_.engine_share = 0;
    copy.engine_share_.reset();
  }
  return copy;
}

ImageFolderDataset ImageFolderDataset::with_image_size(int64_t size) const {
  TANDEM_CHECK_ARG(size >= 1, "ImageFolder: image size ", size, " is not valid: expected >= 1");
  check_resize_size(options_.resize_size, size);
  ImageFolderDataset copy = *this;
  copy.options_.image_size = size;
  return copy;
}

ImageFolderDataset ImageFolderDataset::with_resize_size(int64_t size) const {
  check_resize_size(size, options_.image_size);
  ImageFolderDataset copy = *this;
  copy.options_.resize_size = size;
  return copy;
}

ImageFolderDataset ImageFolderDataset::with_engine_share(double share) const {
  ImageFolderDataset copy = *this;
  copy.engine_share_ = fixed_engine_share(share, options_.output);
  copy.options_.engine_share = share;
  return copy;
}

ImageFolderDataset ImageFolderDataset::with_engine_share(std::shared_ptr<EngineShare> share) const {
  check_split_output(share != nullptr, options_.output);
  ImageFolderDataset copy = *this;
  copy.options_.engine_share = share ? share->share() : 0;
  copy.engine_share_ = std::move(share);
  return copy;
}

std::string ImageFolderDataset::sample_source(int64_t index) const {
  return index >= 0 && index < size() ? samples_[static_cast<size_t>(index)].path : "";
}

void ImageFolderDataset::get(int64_t index, const std::vector<at::Tensor>& out) const {
  TANDEM_CHECK_ARG(options_.output == ImageFolderOutput::kCenterCrop,
                   "ImageFolder: samples decoded at their own size have no fixed shape: read "
                   "them with get_sample()");
  std::vector<at::Tensor> views = out;
  get_sample(index, views);
}

at::Tensor decode_drawn_crop(const std::vector<uint8_t>& bytes, const std::string& path,
                             int64_t channels, int64_t size, const SampleDraw& draw, int32_t* box) {
  const ImageInfo info = read_image_info(bytes, path);  // names a bad file
  draw_crop_box(ResizedCropSpec::train(size), info.height, info.width, draw, box);
  const DecodedRegion region = decode_image_region(
      bytes, path, channels, PixelBox{box[0], box[1], box[2], box[3]}, size, size);
  place_crop_box(box, region.top, region.left, region.height, region.width, region.image.size(0),
                 region.image.size(1));
  return region.image;
}

namespace {
// Where the field of a box row is (resized_crop.h's order).
enum BoxField { kTop, kLeft, kHeight, kWidth, kResizedH, kResizedW, kOffsetY, kOffsetX };

// One axis of the margined center crop in the full-resolution pixels: Resize's scale kept,
// `margin` resized pixels either side of the crop where the resized image has them.
struct CenterSpan {
  double start, length;  // full-resolution pixels, fractional
  int32_t resized, offset;
};
CenterSpan center_span(int64_t source, int32_t resized, int32_t offset, int64_t out) {
  constexpr int64_t kMargin = 2;  // > the resample's reach (one resized pixel), eighths rounding
  const int64_t m =
      std::max<int64_t>(0, std::min<int64_t>({kMargin, offset, resized - out - offset}));
  const double scale = static_cast<double>(source) / resized;
  return {static_cast<double>(offset - m) * scale, static_cast<double>(out + 2 * m) * scale,
          static_cast<int32_t>(out + 2 * m), static_cast<int32_t>(m)};
}
}  // namespace

at::Tensor decode_center_crop(const std::vector<uint8_t>& bytes, const std::string& path,
                              int64_t channels, int64_t size, int64_t resize_size, int32_t* box) {
  const ImageInfo info = read_image_info(bytes, path);  // names a bad file
  // The whole image resized, the crop at its center (torchvision's geometry; draws nothing).
  draw_crop_box(ResizedCropSpec::eval(size, resize_size), info.height, info.width, SampleDraw{},
                box);
  // The crop with its margin, as a box of its own resized to itself: the same scale, and the
  // crop's taps never reach the box's edges, where the resample would clamp them.
  const CenterSpan y = center_span(info.height, box[kResizedH], box[kOffsetY], size);
  const CenterSpan x = center_span(info.width, box[kResizedW], box[kOffsetX], size);
  const auto top = static_cast<int64_t>(std::floor(y.start)),
             left = static_cast<int64_t>(std::floor(x.start));
  const int64_t bottom = std::min<int64_t>(info.height, std::ceil(y.start + y.length)),
                right = std::min<int64_t>(info.width, std::ceil(x.start + x.length));
  // One more pixel than the resize asks, so the whole-pixel box's scale never enlarges the
  // fractional one.
  const DecodedRegion region =
      decode_image_region(bytes, path, channels, PixelBox{top, left, bottom - top, right - left},
                          y.resized + 1, x.resized + 1);
  const double denom = region.scale_denom;
  box[kResizedH] = y.resized;
  box[kResizedW] = x.resized;
  box[kOffsetY] = y.offset;
  box[kOffsetX] = x.offset;
  place_crop_box(box, region.top + (y.start - static_cast<double>(top)) / denom,
                 region.left + (x.start - static_cast<double>(left)) / denom, y.length / denom,
                 x.length / denom, region.image.size(0), region.image.size(1));
  return region.image;
}

namespace {
// samples[index], once the index is in range and `out` holds a tensor per field (`names`, comma-
// separated). `names` is a C string: a std::string argument, a temporary at every call, made
// GCC 13 see a reference that might dangle (-Wdangling-reference) in what is returned.
const ImageFolderDataset::Sample& checked_sample(
    const std::vector<ImageFolderDataset::Sample>& samples, int64_t index,
    const std::vector<at::Tensor>& out, const char* names) {
  const auto n = static_cast<int64_t>(samples.size());
  TANDEM_CHECK_ARG(index >= 0 && index < n, "ImageFolder: sample index ", index,
                   " out of range [0, ", n, ")");
  const size_t fields = static_cast<size_t>(std::count(names, names + std::strlen(names), ',')) + 1;
  TANDEM_CHECK_ARG(out.size() == fields, "ImageFolder: get() needs ", fields, " output tensors (",
                   names, "), got ", out.size());
  return samples[static_cast<size_t>(index)];
}
}  // namespace

double crop_region_cpu_cost(const ResizedCropSpec& spec, const SampleDraw& draw) {
  constexpr int64_t kSide = 1024;
  int32_t box[kCropBoxFields];
  draw_crop_box(spec, kSide, kSide, draw, box);
  return static_cast<double>(box[0] + box[2]) / static_cast<double>(kSide);
}

bool decodes_on_engines(double share, uint64_t position) {
  const auto q = static_cast<uint64_t>(std::llround(std::clamp(share, 0.0, 1.0) * 1024));
  return (position * q) % 1024 + q >= 1024;  // floor((p + 1) q / 1024) > floor(p q / 1024)
}

void ImageFolderDataset::get_drawn_sample(int64_t index, const SampleDraw& draw,
                                          std::vector<at::Tensor>& out) const {
  const bool center = options_.output == ImageFolderOutput::kCenterRegion;
  const bool region = is_region(options_.output);
  EngineShare* const split = engine_share_.get();
  if (!region && !split) return get_sample(index, out);
  const Sample& sample =
      checked_sample(samples_, index, out,
                     region ? (split ? "image, jpeg, crop_box, label" : "image, crop_box, label")
                            : "image, jpeg, label");
  int32_t box[kCropBoxFields];
  // The CPU side's rate, for an adaptive share: the worker's whole time on the sample (its
  // read, and for the engines' samples the copy of their bytes, too), over the samples it
  // decoded — what the workers can supply, not what their decodes alone would.
  const ThreadUsage before = split ? this_thread_usage() : ThreadUsage{};
  const auto started = std::chrono::steady_clock::now();
  const std::vector<uint8_t> bytes = read_file(sample.path);
  at::Tensor jpeg = at::empty({0}, at::kByte);
  bool engines = false;
  if (split && region && !center) {
    const ResizedCropSpec spec = ResizedCropSpec::train(options_.image_size);
    engines = split->on_engines(draw.position, [&](uint64_t position) {
      return crop_region_cpu_cost(spec, SampleDraw{draw.seed, position});
    });
  } else if (split) {
    engines = split->on_engines(draw.position);
  }
  if (engines) {
    // The engines read baseline gray and YCbCr JPEGs; anything else decodes here. (nvJPEG would
    // decode a progressive one too, whole and on the host, on the engines' one thread: here it
    // is one of many.)
    const ImageInfo info = read_image_info(bytes, sample.path);  // names a bad file
    engines = info.format == ImageFormat::kJpeg && info.channels != 4 && !info.progressive;
    // A file cut short fails here, named (and skipped under skip_bad), as the CPU's decode
    // would fail it, rather than the engines' whole batch.
    if (engines && !detail::jpeg_is_complete(bytes.data(), bytes.size()))
      detail::fail(sample.path,
                   "corrupt or truncated JPEG (no end-of-image marker after the image data)");
    if (engines) {
      if (region)  // in the full-resolution pixels the engines decode
        draw_crop_box(center ? ResizedCropSpec::eval(options_.image_size, resize_size())
                             : ResizedCropSpec::train(options_.image_size),
                      info.height, info.width, draw, box);
      jpeg = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
      std::memcpy(jpeg.data_ptr<uint8_t>(), bytes.data(), bytes.size());
      out[0] = at::empty({0, 0, options_.channels}, at::kByte);
    }
  }
  if (!engines)
    out[0] = center ? decode_center_crop(bytes, sample.path, options_.channels, options_.image_size,
                                         resize_size(), box)
             : region ? decode_drawn_crop(bytes, sample.path, options_.channels,
                                          options_.image_size, draw, box)
                      : decode_image_interleaved(bytes, sample.path, options_.channels,
                                                 options_.image_size, options_.image_size);
  if (split)
    split->record_cpu(
        engines ? 0 : 1,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
        this_thread_usage() - before);
  size_t f = 1;
  if (split) out[f++] = jpeg;
  if (region) std::memcpy(out[f++].data_ptr<int32_t>(), box, sizeof(box));
  out[f].fill_(sample.label);
}

void ImageFolderDataset::get_sample(int64_t index, std::vector<at::Tensor>& out) const {
  if (is_region(options_.output))  // a fixed key: the same crop each time
    return get_drawn_sample(index, SampleDraw{0, static_cast<uint64_t>(index)}, out);
  const Sample& sample = checked_sample(samples_, index, out, "image, label");
  const std::vector<uint8_t> bytes = read_file(sample.path);
  if (options_.output == ImageFolderOutput::kEncoded) {
    const ImageInfo info = read_image_info(bytes, sample.path);  // names a bad file
    if (info.format != ImageFormat::kJpeg)
      detail::fail(sample.path, std::string("a ") + format_name(info.format) +
                                    " file: GPU decode reads JPEGs (decode on the CPU instead)");
    if (info.channels == 4)
      detail::fail(sample.path,
                   "a CMYK JPEG: GPU decode reads gray and YCbCr JPEGs (decode on "
                   "the CPU instead)");
    at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::memcpy(t.data_ptr<uint8_t>(), bytes.data(), bytes.size());
    out[0] = t;
  } else if (options_.output == ImageFolderOutput::kDecoded) {
    out[0] = decode_image_interleaved(bytes, sample.path, options_.channels, options_.image_size,
                                      options_.image_size);
  } else {
    const ImageInfo info = read_image_info(bytes, sample.path);
    out[0].copy_(
        detail::load_eval_image(bytes, sample.path, options_.channels, options_.image_size, info));
  }
  out[1].fill_(sample.label);
}

}  // namespace tandem::data
