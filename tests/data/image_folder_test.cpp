// ImageFolderDataset: torchvision's classes, labels and order; the decoded, resized and cropped
// samples; the loader on top; every bad folder and bad file.
#include "tandem/data/image_folder.h"

#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <gtest/gtest.h>

#include <memory>

#include "fixtures.h"
#include "tandem/data/decode.h"
#include "tandem/data/resize.h"
#include "tandem/error.h"
#include "tandem/loader.h"

namespace tandem::data {
namespace {

using testing::put;
using testing::smooth_image;
using testing::TempDir;

// Three classes whose byte order differs from a case-insensitive one (Zebra < cat < dog), mixed
// extensions and letter cases, a nested folder, and files that are not images.
void make_tree(const TempDir& dir) {
  put(dir, "root/cat/b.JPG", encode_jpeg(smooth_image(3, 80, 100, 1), 90));
  put(dir, "root/cat/a.png", encode_png(smooth_image(3, 30, 20, 2)));
  put(dir, "root/cat/sub/c.jpeg", encode_jpeg(smooth_image(1, 40, 40, 3), 90));
  put(dir, "root/cat/notes.txt", {'h', 'i'});
  put(dir, "root/cat/z.gif", {'G', 'I', 'F'});
  put(dir, "root/dog/x.jpg", encode_jpeg(smooth_image(3, 64, 48, 4), 90));
  put(dir, "root/Zebra/z.PNG", encode_png(smooth_image(1, 33, 35, 5)));
  put(dir, "root/readme.md", {'#'});  // a file in root is not a class
}

std::vector<std::string> relative_paths(const ImageFolderDataset& ds, const TempDir& dir) {
  std::vector<std::string> out;
  for (const auto& s : ds.samples())
    out.push_back(s.path.substr(testing::join(dir.path(), "root/").size()) + ":" +
                  std::to_string(s.label));
  return out;
}

std::vector<at::Tensor> slot_for(const Dataset& ds) {
  std::vector<at::Tensor> out;
  for (const FieldSpec& f : ds.fields()) out.push_back(at::full(f.shape, 0, f.dtype));
  return out;
}

template <typename F>
void expect_invalid(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(ImageFolderTest, ClassesLabelsAndOrderAreTorchvisions) {
  TempDir dir;
  make_tree(dir);
  const ImageFolderDataset ds(testing::join(dir.path(), "root"));
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"Zebra", "cat", "dog"}));
  EXPECT_EQ(relative_paths(ds, dir),
            (std::vector<std::string>{"Zebra/z.PNG:0", "cat/a.png:1", "cat/b.JPG:1",
                                      "cat/sub/c.jpeg:1", "dog/x.jpg:2"}));
  EXPECT_EQ(ds.size(), 5);
  const auto fields = ds.fields();
  ASSERT_EQ(fields.size(), 2u);
  EXPECT_EQ(fields[0].name, "image");
  EXPECT_EQ(fields[0].shape, (std::vector<int64_t>{3, 224, 224}));
  EXPECT_EQ(fields[0].dtype, at::kByte);
  EXPECT_EQ(fields[1].name, "label");
  EXPECT_TRUE(fields[1].shape.empty());
  EXPECT_EQ(fields[1].dtype, at::kLong);
}

TEST(ImageFolderTest, WalkOrderIsByFolderPathThenFileName) {
  // sorted(os.walk(...)): folders ordered by their path string — "c" < "c/a" < "c/a-b" <
  // "c/a/b", since '-' (0x2d) sorts before '/' (0x2f) — and files by name inside each.
  TempDir dir;
  const auto png = encode_png(smooth_image(3, 4, 4));
  for (const char* f :
       {"root/c/z.png", "root/c/a/y.png", "root/c/a-b/x.png", "root/c/a/b/w.png", "root/c/a/a.png"})
    put(dir, f, png);
  const ImageFolderDataset ds(testing::join(dir.path(), "root"), {8, 3});
  EXPECT_EQ(relative_paths(ds, dir),
            (std::vector<std::string>{"c/z.png:0", "c/a/a.png:0", "c/a/y.png:0", "c/a-b/x.png:0",
                                      "c/a/b/w.png:0"}));
}

