"""The phases on the generated JPEG ImageFolder: data (data_bench.py's torchvision pipeline beside
tandem data-bench) and train (tandem train on Fashion-MNIST, the folder and segmentation pairs,
beside the resident step and train_bench.py). TRAIN_MODELS also serves the ab phase's train
cells."""
import glob
import os
import re

from lab.check import PYTHON, joined, phase
from lab.options import data_options, fashion_options, folder_options, train_options


@phase("data", folder_options, data_options)
def phase_data(c, a):
    """the generated JPEG ImageFolder through data_bench.py (torchvision's pipeline) and tandem
    data-bench: data.json

    The Python reference is torchvision's ImageFolder + DataLoader with PIL / torchvision.io decode;
    both run in one call, and data.json merges them."""
    folder = c.image_folder()
    jobs = joined(["decode", *a.data_models])
    bs_csv = joined(a.data_bs)
    c.say(f"python data_bench.py --jobs {jobs} --batch-sizes {bs_csv}")
    # --decode-files 1000: the 1000 files data-bench's --images 1000 decodes
    c.run([PYTHON, "benchmarks/data_bench.py", "--data", folder, "--jobs", jobs, "--batch-sizes",
           bs_csv, "--workers", a.data_py_workers, "--steps", a.data_steps, "--decode-files", 1000,
           "--out", c.raw_path("data-python.json")], show=True)
    for model in a.data_models:
        for bs in a.data_bs:
            for where in a.data_decode:
                c.say(f"tandem data-bench --model {model} --batch-size {bs} --decode {where}")
                c.run([c.tandem, "data-bench", "--data", folder, "--model", model, "--batch-size",
                       bs, "--mode", a.data_mode, "--steps", a.data_steps, "--warmup", 10,
                       "--decode", where, "--images", 1000,
                       "--json", c.raw_path(f"data-tandem-{model}-{bs}-{where}.json")], show=True)
    c.compare("--scenario", "data", "--raw", c.raw, "--out", c.out_path("data.json"), fail=False)


# The image jobs' models as `tandem train` arguments.
TRAIN_MODELS = {"r50_frozen_head": ["--model", "resnet50", "--freeze", "backbone"],
                "r18_full": ["--model", "resnet18"], "r50_full": ["--model", "resnet50"]}


@phase("train", folder_options, fashion_options, train_options)
def phase_train(c, a):
    """tandem train on Fashion-MNIST and on the generated JPEG folder beside the resident step and
    train_bench.py: train.json (job seg: train-seg.json)

    Fashion-MNIST with the small CNN (accuracy), then the generated JPEG folder with a frozen
    ResNet-50 + head and a full ResNet-18 beside the same step on device-resident data and beside
    the Python loops; Python loads the exported ResNet-18 weights into torchvision's model
    (scripts/check_export.py)."""
    fm = c.fashion_mnist_dir()
    if "fmnist" in a.train_jobs:
        c.say(f"tandem train: small CNN on Fashion-MNIST, {a.fmnist_epochs} epochs")
        c.run([c.tandem, "train", "--data", fm, "--model", "small_cnn", "--epochs",
               a.fmnist_epochs, "--out", c.raw_path("run-fmnist"),
               "--json", c.raw_path("train-tandem-fmnist.json")], show=True)
        c.say("python train_bench.py --jobs fashion_mnist")
        c.run([PYTHON, "benchmarks/train_bench.py", "--jobs", "fashion_mnist", "--fashion-dir", fm,
               "--precision", "fp32", "--epochs", a.fmnist_epochs,
               "--out", c.raw_path("train-python-fmnist.json")], show=True)
    if "images" in a.train_jobs:
        folder = c.image_folder()
        bs = a.train_bs
        for model in a.train_models:
            for prec in a.train_precisions:
                for layout in a.train_layouts:
                    tag = f"{model}-{prec}-{layout}"
                    c.say(f"tandem train {model} {prec} {layout} bs {bs}, {a.train_epochs} epochs")
                    c.run([c.tandem, "train", "--data", folder, *TRAIN_MODELS[model],
                           "--optimizer", "sgd", "--lr", 0.1,
                           "--no-channels-last" if layout == "nchw" else "--channels-last",
                           "--batch-size", bs, "--precision", prec, "--epochs", a.train_epochs,
                           "--val-split", 0.1, "--val-subset", 512,
                           "--out", c.raw_path(f"run-{tag}"),
                           "--json", c.raw_path(f"train-tandem-{tag}.json")],
                          show=lambda line: not line.startswith("epoch"))
                    c.say(f"tandem bench images resident {model} {prec} {layout}")
                    c.run([c.tandem, "bench", "--workload", "images", "--param", "source=resident",
                           "--param", f"model={model}", "--param", f"precision={prec}",
                           "--param", f"layout={layout}", "--batch-size", bs,
                           "--mode", "pipelined+graphed", "--steps", 60, "--warmup", 10,
                           "--json", c.raw_path(f"resident-{tag}.json")],
                          show="^images|efficiency")
        if a.train_python:
            c.say("python train_bench.py --jobs r50_frozen_head,r18_full")
            c.run([PYTHON, "benchmarks/train_bench.py", "--jobs", "r50_frozen_head,r18_full",
                   "--data", folder, "--precision", joined(a.train_precisions),
                   "--batch-sizes", bs, "--steps", 60,
                   "--out", c.raw_path("train-python-images.json")], show=True)
        exported = sorted(glob.glob(c.raw_path("run-r18_full-fp32-*")))
        if exported:
            c.say("check_export.py: torchvision loads tandem's ResNet-18 weights")
            c.run([PYTHON, "scripts/check_export.py", "--weights",
                   f"{exported[0]}/model.safetensors", "--arch", "resnet18", "--num-classes", 10],
                  show=True)
    if "seg" in a.train_jobs:
        if not os.path.isdir(os.path.join(a.seg_dir, "masks")):
            c.say(f"make_seg_pairs.py {a.seg_dir} --count {a.seg_count}")
            c.run([PYTHON, "scripts/make_seg_pairs.py", a.seg_dir, "--count", a.seg_count,
                   "--classes", 6], show=True, tail=4, fail=False)
        for prec in a.train_precisions:
            c.say(f"tandem train fcn_resnet18 (segmentation) {prec}, {a.seg_epochs} epochs")
            c.run([c.tandem, "train", "--data", a.seg_dir, "--model", "fcn_resnet18",
                   "--classes", 6, "--ignore-index", 255, "--optimizer", "sgd", "--lr", 0.02,
                   "--epochs", a.seg_epochs, "--batch-size", 32, "--precision", prec,
                   "--val-split", 0.1, "--out", c.raw_path(f"run-seg-{prec}"),
                   "--json", c.raw_path(f"train-tandem-seg_fcn_r18-{prec}-channels_last.json")],
                  show=lambda line: not re.search(r"^epoch [0-9]*/.*step", line), tail=16)
    c.compare("--scenario", "train", "--raw", c.raw, "--out", c.out_path("train.json"),
              fail=False)
