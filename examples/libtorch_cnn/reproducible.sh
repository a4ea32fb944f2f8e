#!/bin/sh
# ctest example_libtorch_cnn_reproducible: two runs over ThreadComm and one over TorchComm
# (ranks as threads) must print the same accuracy, loss, bytes and rounds.
# usage: reproducible.sh path/to/train_cnn
set -u
run() {
  "$bin" --ranks 2 --method powersgd --limit 1200 --test-limit 500 --epochs 1 --quiet "$@" | sed 's/, [0-9.]* s$//'
}
bin=$1
a=$(run --comm thread) && b=$(run --comm thread) && c=$(run --comm gloo) || exit 1
printf '%s\n' "thread: $a" "thread: $b" "gloo:   $c"
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] || { echo "the runs differ"; exit 1; }