TEST(ImageFolderTest, SymlinkedFoldersAreFollowedButCyclesAreNotReentered) {
  TempDir dir;
  make_tree(dir);
  ASSERT_EQ(::symlink(testing::join(dir.path(), "root/cat").c_str(),
                      testing::join(dir.path(), "root/cat/sub/loop").c_str()),
            0);
  ASSERT_EQ(::symlink(testing::join(dir.path(), "root/dog").c_str(),
                      testing::join(dir.path(), "root/puppy").c_str()),
            0);
  const ImageFolderDataset ds(testing::join(dir.path(), "root"));
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"Zebra", "cat", "dog", "puppy"}));
  EXPECT_EQ(relative_paths(ds, dir),
            (std::vector<std::string>{"Zebra/z.PNG:0", "cat/a.png:1", "cat/b.JPG:1",
                                      "cat/sub/c.jpeg:1", "dog/x.jpg:2", "puppy/x.jpg:3"}));
  // One warning each: the loop, the class folder that is another class's, and cat's GIF (read
  // once: the loop is not entered).
  ASSERT_EQ(ds.warnings().size(), 3u);
  EXPECT_NE(ds.warnings()[0].find("class folders 'dog' and 'puppy' are one folder"),
            std::string::npos)
      << ds.warnings()[0];
  EXPECT_NE(ds.warnings()[1].find("skipped '" + testing::join(dir.path(), "root/cat/sub/loop") +
                                  "': a symlink loop"),
            std::string::npos)
      << ds.warnings()[1];
  EXPECT_NE(ds.warnings()[2].find("left out 1 image file(s) of kinds tandem does not decode (1 "
                                  ".gif; the first by name: '" +
                                  testing::join(dir.path(), "root/cat/z.gif") + "')"),
            std::string::npos)
      << ds.warnings()[2];
}

// Image files of kinds tandem does not decode (WebP, BMP, TIFF...) are left out, counted and
// named in a warning, since torchvision's ImageFolder would read most of them: a run must not
// train on fewer images without a word. A class with nothing else is refused, naming them.
TEST(ImageFolderTest, ImagesOfKindsNotDecodedAreCountedAndNamed) {
  TempDir dir;
  put(dir, "root/a/x.jpg", encode_jpeg(smooth_image(3, 20, 20, 1), 90));
  put(dir, "root/a/y.webp", {'R', 'I', 'F', 'F'});
  put(dir, "root/a/z.BMP", {'B', 'M'});
  put(dir, "root/a/w.webp", {'R', 'I', 'F', 'F'});
  put(dir, "root/b/sub/v.tiff", {'I', 'I'});
  put(dir, "root/b/u.png", encode_png(smooth_image(3, 20, 20, 2)));
  const ImageFolderDataset ds(testing::join(dir.path(), "root"));
  EXPECT_EQ(relative_paths(ds, dir), (std::vector<std::string>{"a/x.jpg:0", "b/u.png:1"}));
  ASSERT_EQ(ds.warnings().size(), 1u);
  EXPECT_NE(ds.warnings()[0].find("left out 4 image file(s) of kinds tandem does not decode (2 "
                                  ".webp, 1 .bmp, 1 .tiff; the first by name: '" +
                                  testing::join(dir.path(), "root/a/w.webp") +
                                  "'): it reads JPEG and PNG"),
            std::string::npos)
      << ds.warnings()[0];
  put(dir, "root/c/t.webp", {'R', 'I', 'F', 'F'});
  try {
    ImageFolderDataset(testing::join(dir.path(), "root"));
    ADD_FAILURE() << "a class of WebP files only was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("found no valid file for the classes c. Supported "
                                   "extensions are: .jpg, .jpeg, .png (any letter case); "
                                   "the folder's 3 .webp, 1 .bmp, 1 .tiff files are not read"),
        std::string::npos)
        << e.what();
  }
}

