#!/usr/bin/env bash
# random_idx.sh DIR N: an IDX folder of N random 28x28 images in 4 classes (label i % 4; N a
# multiple of 256), its test files a copy of its training files: the shell alone, for the CLI
# tests that train (tandem train reads any IDX folder). The content is random, so a run learns
# nothing; what the tests compare is runs of one folder against each other.
set -eu
dir=$1
n=$2
mkdir -p "$dir"
# The big-endian counts: n < 65536, in the header's low two bytes.
hi=$(printf '\\x%02x' $((n >> 8)))
lo=$(printf '\\x%02x' $((n & 255)))
{ printf "\x00\x00\x08\x03\x00\x00$hi$lo\x00\x00\x00\x1c\x00\x00\x00\x1c"
  head -c $((n * 784)) /dev/urandom; } >"$dir/train-images-idx3-ubyte"
{ printf "\x00\x00\x08\x01\x00\x00$hi$lo"
  for _ in $(seq $((n / 4))); do printf '\x00\x01\x02\x03'; done; } >"$dir/train-labels-idx1-ubyte"
cp "$dir/train-images-idx3-ubyte" "$dir/t10k-images-idx3-ubyte"
cp "$dir/train-labels-idx1-ubyte" "$dir/t10k-labels-idx1-ubyte"
