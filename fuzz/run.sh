#!/usr/bin/env bash
# Fuzzes the gRPC service's insert-message decoding and checks, or the aggregation daemon's
# packet handling (not part of CI's budget).
#
#   bash fuzz/run.sh                         # insert_messages, 60 seconds
#   bash fuzz/run.sh 600                     # ten minutes
#   bash fuzz/run.sh 60 aggregate_packets    # the aggregation daemon's parser and rules
#
# Needs a nightly toolchain and cargo-fuzz; installs both if missing. Crashes land in
# fuzz/artifacts/TARGET/, the corpus in fuzz/corpus/TARGET/.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
target="${2:-insert_messages}"
if ! rustup toolchain list 2>/dev/null | grep -q nightly; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz
fi
mkdir -p "corpus/$target"
exec cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" -rss_limit_mb=4096
