//! The envelope view on arbitrary bodies: never panics; whatever strict mode accepts, tolerant
//! mode accepts with the same view; the validating scanner agrees with serde_json.
#![no_main]

use gabp_proto::{scan, Mode, Parser};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut p = Parser::new();
    let strict = p.parse(data, Mode::Strict);
    let mut q = Parser::new();
    let tolerant = q.parse(data, Mode::Tolerant);
    if let Ok(s) = &strict {
        assert_eq!(Some(s), tolerant.as_ref().ok(), "strict accepted what tolerant refused");
    }
    // Both parsers limit nesting, at depths that need not match exactly.
    let deep = data.iter().filter(|&&b| b == b'[' || b == b'{').count() >= 100;
    if let (Ok(text), false) = (std::str::from_utf8(data), deep) {
        // `Value`, not `IgnoredAny`: it refuses non-finite numbers and lone surrogates, as the
        // scanner does.
        match serde_json::from_str::<serde_json::Value>(text) {
            Err(e) if e.to_string().contains("recursion limit") => {}
            theirs => assert_eq!(scan::is_valid_json(data), theirs.is_ok(), "validity disagrees on {text:?}"),
        }
    }
});
