//! The `gabp-relay` binary: everything is in the library's `cli` module.

// mimalloc keeps freed memory for reuse: with glibc's allocator the relay's read buffers and
// per-batch allocations were returned to the kernel and faulted back in (zeroed pages were
// ~9% of the relay's CPU at max rate; BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    gabp_relay::cli::main()
}
