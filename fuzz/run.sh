#!/usr/bin/env bash
# Fuzzes the gRPC service's insert-message decoding and checks (not part of CI's budget).
#
#   bash fuzz/run.sh            # 60 seconds
#   bash fuzz/run.sh 600        # ten minutes
#
# Needs a nightly toolchain and cargo-fuzz; installs both if missing. Crashes land in
# fuzz/artifacts/insert_messages/, the corpus in fuzz/corpus/insert_messages/.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
if ! rustup toolchain list 2>/dev/null | grep -q nightly; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz
fi
mkdir -p corpus/insert_messages
exec cargo +nightly fuzz run insert_messages corpus/insert_messages -- -max_total_time="$seconds" -rss_limit_mb=4096
