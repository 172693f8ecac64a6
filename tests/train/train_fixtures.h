// Fixtures the train tests share: a small learnable IDX folder written at run time, the job and
// run options over it, and comparisons of two runs' weights and metrics.jsonl rows.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../data/fixtures.h"
#include "tandem/models/safetensors.h"
#include "tandem/optim.h"
#include "tandem/train/classifier.h"
#include "tandem/train/trainer.h"

namespace tandem::train::fixtures {

using data::testing::TempDir;

inline void put_be32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

// IDX files of n learnable 28x28 images: class c is a bright bar on rows 2c+2..2c+4 over a
// noisy background (seeded), so a small CNN learns it within an epoch.
inline void write_idx(const std::string& dir, const std::string& prefix, int n, int classes,
                      uint32_t seed) {
  std::vector<uint8_t> images, labels;
  put_be32(images, 0x803);
  put_be32(images, static_cast<uint32_t>(n));
  put_be32(images, 28);
  put_be32(images, 28);
  put_be32(labels, 0x801);
  put_be32(labels, static_cast<uint32_t>(n));
  uint32_t state = seed * 2654435761u + 1;
  auto rnd = [&]() { return (state = state * 1664525u + 1013904223u) >> 24; };
  for (int i = 0; i < n; ++i) {
    const int c = static_cast<int>(rnd() % static_cast<uint32_t>(classes));
    labels.push_back(static_cast<uint8_t>(c));
    for (int y = 0; y < 28; ++y)
      for (int x = 0; x < 28; ++x) {
        const bool bar = y >= 2 * c + 2 && y <= 2 * c + 4;
        images.push_back(static_cast<uint8_t>((bar ? 160 : 0) + rnd() % 90));
      }
  }
  data::testing::make_dirs(dir);
  data::write_file(dir + "/" + prefix + "-images-idx3-ubyte", images);
  data::write_file(dir + "/" + prefix + "-labels-idx1-ubyte", labels);
}

// tmp/idx: 96 training images (6 steps of 16 an epoch) and 40 test images, 4 classes.
struct Fixture {
  TempDir tmp;
  std::string data;
  static constexpr int64_t val_images = 40;  // the t10k files': what an evaluation scores
  Fixture() : data(tmp.path() + "/idx") {
    write_idx(data, "train", 96, 4, 1);
    write_idx(data, "t10k", val_images, 4, 2);
  }
};

inline ClassifierOptions small_job(const std::string& data) {
  ClassifierOptions c;
  c.data = data;
  c.batch_size = 16;
  c.workers = 2;  // as options()'s: the Trainer refuses a job built for another run
  c.seed = 7;
  return c;
}

inline TrainOptions options(const std::string& out, Mode mode, int64_t epochs = 2) {
  TrainOptions o;
  o.epochs = epochs;
  o.batch_size = 16;
  o.mode = mode;
  o.workers = 2;
  o.seed = 3;
  o.out_dir = out;
  o.schedule = optim::cosine(1e-3, epochs * 6);
  return o;
}

// Bitwise equality of two weight files' tensors.
inline void expect_same_weights(const std::string& a, const std::string& b) {
  const auto ta = models::load_safetensors(a), tb = models::load_safetensors(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_EQ(ta[i].first, tb[i].first);
    EXPECT_TRUE(at::equal(ta[i].second, tb[i].second)) << "tensor " << ta[i].first << " differs";
  }
}

// RUN_DIR/metrics.jsonl's rows.
inline std::vector<nlohmann::json> metrics_rows(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// Two runs' metrics.jsonl rows are equal but for the time fields and the resume marker: every
// loss and metric bitwise (JSON numbers compare as doubles).
inline void expect_same_rows(const std::string& run_a, const std::string& run_b) {
  std::vector<nlohmann::json> a = metrics_rows(run_a), b = metrics_rows(run_b);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); ++i) {
    for (auto* row : {&a[i], &b[i]})
      for (const char* k : {"images_per_s", "epoch_images_per_s", "train_seconds", "eval_seconds",
                            "eval_images_per_s", "resumed_at_step"})
        row->erase(k);
    EXPECT_EQ(a[i], b[i]) << "row " << i;
  }
}

}  // namespace tandem::train::fixtures
