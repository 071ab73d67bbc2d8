# Sourced by the scripts: one shared target dir outside the clone, so a fresh clone (CI) reuses
# the RocksDB build from earlier runs on the same machine instead of compiling it again.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gabp-relay/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
mkdir -p "$CARGO_TARGET_DIR"
# RocksDB computes a CRC32C over every WAL byte. Its build script enables the SSE4.2/PCLMUL
# version only when the Rust target has those features, which the default x86-64 target lacks,
# leaving a table-driven CRC at ~4% of the relay's CPU when recording (BENCHMARKS.md). Every
# x86-64 server CPU since 2011 has both; this flag reaches only RocksDB's C++ sources.
if [ "$(uname -m)" = x86_64 ]; then
  export CXXFLAGS_x86_64_unknown_linux_gnu="${CXXFLAGS_x86_64_unknown_linux_gnu:--msse4.2 -mpclmul}"
fi