// A loop through the root would read another class's files again under this class, and two
// links to one folder would read its files twice: each is skipped with one warning naming it.
TEST(ImageFolderTest, SymlinkLoopsAndSecondLinksAreSkippedOnceWithAWarning) {
  TempDir dir;
  const auto png = encode_png(smooth_image(3, 4, 4));
  for (const char* f : {"root/a/1.png", "root/b/2.png", "elsewhere/3.png"}) put(dir, f, png);
  const std::string root = testing::join(dir.path(), "root");
  const std::string elsewhere = testing::join(dir.path(), "elsewhere");
  const std::string up = testing::join(root, "a/up"), again = testing::join(root, "a/y"),
                    other = testing::join(root, "b/z");
  ASSERT_EQ(::symlink(root.c_str(), up.c_str()), 0);  // a/up -> root: a loop
  ASSERT_EQ(::symlink(elsewhere.c_str(), testing::join(root, "a/x").c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), again.c_str()), 0);  // a second way in
  ASSERT_EQ(::symlink(elsewhere.c_str(), other.c_str()), 0);  // and a third, in class b
  const ImageFolderDataset ds(root);
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(relative_paths(ds, dir),
            (std::vector<std::string>{"a/1.png:0", "a/x/3.png:0", "b/2.png:1"}));
  ASSERT_EQ(ds.warnings().size(), 3u);
  EXPECT_NE(ds.warnings()[0].find("skipped '" + up + "': a symlink loop back to '" + root + "'"),
            std::string::npos)
      << ds.warnings()[0];
  for (int k : {1, 2}) {
    const std::string& warning = ds.warnings()[k];
    EXPECT_NE(warning.find("skipped '" + (k == 1 ? again : other) + "': it leads to '" +
                           testing::join(root, "a/x") + "'"),
              std::string::npos)
        << warning;
    EXPECT_EQ(warning.find('\n'), std::string::npos);
  }
}

TEST(ImageFolderTest, SamplesAreDecodedResizedAndCenterCropped) {
  TempDir dir;
  make_tree(dir);
  const ImageFolderDataset ds(testing::join(dir.path(), "root"), {32, 3});
  auto out = slot_for(ds);
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto& sample = ds.samples()[i];
    ds.get(i, out);
    // The reference: full geometry from the header, decode at the covering scale, resize, crop.
    const auto bytes = read_file(sample.path);
    const ImageInfo info = read_image_info(bytes, sample.path);
    const auto target = resized_shape(info.height, info.width, 32);
    const at::Tensor ref =
        center_crop(resize_bilinear(decode_image(bytes, sample.path, 3, target[0], target[1]),
                                    target[0], target[1]),
                    32);
    EXPECT_TRUE(out[0].equal(ref)) << sample.path;
    EXPECT_EQ(out[1].item<int64_t>(), sample.label);
  }
  // b.JPG is 100 x 80; Resize(32) wants 40 x 32, so it was decoded at 1/2 (50 x 40), and the
  // result stays close to resizing the full-size decode.
  const auto& b = ds.samples()[2];
  ASSERT_NE(b.path.find("b.JPG"), std::string::npos);
  ds.get(2, out);
  const at::Tensor full_ref = resize_center_crop(decode_image(read_file(b.path), b.path, 3), 32);
  EXPECT_LT(out[0].to(at::kFloat).sub(full_ref.to(at::kFloat)).abs().mean().item<double>(), 2.0);

  const ImageFolderDataset gray(testing::join(dir.path(), "root"), {16, 1});
  EXPECT_EQ(gray.fields()[0].shape, (std::vector<int64_t>{1, 16, 16}));
  auto gray_out = slot_for(gray);
  gray.get(1, gray_out);
  EXPECT_GT(gray_out[0].to(at::kInt).max().item<int>(), 0);
}

