//! Shared fixtures for the criterion benches: realistic GABP frames of a given size.

use bytes::{Bytes, BytesMut};

/// An event body of about `size` bytes, shaped like the simulated mod's events.
pub fn event_body(size: usize, seq: u64) -> Vec<u8> {
    let head = format!(
        r#"{{"v":"gabp/1","id":"550e8400-e29b-41d4-a716-{:012x}","type":"event","channel":"world/tick","seq":{seq},"payload":{{"t":1764470000000000000,"pos":{{"x":1.5,"y":64,"z":-3}},"pad":""#,
        seq
    );
    let pad = size.saturating_sub(head.len() + 3);
    let mut body = head.into_bytes();
    // Seeded random letters, like the simulated mod's padding: compressible as text is, no more.
    let mut x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    body.extend((0..pad).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b'a' + (x % 26) as u8
    }));
    body.extend_from_slice(b"\"}}");
    body
}

/// `n` framed events of about `size` bytes, back to back, as a socket would deliver them.
pub fn wire(size: usize, n: usize) -> Bytes {
    let mut out = BytesMut::new();
    for i in 0..n {
        gabp_proto::encode_frame(&event_body(size, i as u64), &mut out);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    #[test]
    fn fixtures_are_valid_events_of_the_asked_size() {
        for size in [256, 4096] {
            let b = super::event_body(size, 7);
            assert_eq!(b.len(), size);
            let v = gabp_proto::Parser::new()
                .parse(&b, gabp_proto::Mode::Strict)
                .expect("valid");
            assert_eq!(v.seq, Some(7));
        }
    }
}
