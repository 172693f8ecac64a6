// The Trainer's resume on the CPU: exact in its losses, weights and records (metrics.jsonl rows
// equal to an uninterrupted run's but for the time fields and the resume marker) after a stop or
// a kill -9 inside an epoch; its data known by content, not by spelling; a damaged newest
// checkpoint skipped with the reason; a run folder without a checkpoint restartable; and
// refusals that say what differs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tandem/error.h"
#include "tandem/train/checkpoint.h"
#include "train_fixtures.h"

extern char** environ;

namespace tandem::train {
namespace {

using data::testing::TempDir;
using fixtures::expect_same_rows;
using fixtures::expect_same_weights;
using fixtures::Fixture;
using fixtures::metrics_rows;
using fixtures::options;
using fixtures::small_job;
using fixtures::write_idx;

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  data::write_file(path, std::vector<uint8_t>(text.begin(), text.end()));
}

// Changes the working folder for a scope: a relative --data is spelled against it.
class InFolder {
 public:
  explicit InFolder(const std::string& dir) {
    char buf[4096];
    was_ = ::getcwd(buf, sizeof buf) ? buf : "/";
    EXPECT_EQ(::chdir(dir.c_str()), 0) << dir;
  }
  ~InFolder() {
    if (::chdir(was_.c_str()) != 0) ADD_FAILURE() << "could not go back to " << was_;
  }