TEST(ImageFolderTest, FeedsTheLoaderFromManyWorkers) {
  TempDir dir;
  make_tree(dir);
  auto ds = std::make_shared<ImageFolderDataset>(testing::join(dir.path(), "root"),
                                                 ImageFolderOptions{24, 3});
  LoaderOptions options;
  options.batch_size = 1;
  options.workers = 3;
  options.depth = 5;
  options.pin_memory = false;
  Loader loader(ds, options);
  auto reference = slot_for(*ds);
  int64_t seen = 0;
  while (auto batch = loader.next()) {
    ASSERT_EQ(batch->fields.size(), 2u);
    const int64_t index = batch->indices[0];
    ds->get(index, reference);
    EXPECT_TRUE(batch->fields[0][0].equal(reference[0]));
    EXPECT_EQ(batch->fields[1][0].item<int64_t>(), ds->samples()[index].label);
    loader.release(*batch);
    ++seen;
  }
  EXPECT_EQ(seen, ds->size());
}

TEST(ImageFolderTest, BadFoldersAreRejectedAtConstruction) {
  TempDir dir;
  const std::string missing = testing::join(dir.path(), "nope");
  expect_invalid([&] { ImageFolderDataset ds(missing); }, {missing, "does not exist"});
  const std::string file = put(dir, "file.jpg", encode_jpeg(smooth_image(3, 8, 8), 90));
  expect_invalid([&] { ImageFolderDataset ds(file); }, {file, "not a folder"});
  testing::make_dirs(testing::join(dir.path(), "empty"));
  put(dir, "empty/loose.jpg", encode_jpeg(smooth_image(3, 8, 8), 90));
  expect_invalid([&] { ImageFolderDataset ds(testing::join(dir.path(), "empty")); },
                 {"found no class folder"});
  // Two class folders with no image (one empty, one with only a text file and an empty subfolder).
  put(dir, "some/good/a.jpg", encode_jpeg(smooth_image(3, 8, 8), 90));
  testing::make_dirs(testing::join(dir.path(), "some/bare"));
  put(dir, "some/text/readme.txt", {'x'});
  testing::make_dirs(testing::join(dir.path(), "some/text/deeper"));
  expect_invalid([&] { ImageFolderDataset ds(testing::join(dir.path(), "some")); },
                 {"found no valid file for the classes bare, text", ".jpg, .jpeg, .png"});
  expect_invalid(
      [&] {
        ImageFolderDataset ds(testing::join(dir.path(), "some"), {0, 3});
      },
      {"image_size"});
  expect_invalid(
      [&] {
        ImageFolderDataset ds(testing::join(dir.path(), "some"), {8, 4});
      },
      {"channels"});
}

