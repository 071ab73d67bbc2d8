# Sourced by the scripts: one shared target dir outside the clone, so a fresh clone (CI) reuses
# the RocksDB build from earlier runs on the same machine instead of compiling it again.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gabp-relay/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
mkdir -p "$CARGO_TARGET_DIR"
