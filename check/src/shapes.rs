//! Messages judged against the vendored schemas and against what the relay reads, into
//! findings: an extra member is a deviation peers tolerate (GABP 1.x grows by adding members,
//! §7.2), a member the relay cuts (a `null` beside the other of `result` and `error`) is one
//! the relay absorbs, anything else fails. The mod's messages are read as the relay reads a
//! mod's (tolerant), a bridge's as it reads a bridge's (strict): what the relay refuses fails.

use gabp_proto::{Mode, Parser};
use serde_json::Value;

use crate::report::{Findings, Verdict};
use crate::schema::{self, Violation};

/// `path` with array indices as `*`, so one finding counts every element it applies to.
fn general(path: &str) -> String {
    path.split('/')
        .map(|p| {
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                "*"
            } else {
                p
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Notes each violation: extra members as tolerated, the rest by `judge` (a verdict for a
/// violation that is not an extra member, with what to say about it).
pub fn note_violations(
    found: &mut Findings,
    violations: &[Violation],
    judge: impl Fn(&Violation) -> (Verdict, String),
) {
    for v in violations {
        if v.extra {
            found.note(
                Verdict::Tolerated,
                format!("extra member {}", general(&v.path)),
            );
        } else {
            let (verdict, what) = judge(v);
            found.note(verdict, what);
        }
    }
}

/// A violation said with its path generalised.
pub fn said(v: &Violation) -> String {
    Violation {
        path: general(&v.path),
        ..v.clone()
    }
    .to_string()
}

/// Notes what is wrong with a response from a mod: both `result` and `error` (one `null`: the
/// relay cuts it), neither, extra members, an error object the schema refuses, anything the
/// relay's tolerant reader refuses.
pub fn mod_answer(found: &mut Findings, body: &[u8], msg: &Value) {
    let mut msg = msg.clone();
    if let Value::Object(m) = &mut msg {
        if m.contains_key("result") && m.contains_key("error") {
            if m["result"].is_null() {
                found.note(
                    Verdict::Tolerated,
                    "both result and error, result null (the relay forwards the error alone)",
                );
                m.remove("result");
            } else if m["error"].is_null() {
                found.note(
                    Verdict::Tolerated,
                    "both result and error, error null (the relay forwards the result alone)",
                );
                m.remove("error");
            }
        }
    }
    let violations = schema::validate("envelope.schema.json", "#/$defs/response", &msg);
    note_violations(found, &violations, |v| {
        if v.what.contains("must not have all") {
            (
                Verdict::Fail,
                "both result and error, neither null (the relay answers -32001: which did the mod mean?)".into(),
            )
        } else if v.what.contains("anyOf") {
            (Verdict::Fail, "neither result nor error".into())
        } else {
            (Verdict::Fail, said(v))
        }
    });
    if let Err(e) = Parser::new().parse(body, Mode::Tolerant) {
        found.note(Verdict::Fail, format!("the relay cannot read it: {e}"));
    }
}

/// Notes what is wrong with an event from a mod: extra members and a `timestamp` that is not
/// the schema's date-time string pass through the relay; anything else fails.
pub fn mod_event(found: &mut Findings, body: &[u8], msg: &Value) {
    let violations = schema::validate("events/event.message.json", "", msg);
    note_violations(found, &violations, |v| {
        if v.path == "/timestamp" {
            (
                Verdict::Tolerated,
                format!("{} (the relay passes it through)", said(v)),
            )
        } else {
            (Verdict::Fail, said(v))
        }
    });
    if let Err(e) = Parser::new().parse(body, Mode::Tolerant) {
        found.note(Verdict::Fail, format!("the relay cannot read it: {e}"));
    }
}

/// Notes what is wrong with a method's answer beyond its envelope (`file`: the method's
/// response schema): extra members are tolerated, the rest fails. The envelope's own members
/// are [`mod_answer`]'s, so only the answer (`result` or `error`) is judged here.
pub fn method_result(found: &mut Findings, file: &str, msg: &Value) {
    let mut msg = msg.clone();
    if let Value::Object(m) = &mut msg {
        // The envelope's quirks (extra members, a `null` beside the answer) are judged once,
        // by `mod_answer`.
        m.retain(|k, v| match k.as_str() {
            "v" | "id" | "type" => true,
            "result" | "error" => !v.is_null(),
            _ => false,
        });
    }
    let violations = schema::validate(file, "", &msg);
    note_violations(found, &violations, |v| (Verdict::Fail, said(v)));
}

/// Notes what is wrong with a request from a bridge: what the relay's strict reader refuses
/// fails (the relay answers it -32600 or -32602), with whatever else the schema refuses in it;
/// what only the schema refuses is tolerated (extra members always are, as GABP 1.x allows).
pub fn bridge_request(found: &mut Findings, body: &[u8], msg: &Value, file: Option<&str>) {
    let strict = Parser::new().parse(body, Mode::Strict).err();
    if let Some(e) = &strict {
        found.note(Verdict::Fail, format!("the relay refuses it: {e}"));
    }
    let mut violations = schema::validate("envelope.schema.json", "#/$defs/request", msg);
    if let Some(file) = file {
        violations.extend(schema::validate(file, "", msg));
    }
    // The token is the operator's choice, whatever its length.
    violations.retain(|v| v.path != "/params/token");
    violations.dedup();
    note_violations(found, &violations, |v| match strict {
        Some(_) => (Verdict::Fail, said(v)),
        None => (
            Verdict::Tolerated,
            format!("{} (the relay lets it through)", said(v)),
        ),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ID: &str = "550e8400-e29b-41d4-a716-446655440000";

    fn answer(msg: Value) -> Findings {
        let mut f = Findings::default();
        mod_answer(&mut f, &serde_json::to_vec(&msg).expect("JSON"), &msg);
        f
    }

    #[test]
    fn answers_with_a_null_beside_are_tolerated_and_with_both_set_fail() {
        let ok = answer(json!({"v": "gabp/1", "id": ID, "type": "response", "result": {}}));
        assert_eq!(ok.verdict(), None);
        let null = answer(
            json!({"v": "gabp/1", "id": ID, "type": "response", "result": {}, "error": null}),
        );
        assert_eq!(null.verdict(), Some(Verdict::Tolerated), "{}", null.line(5));
        let both = answer(
            json!({"v": "gabp/1", "id": ID, "type": "response", "result": 1, "error": {"code": 1, "message": "m"}}),
        );
        assert_eq!(both.verdict(), Some(Verdict::Fail));
        assert!(both.line(5).contains("neither null"), "{}", both.line(5));
        let extra =
            answer(json!({"v": "gabp/1", "id": ID, "type": "response", "result": 1, "x": 2}));
        assert_eq!(extra.verdict(), Some(Verdict::Tolerated));
        assert_eq!(extra.line(5), "extra member /x");
    }

    #[test]
    fn a_tool_answering_an_error_or_a_null_beside_its_result_is_well_formed() {
        const SCHEMA: &str = "methods/tools.call.response.json";
        let mut f = Findings::default();
        let error = json!({"v": "gabp/1", "id": ID, "type": "response",
            "error": {"code": -32001, "message": "m", "data": {"method": "tools/call"}}});
        method_result(&mut f, SCHEMA, &error);
        let null =
            json!({"v": "gabp/1", "id": ID, "type": "response", "result": {}, "error": null});
        method_result(&mut f, SCHEMA, &null);
        assert_eq!(f.verdict(), None, "{}", f.line(5));
        let bad = json!({"v": "gabp/1", "id": ID, "type": "response", "error": {"code": "x"}});
        method_result(&mut f, SCHEMA, &bad);
        assert_eq!(f.verdict(), Some(Verdict::Fail), "{}", f.line(5));
    }

    #[test]
    fn an_integer_timestamp_on_an_event_is_tolerated_and_a_missing_seq_fails() {
        let mut f = Findings::default();
        let ev = json!({"v": "gabp/1", "id": ID, "type": "event", "channel": "c", "seq": 1, "payload": {}, "timestamp": 5});
        mod_event(&mut f, &serde_json::to_vec(&ev).expect("JSON"), &ev);
        assert_eq!(f.verdict(), Some(Verdict::Tolerated), "{}", f.line(5));
        let ev = json!({"v": "gabp/1", "id": ID, "type": "event", "channel": "c", "payload": {}});
        mod_event(&mut f, &serde_json::to_vec(&ev).expect("JSON"), &ev);
        assert_eq!(f.verdict(), Some(Verdict::Fail), "{}", f.line(5));
    }

    #[test]
    fn a_bridge_sending_legacy_parameters_is_tolerated_and_an_unknown_envelope_member_fails() {
        let mut f = Findings::default();
        let call = json!({"v": "gabp/1", "id": ID, "type": "request", "method": "tools/call", "params": {"name": "a/b", "parameters": {}}});
        bridge_request(
            &mut f,
            &serde_json::to_vec(&call).expect("JSON"),
            &call,
            Some("methods/tools.call.request.json"),
        );
        assert_eq!(f.verdict(), Some(Verdict::Tolerated), "{}", f.line(5));
        let mut f = Findings::default();
        let odd = json!({"v": "gabp/1", "id": ID, "type": "request", "method": "tools/list", "params": {}, "x": 1});
        bridge_request(&mut f, &serde_json::to_vec(&odd).expect("JSON"), &odd, None);
        assert_eq!(f.verdict(), Some(Verdict::Fail), "{}", f.line(5));
    }
}