 private:
  std::string was_;
};

// Train 2 epochs straight; then 2 epochs as: stop at `stop_step`, resume, finish. The resumed
// run's losses are the straight run's from that step on, its final weights are equal, and so
// are its metrics.jsonl rows (but for times and the marker of an epoch resumed inside).
void check_resume(Mode mode, int64_t stop_step, int64_t checkpoint_every) {
  Fixture f;
  const std::string run_a = f.tmp.path() + "/a", run_b = f.tmp.path() + "/b";
  Trainer straight(make_classifier(small_job(f.data)), options(run_a, mode));
  const TrainResult a = straight.run();
  ASSERT_EQ(a.losses.size(), 12u);  // 96 / 16 = 6 steps an epoch

  std::atomic<int> stop{0};
  TrainOptions first = options(run_b, mode);
  first.stop = &stop;
  first.checkpoint_every = checkpoint_every;
  first.progress_seconds = 0;  // every step
  first.on_progress = [&](const TrainOptions::Progress& p) {
    if (p.step >= stop_step - 1) stop = SIGINT;  // seen before step stop_step
  };
  const TrainResult b1 = Trainer(make_classifier(small_job(f.data)), first).run();
  EXPECT_EQ(b1.stopped_by_signal, SIGINT);
  ASSERT_EQ(b1.steps, stop_step);
  for (int64_t i = 0; i < stop_step; ++i) EXPECT_EQ(b1.losses[i], a.losses[i]) << "step " << i;

  TrainOptions again = options(run_b, mode);
  again.resume = true;
  Trainer resumed(make_classifier(small_job(f.data)), again);
  EXPECT_EQ(resumed.start_step(), stop_step);
  const TrainResult b2 = resumed.run();
  ASSERT_EQ(b2.losses.size(), static_cast<size_t>(12 - stop_step));
  for (size_t i = 0; i < b2.losses.size(); ++i)
    EXPECT_EQ(b2.losses[i], a.losses[static_cast<size_t>(stop_step) + i])
        << "step " << stop_step + static_cast<int64_t>(i);
  expect_same_weights(a.weights, b2.weights);
  ASSERT_EQ(b2.epochs.size(), 2u);  // the first epoch's record came from the checkpoint
  EXPECT_EQ(b2.epochs[1].metrics.at("accuracy"), a.epochs[1].metrics.at("accuracy"));

  // The records: every epoch whole, the one resumed inside marked, its seconds both parts'.
  expect_same_rows(run_a, run_b);
  const std::vector<nlohmann::json> rows = metrics_rows(run_b);
  const int64_t inside = stop_step % 6 != 0 ? stop_step / 6 : -1;  // the row resumed inside
  for (int64_t i = 0; i < static_cast<int64_t>(rows.size()); ++i) {
    EXPECT_EQ(rows[i].value("resumed_at_step", int64_t{-1}), i == inside ? stop_step : -1)
        << rows[i];
    EXPECT_EQ(b2.epochs[i].train_loss, a.epochs[i].train_loss) << "epoch " << i + 1;
  }
  if (inside < 0) return;
  const Checkpoint at_stop = CheckpointStore::load(b1.last_checkpoint);
  const double before = at_stop.state.at("epoch_so_far").at("seconds").get<double>();
  EXPECT_GT(before, 0);
  EXPECT_GT(rows[inside].at("train_seconds").get<double>(), before);
  std::istringstream csv(read_text(run_b + "/metrics.csv"));
  std::string line;
  for (int64_t i = 0; i <= inside + 1; ++i) std::getline(csv, line);
  EXPECT_EQ(line.substr(line.rfind(',')), "," + std::to_string(stop_step)) << line;
}

TEST(TrainerResumeTest, FromAnEpochEndIsBitwiseSerial) { check_resume(Mode::kSerial, 6, 0); }
TEST(TrainerResumeTest, FromMidEpochIsBitwiseSerial) { check_resume(Mode::kSerial, 4, 2); }
TEST(TrainerResumeTest, FromMidEpochIsBitwisePipelined) { check_resume(Mode::kPipelined, 4, 2); }

// A run KillNineMidEpoch starts as a child process, which kills itself (SIGKILL: no handler,
// no flush) in epoch 2, after its checkpoint at step 8.
// An ImageFolder ResNet run with crop regions draws each sample's crop in the loader's workers,
// keyed by the sample's place in the run: stopped inside an epoch and resumed, it draws the same
// crops and repeats the straight run's losses to the bit.
TEST(TrainerResumeTest, AnImageFolderRunResumedMidEpochDrawsTheSameCrops) {
  TempDir tmp;
  for (int i = 0; i < 48; ++i)
    data::testing::put(
        tmp, std::string("folder/") + (i % 2 ? "b" : "a") + "/" + std::to_string(i) + ".jpg",
        data::encode_jpeg(data::testing::smooth_image(3, 40 + 7 * (i % 9), 44 + 5 * (i % 11), i),
                          90));
  auto job = [&] {
    ClassifierOptions c;
    c.data = tmp.path() + "/folder";
    c.model = "resnet18";
    c.image_size = 32;
    c.batch_size = 8;
    c.workers = 2;  // as options()'s
    c.seed = 5;
    c.crop_regions = true;
    return make_classifier(c);
  };
  auto opts = [&](const std::string& out) {
    TrainOptions o = options(out, Mode::kPipelined);
    o.batch_size = 8;
    return o;
  };
  const TrainResult a = Trainer(job(), opts(tmp.path() + "/a")).run();
  ASSERT_EQ(a.losses.size(), 12u);  // 48 / 8 = 6 steps an epoch
  std::atomic<int> stop{0};
  TrainOptions first = opts(tmp.path() + "/b");
  first.stop = &stop;
  first.checkpoint_every = 2;
  first.progress_seconds = 0;
  first.on_progress = [&](const TrainOptions::Progress& p) {
    if (p.step >= 3) stop = SIGINT;
  };
  const TrainResult b1 = Trainer(job(), first).run();
  ASSERT_EQ(b1.steps, 4);
  TrainOptions again = opts(tmp.path() + "/b");
  again.resume = true;
  const TrainResult b2 = Trainer(job(), again).run();
  ASSERT_EQ(b2.losses.size(), 8u);
  for (size_t i = 0; i < b2.losses.size(); ++i)
    EXPECT_EQ(b2.losses[i], a.losses[4 + i]) << "step " << 4 + i;
  expect_same_weights(a.weights, b2.weights);
}

TEST(TrainerKillChild, TrainsUntilKilled) {
  const char* data = std::getenv("TANDEM_TRAIN_KILL_DATA");
  const char* out = std::getenv("TANDEM_TRAIN_KILL_OUT");
  if (!data || !out) GTEST_SKIP() << "the child of TrainerResumeTest.KillNineMidEpoch*";
  TrainOptions o = options(out, Mode::kPipelined);
  o.checkpoint_every = 2;
  o.progress_seconds = 0;
  o.on_progress = [](const TrainOptions::Progress& p) {
    if (p.step == 9) ::raise(SIGKILL);
  };
  Trainer(make_classifier(small_job(data)), o).run();
  FAIL() << "expected to be killed at step 9";
}

TEST(TrainerResumeTest, KillNineMidEpochThenResumeKeepsTheRecordsAndWeights) {
  Fixture f;
  const std::string run_a = f.tmp.path() + "/a", out = f.tmp.path() + "/b";
  const TrainResult a =
      Trainer(make_classifier(small_job(f.data)), options(run_a, Mode::kPipelined)).run();

  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back("TANDEM_TRAIN_KILL_DATA=" + f.data);
  env.push_back("TANDEM_TRAIN_KILL_OUT=" + out);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string name = "tandem_train_tests", filter = "--gtest_filter=TrainerKillChild.*";
  char* argv[] = {name.data(), filter.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
  EXPECT_EQ(metrics_rows(out).size(), 1u);  // epoch 1's, written before the kill

  TrainOptions again = options(out, Mode::kPipelined);
  again.resume = true;
  Trainer resumed(make_classifier(small_job(f.data)), again);
  EXPECT_EQ(resumed.start_step(), 8);
  const TrainResult b = resumed.run();
  expect_same_weights(a.weights, b.weights);
  expect_same_rows(run_a, out);
  const std::vector<nlohmann::json> rows = metrics_rows(out);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_FALSE(rows[0].contains("resumed_at_step"));
  EXPECT_EQ(rows[1].value("resumed_at_step", int64_t{-1}), 8);
}

// The data is the same folder under any spelling, or the same files anywhere; other files under
// the same spelling (another working folder) are refused, naming what differs.
TEST(TrainerResumeTest, KnowsItsDataByContentNotByPath) {
  Fixture f;  // tmp/idx
  const std::string tmp = f.tmp.path(), out = tmp + "/run";
  TrainOptions o = options(out, Mode::kSerial, 1);
  {
    InFolder in(tmp);
    Trainer(make_classifier(small_job("idx")), o).run();
  }
  o.resume = true;
  auto resume_with = [&](const std::string& data) {
    return Trainer(make_classifier(small_job(data)), o);
  };
  for (const std::string& same : {f.data, tmp + "/alias"}) {
    if (same != f.data) {
      ASSERT_EQ(::symlink(f.data.c_str(), same.c_str()), 0);
    }
    Trainer t = resume_with(same);
    EXPECT_TRUE(t.resumed()) << same;
    EXPECT_EQ(t.start_step(), 6) << same;
    EXPECT_TRUE(t.resume_notes().empty()) << joined(t.resume_notes());
  }
  // The same files in another folder: resumed, saying where they are now.
  write_idx(tmp + "/copy", "train", 96, 4, 1);
  write_idx(tmp + "/copy", "t10k", 40, 4, 2);
  {
    Trainer t = resume_with(tmp + "/copy");
    EXPECT_EQ(t.start_step(), 6);
    ASSERT_EQ(t.resume_notes().size(), 1u);
    EXPECT_EQ(t.resume_notes()[0], "--resume: the data folder is now " +
                                       resolve_path(tmp + "/copy") + ", the checkpoint's was " +
                                       resolve_path(f.data) + ": the same 4 files, resuming");
  }
  // Other images of the same count under the same relative spelling: refused, naming the files.
  write_idx(tmp + "/other/idx", "train", 96, 4, 9);
  write_idx(tmp + "/other/idx", "t10k", 40, 4, 2);
  write_idx(tmp + "/more/idx", "train", 112, 4, 1);
  write_idx(tmp + "/more/idx", "t10k", 40, 4, 2);
  try {
    InFolder in(tmp + "/other");
    resume_with("idx");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("was trained on other data than --data " + resolve_path(tmp + "/other/idx") +
                     " (the checkpoint's: " + resolve_path(f.data) + ")"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("train-images-idx3-ubyte: the same count and size, other file names or "
                     "content; train-labels-idx1-ubyte: the same count and size"),
              std::string::npos)
        << m;
    EXPECT_EQ(m.find("t10k"), std::string::npos) << m;  // the same test files
  }
  try {
    InFolder in(tmp + "/more");
    resume_with("idx");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("train-images-idx3-ubyte: " + std::to_string(16 + 112 * 784) + " bytes now, " +
                     std::to_string(16 + 96 * 784) + " in the checkpoint"),
              std::string::npos)
        << m;
  }
}

// A byte flipped in the newest checkpoint's weights still parses: its checksum finds it, and the
// resume takes the one before, saying so; the run then ends as the uninterrupted one.
TEST(TrainerResumeTest, SkipsADamagedNewestCheckpointSayingWhy) {
  Fixture f;
  const std::string run_a = f.tmp.path() + "/a", out = f.tmp.path() + "/b";
  const TrainResult a =
      Trainer(make_classifier(small_job(f.data)), options(run_a, Mode::kSerial, 1)).run();
  TrainOptions o = options(out, Mode::kSerial, 1);
  o.checkpoint_every = 2;
  Trainer(make_classifier(small_job(f.data)), o).run();  // checkpoints at steps 2, 4 and 6
  const std::string ck = out + "/checkpoints/step-00000000";
  {
    std::fstream file(ck + "6/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-5, std::ios::end);
    const char byte = static_cast<char>(file.get() ^ 0x40);
    file.seekp(-5, std::ios::end);
    file.put(byte);
  }
  EXPECT_NO_THROW(models::load_safetensors(ck + "6/model.safetensors"));
  o.resume = true;
  Trainer t(make_classifier(small_job(f.data)), o);
  EXPECT_EQ(t.start_step(), 4);
  ASSERT_EQ(t.resume_notes().size(), 1u);
  const std::string note = t.resume_notes()[0];
  EXPECT_EQ(note.rfind("--resume: skipped checkpoint " + ck + "6: " + ck +
                           "6/model.safetensors has checksum ",
                       0),
            0u)
      << note;
  EXPECT_NE(note.find("its content is damaged; resuming from " + ck + "4"), std::string::npos)
      << note;
  const TrainResult b = t.run();
  ASSERT_FALSE(b.notes.empty());
  EXPECT_EQ(b.notes[0], note);
  expect_same_weights(a.weights, b.weights);
  expect_same_rows(run_a, out);

  // Every one damaged: refused, each named with its reason (nothing is started over).
  write_text(ck + "2/model.safetensors", "short");
  write_text(ck + "4/state.json", "{");
  write_text(ck + "6/rng.safetensors", "");
  try {
    Trainer(make_classifier(small_job(f.data)), o);
    FAIL() << "expected tandem::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--resume: no checkpoint in " + out + "/checkpoints loads"), std::string::npos)
        << m;
    EXPECT_NE(m.find(ck + "6/rng.safetensors has 0 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find(ck + "4/state.json is not valid JSON"), std::string::npos) << m;
    EXPECT_NE(m.find(ck + "2/model.safetensors has 5 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("move the folder aside to start the run over"), std::string::npos) << m;
  }
}

// A run that failed before its first checkpoint leaves a folder --resume starts over in (the
// weights then are a fresh run's); without --resume the folder is refused, saying how to go on.
TEST(TrainerResumeTest, ARunWithoutACheckpointStartsOverOnResume) {
  Fixture f;
  const std::string run_a = f.tmp.path() + "/a", out = f.tmp.path() + "/b";
  const TrainResult a =
      Trainer(make_classifier(small_job(f.data)), options(run_a, Mode::kSerial, 1)).run();
  data::testing::make_dirs(out + "/checkpoints");
  write_text(out + "/metrics.jsonl", "");
  TrainOptions o = options(out, Mode::kSerial, 1);
  try {
    Trainer(make_classifier(small_job(f.data)), o);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(out + " already exists and is not empty: add --resume to "
                                               "continue it"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("or choose another --out"), std::string::npos) << e.what();
  }
  o.resume = true;
  Trainer t(make_classifier(small_job(f.data)), o);
  EXPECT_FALSE(t.resumed());
  EXPECT_EQ(t.start_step(), 0);
  EXPECT_EQ(joined(t.resume_notes()), "--resume: no checkpoint in " + out +
                                          "/checkpoints: starting the run from step 0 (its "
                                          "metrics files are rewritten)\n");
  const TrainResult b = t.run();
  EXPECT_EQ(b.resumed_from, -1);
  expect_same_weights(a.weights, b.weights);
  expect_same_rows(run_a, out);
  // A folder that does not exist yet: the same, from step 0.
  o.out_dir = f.tmp.path() + "/new";
  Trainer fresh(make_classifier(small_job(f.data)), o);
  EXPECT_FALSE(fresh.resumed());
  EXPECT_EQ(joined(fresh.resume_notes()), "--resume: no checkpoint in " + o.out_dir +
                                              "/checkpoints: starting the run from "
                                              "step 0\n");
}

TEST(TrainerResumeTest, RefusesAnExistingRunFolderWithoutResume) {
  Fixture f;
  const std::string out = f.tmp.path() + "/run";
  data::testing::make_dirs(out);
  data::write_file(out + "/notes.txt", {'h', 'i'});
  try {
    Trainer(make_classifier(small_job(f.data)), options(out, Mode::kSerial));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("add --resume"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_text(out + "/notes.txt"), "hi");  // nothing overwritten
}

TEST(TrainerResumeTest, NeedsACheckpointOfTheSameConfig) {
  Fixture f;
  const std::string out = f.tmp.path() + "/run";
  TrainOptions o = options(out, Mode::kSerial, 1);
  Trainer(make_classifier(small_job(f.data)), o).run();
  o.resume = true;
  ClassifierOptions other = small_job(f.data);
  other.lr = 0.5;
  try {
    Trainer(make_classifier(other), o);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("lr: checkpoint 0.001, now 0.5"), std::string::npos)
        << e.what();
  }
  // A checkpoint of another optimizer.
  ClassifierOptions sgd = small_job(f.data);
  sgd.optimizer = "sgd";
  EXPECT_THROW(Trainer(make_classifier(sgd), o), InvalidArgument);
}

// A checkpoint written before the data fingerprints and the epoch's running sums (format 1, its
// data spelled relative to the working folder) still resumes, exactly in its weights; the notes
// say what could not be checked and that the resumed epoch's record covers only its second part.
TEST(TrainerResumeTest, ResumesAFormat1CheckpointSayingWhatItCannotCheck) {
  Fixture f;
  const std::string run_a = f.tmp.path() + "/a", out = f.tmp.path() + "/b";
  const TrainResult a =
      Trainer(make_classifier(small_job(f.data)), options(run_a, Mode::kSerial, 1)).run();
  std::atomic<int> stop{0};
  TrainOptions o = options(out, Mode::kSerial, 1);
  o.checkpoint_every = 2;
  o.stop = &stop;
  o.progress_seconds = 0;
  o.on_progress = [&](const TrainOptions::Progress& p) {
    if (p.step >= 3) stop = SIGINT;
  };
  ASSERT_EQ(Trainer(make_classifier(small_job(f.data)), o).run().steps, 4);
  const std::string state_path = out + "/checkpoints/step-000000004/state.json";
  nlohmann::json state = nlohmann::json::parse(read_text(state_path));
  for (const char* k : {"format", "files", "data_fingerprints", "epoch_so_far"}) {
    ASSERT_TRUE(state.contains(k)) << k;
    state.erase(k);
  }
  state["config"]["data"] = "idx";
  write_text(state_path, state.dump(2));

  InFolder in(f.tmp.path());
  o.resume = true;
  o.stop = nullptr;
  Trainer t(make_classifier(small_job(f.data)), o);
  EXPECT_EQ(t.start_step(), 4);
  const std::string notes = joined(t.resume_notes());
  EXPECT_NE(notes.find("is of format 1: its data was matched by path only"), std::string::npos)
      << notes;
  EXPECT_NE(notes.find("holds no running sums of epoch 1: its train_loss and train_seconds "
                       "cover steps 4 on only"),
            std::string::npos)
      << notes;
  const TrainResult b = t.run();
  expect_same_weights(a.weights, b.weights);
  ASSERT_EQ(b.epochs.size(), 1u);
  EXPECT_EQ(b.epochs[0].resumed_at_step, 4);
}

// What a resume identifies a folder by: the files a dataset reads (images by extension, IDX by
// name and content), walked in name order, hidden ones and symlink cycles left out.
TEST(DataFingerprintTest, CountsWhatADatasetReadsAndNamesWhatDiffers) {
  TempDir tmp;
  const std::string root = tmp.path() + "/set";
  auto put = [&](const std::string& rel, size_t bytes, uint8_t value = 7) {
    data::testing::put(tmp, "set/" + rel, std::vector<uint8_t>(bytes, value));
  };
  put("a/1.jpg", 10);
  put("a/2.PNG", 20);
  put("b/3.jpeg", 30);
  put("b/notes.txt", 5);
  put(".cache/4.jpg", 40);
  put("b/.5.jpg", 50);
  const nlohmann::json fp = fingerprint_data(root);
  EXPECT_EQ(fp.at("files"), 3);
  EXPECT_EQ(fp.at("bytes"), 60);
  EXPECT_EQ(fp.at("parts").size(), 2u);
  EXPECT_EQ(fp.at("parts").at("a").at("files"), 2);
  ASSERT_EQ(::symlink(root.c_str(), (root + "/a/loop").c_str()), 0);  // back up the tree
  EXPECT_EQ(fingerprint_data(root), fp);
  EXPECT_EQ(fingerprint_difference(fp, fp), "");

  put("b/6.jpg", 30);
  EXPECT_EQ(fingerprint_difference(fp, fingerprint_data(root)),
            "4 files now, 3 in the checkpoint; 90 bytes now, 60 in the checkpoint; b: 2 files "
            "now, 1 in the checkpoint");
  ASSERT_EQ(::unlink((root + "/b/6.jpg").c_str()), 0);
  ASSERT_EQ(::rename((root + "/a/1.jpg").c_str(), (root + "/a/0.jpg").c_str()), 0);
  EXPECT_EQ(fingerprint_difference(fp, fingerprint_data(root)),
            "a: the same count and size, other file names or content");
  put("a/0.jpg", 11);
  EXPECT_EQ(fingerprint_difference(fp, fingerprint_data(root)),
            "61 bytes now, 60 in the checkpoint; a: 31 bytes now, 30 in the checkpoint");

  // IDX files: the content counts (MNIST and Fashion-MNIST have the same sizes).
  put("idx/train-images-idx3-ubyte", 64, 1);
  const nlohmann::json idx = fingerprint_data(root + "/idx");
  put("idx/train-images-idx3-ubyte", 64, 2);
  EXPECT_EQ(fingerprint_difference(idx, fingerprint_data(root + "/idx")),
            "train-images-idx3-ubyte: the same count and size, other file names or content");
}

TEST(DataFingerprintTest, AnIdxFileIsItsContentGzippedOrNot) {
  // The same images gzipped at another level, or unzipped, are the same data; other images are
  // not. A fingerprint made before (the bytes as stored) is reproduced for an old checkpoint.
  TempDir tmp;
  const std::string dir = tmp.path() + "/idx", raw = dir + "/train-images-idx3-ubyte";
  // 4-bit noise: gzip's levels 1 and 9 compress it to different bytes.
  std::vector<uint8_t> pixels(1 << 16);
  uint32_t state = 12345;
  for (uint8_t& p : pixels)
    p = static_cast<uint8_t>((state = state * 1664525u + 1013904223u) >> 28);
  data::testing::put(tmp, "idx/train-images-idx3-ubyte", pixels);
  auto run = [](const std::string& command) {
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  };
  const nlohmann::json plain = fingerprint_data(dir);
  EXPECT_EQ(plain.at("idx"), "content");
  run("gzip -1 -n -f " + raw);  // the folder holds train-images-idx3-ubyte.gz alone
  const nlohmann::json fast = fingerprint_data(dir);
  const nlohmann::json fast_bytes = fingerprint_data(dir, IdxIdentity::kFileBytes);
  EXPECT_EQ(fingerprint_difference(plain, fast), "");
  run("gzip -d -f " + raw + ".gz && gzip -9 -n -f " + raw);  // compressed again, harder
  const nlohmann::json best = fingerprint_data(dir);
  EXPECT_EQ(fingerprint_difference(fast, best), "");
  EXPECT_EQ(best.at("bytes"), 1 << 16);  // the content's size, not the compressed one
  EXPECT_NE(fingerprint_difference(fast_bytes, fingerprint_data(dir, IdxIdentity::kFileBytes)),
            "");  // as stored, the two compressions differ
  EXPECT_FALSE(fast_bytes.contains("idx"));
  pixels[100] ^= 1;  // other data, the same size
  ASSERT_EQ(::unlink((raw + ".gz").c_str()), 0);
  data::testing::put(tmp, "idx/train-images-idx3-ubyte", pixels);
  EXPECT_EQ(fingerprint_difference(best, fingerprint_data(dir)),
            "train-images-idx3-ubyte: the same count and size, other file names or content");
}

}  // namespace
}  // namespace tandem::train