TEST(ImageFolderTest, BadFilesFailInGetNamingTheFile) {
  TempDir dir;
  const auto good = encode_jpeg(smooth_image(3, 40, 40, 1), 90);
  const std::string root = testing::join(dir.path(), "root");
  put(dir, "root/a/0_good.jpg", good);
  const std::string empty = put(dir, "root/a/1_empty.jpg", {});
  const std::string text = put(dir, "root/a/2_text.png", {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i'});
  const std::string truncated =
      put(dir, "root/a/3_truncated.jpg", {good.begin(), good.begin() + good.size() / 2});
  std::vector<uint8_t> corrupt = good;
  for (size_t i = 3; i < 120; ++i) corrupt[i] = static_cast<uint8_t>(i * 31);
  const std::string bad = put(dir, "root/a/4_corrupt.jpeg", corrupt);
  // A PNG with a .jpg name is fine: the content decides.
  put(dir, "root/a/5_png_named.jpg", encode_png(smooth_image(3, 20, 30, 2)));
  const std::string dangling = testing::join(dir.path(), "root/a/6_dangling.jpg");
  ASSERT_EQ(::symlink(testing::join(dir.path(), "root/a/nowhere.jpg").c_str(), dangling.c_str()),
            0);

  const ImageFolderDataset ds(root, {16, 3});
  ASSERT_EQ(ds.size(), 7);
  auto out = slot_for(ds);
  EXPECT_NO_THROW(ds.get(0, out));
  EXPECT_NO_THROW(ds.get(5, out));
  const std::vector<std::pair<std::string, std::string>> bad_files = {
      {empty, "empty file"},
      {text, "not a JPEG or PNG"},
      {truncated, "corrupt or truncated JPEG"},
      {bad, "JPEG"},
      {dangling, "No such file or directory"}};
  for (size_t k = 0; k < bad_files.size(); ++k) {
    try {
      ds.get(static_cast<int64_t>(k) + (k < 4 ? 1 : 2), out);
      ADD_FAILURE() << "no error for " << bad_files[k].first;
    } catch (const InvalidArgument& e) {
      ADD_FAILURE() << e.what();
    } catch (const Error& e) {
      testing::expect_one_line_naming(e.what(), bad_files[k].first, bad_files[k].second);
    }
  }
  EXPECT_THROW(ds.get(7, out), InvalidArgument);

  // Through the loader: the run stops with a LoaderError naming the sample and the file.
  auto shared = std::make_shared<ImageFolderDataset>(root, ImageFolderOptions{16, 3});
  LoaderOptions options;
  options.batch_size = 1;
  options.workers = 2;
  options.pin_memory = false;
  Loader loader(shared, options);
  try {
    while (auto batch = loader.next()) loader.release(*batch);
    ADD_FAILURE() << "no LoaderError";
  } catch (const LoaderError& e) {
    EXPECT_NE(std::string(e.what()).find("sample 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(empty), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem::data

namespace tandem::data::testing {
namespace {

// kDecoded: each image at its own size, (H, W, C), at the DCT scale that still covers S; the
// loader packs them. kEncoded: the JPEG's bytes, host-side; a PNG or CMYK JPEG is named.
TEST(ImageFolderTest, DecodedAndEncodedOutputsCarryEachImageAsItIs) {
  TempDir dir;
  const std::string root = join(dir.path(), "root");
  const auto big = encode_jpeg(smooth_image(3, 100, 140, 1), 90);  // >= 2 x 48: decoded at 1/2
  const auto small = encode_jpeg(smooth_image(3, 60, 50, 2), 90);  // < 2 x 48: full size
  put(dir, "root/a/0.jpg", big);
  put(dir, "root/b/1.jpg", small);
  ImageFolderOptions o;
  o.image_size = 48;
  o.output = ImageFolderOutput::kDecoded;
  const ImageFolderDataset decoded(root, o);
  ASSERT_TRUE(decoded.fields()[0].variable_size);
  std::vector<at::Tensor> out{at::Tensor(), at::empty({}, at::kLong)};
  decoded.get_sample(0, out);
  EXPECT_EQ(out[0].sizes(), (std::vector<int64_t>{50, 70, 3}));
  EXPECT_TRUE(at::equal(out[0], decode_image(big, "big", 3, 48, 48).permute({1, 2, 0})));
  out[0] = at::Tensor();
  decoded.get_sample(1, out);
  EXPECT_EQ(out[0].sizes(), (std::vector<int64_t>{60, 50, 3}));
  EXPECT_EQ(out[1].item<int64_t>(), 1);
  std::vector<at::Tensor> fixed{at::empty({50, 70, 3}, at::kByte), at::empty({}, at::kLong)};
  EXPECT_THROW(decoded.get(0, fixed), InvalidArgument);  // no fixed shape to write into

  o.output = ImageFolderOutput::kEncoded;
  const std::string png = put(dir, "root/b/2.png", encode_png(smooth_image(3, 20, 20, 3)));
  const ImageFolderDataset encoded(root, o);
  ASSERT_TRUE(encoded.fields()[0].stays_on_host);
  out[0] = at::Tensor();
  encoded.get_sample(1, out);
  ASSERT_EQ(out[0].numel(), static_cast<int64_t>(small.size()));
  EXPECT_EQ(
      std::vector<uint8_t>(out[0].data_ptr<uint8_t>(), out[0].data_ptr<uint8_t>() + out[0].numel()),
      small);
  out[0] = at::Tensor();
  try {
    encoded.get_sample(2, out);
    ADD_FAILURE() << "no error for a PNG";
  } catch (const Error& e) {
    expect_one_line_naming(e.what(), png, "GPU decode reads JPEGs");
  }
}

}  // namespace
}  // namespace tandem::data::testing
