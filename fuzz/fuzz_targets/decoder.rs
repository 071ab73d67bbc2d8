//! The frame decoder on arbitrary bytes: never panics, never reserves beyond its limits, and
//! decodes the same frames whether the input arrives whole or split at a fuzzer-chosen point.
#![no_main]

use bytes::BytesMut;
use gabp_proto::GabpCodec;
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

const MAX_BODY: usize = 4096;

fn decode(chunks: &[&[u8]]) -> (Vec<bytes::Bytes>, bool) {
    let mut codec = GabpCodec::new(MAX_BODY).with_max_header(512);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(f)) => out.push(f.body),
                Ok(None) => break,
                Err(_) => return (out, false),
            }
            assert!(buf.capacity() <= chunks.iter().map(|c| c.len()).sum::<usize>() + MAX_BODY + 1024);
        }
    }
    (out, true)
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let cut = data[0] as usize % data.len();
    let input = &data[1..];
    let cut = cut.min(input.len());
    let whole = decode(&[input]);
    let split = decode(&[&input[..cut], &input[cut..]]);
    assert_eq!(whole, split, "split at {cut} changed the result");
});
