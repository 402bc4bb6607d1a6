//! The wire protocol shared by wconfd and luxid (PROTOCOL.md
//! "1. Transport"): framing, the request and response envelopes, and each
//! daemon's methods decoded into typed requests. Only this module and
//! `store` know JSON; the cores see typed values.

#[cfg(test)]
pub mod arbitrary;
pub mod events;
pub mod frame;
pub mod luxi;
pub mod query;
pub mod wconfd;
pub mod workers;

use serde_json::{Value, json};

pub use frame::{ETX, FrameError, FrameReader};

/// A request as it arrives: a method name and positional arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub method: String,
    pub args: Vec<Value>,
}

impl Request {
    /// Appends the request as a client sends it: its JSON and the ETX.
    pub fn write_frame(&self, out: &mut Vec<u8>) {
        let document = json!({"method": self.method, "args": self.args});
        serde_json::to_writer(&mut *out, &document).expect("writing JSON to a Vec cannot fail");
        out.push(ETX);
    }
}

/// A failure response: a class clients branch on (Ganeti's exception
/// names) and its arguments, usually one message for people.
#[derive(Clone, Debug, PartialEq)]
pub struct WireError {
    pub class: &'static str,
    pub args: Vec<Value>,
}

impl WireError {
    /// `GenericError`: Ganeti's class for anything without a better one,
    /// including every request that cannot be parsed.
    pub fn generic(message: impl Into<String>) -> WireError {
        WireError {
            class: "GenericError",
            args: vec![Value::String(message.into())],
        }
    }

    pub fn message(&self) -> String {
        match self.args.first() {
            Some(Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.class, self.message())
    }
}

/// Parses one frame into a request. Whitespace around the document is
/// allowed (Ganeti's client sends a newline before the ETX).
pub fn parse_request(frame: &[u8]) -> Result<Request, WireError> {
    let text = std::str::from_utf8(frame).map_err(|error| {
        WireError::generic(format!(
            "request is not valid UTF-8 (byte {})",
            error.valid_up_to()
        ))
    })?;
    let document: Value = serde_json::from_str(text.trim())
        .map_err(|error| WireError::generic(format!("request is not valid JSON: {error}")))?;
    let Value::Object(mut fields) = document else {
        return Err(WireError::generic("request is not a JSON object"));
    };
    let method = match fields.remove("method") {
        Some(Value::String(method)) => method,
        Some(_) => return Err(WireError::generic("request field 'method' is not a string")),
        None => return Err(WireError::generic("request has no field 'method'")),
    };
    let args = match fields.remove("args") {
        Some(Value::Array(args)) => args,
        Some(_) => return Err(WireError::generic("request field 'args' is not a list")),
        None => return Err(WireError::generic("request has no field 'args'")),
    };
    Ok(Request { method, args })
}

/// How every success response begins (a client may read the result
/// straight from what follows).
pub const SUCCESS_PREFIX: &[u8] = br#"{"success":true,"result":"#;

/// Appends a success response and its ETX: `{"success":true,"result":…}`,
/// the result written in place (a listing can be megabytes; it is not
/// copied into a response object first).
pub fn encode_success(result: &Value, out: &mut Vec<u8>) {
    out.extend_from_slice(SUCCESS_PREFIX);
    serde_json::to_writer(&mut *out, result).expect("writing JSON to a Vec cannot fail");
    out.push(b'}');
    out.push(ETX);
}

/// Appends a success response whose result is already encoded JSON.
pub fn encode_encoded_success(result: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(SUCCESS_PREFIX);
    out.extend_from_slice(result);
    out.push(b'}');
    out.push(ETX);
}

/// Appends a failure response and its ETX.
pub fn encode_failure(error: &WireError, out: &mut Vec<u8>) {
    let response = json!({"success": false, "result": [error.class, error.args]});
    encode(&response, out);
}

fn encode(response: &Value, out: &mut Vec<u8>) {
    serde_json::to_writer(&mut *out, response).expect("writing JSON to a Vec cannot fail");
    out.push(ETX);
}

/// Positional arguments of one method, with errors that name the method.
pub struct Args<'a> {
    method: &'a str,
    args: &'a [Value],
}

impl<'a> Args<'a> {
    /// Checks the count: Ganeti's methods take a fixed number.
    pub fn exactly(
        method: &'a str,
        args: &'a [Value],
        count: usize,
    ) -> Result<Args<'a>, WireError> {
        if args.len() != count {
            return Err(WireError::generic(format!(
                "{method} takes {count} argument{}, got {}",
                if count == 1 { "" } else { "s" },
                args.len()
            )));
        }
        Ok(Args { method, args })
    }

    /// Checks the count of a method whose last arguments are optional
    /// (extensions added to a Ganeti method).
    pub fn between(
        method: &'a str,
        args: &'a [Value],
        fewest: usize,
        most: usize,
    ) -> Result<Args<'a>, WireError> {
        if !(fewest..=most).contains(&args.len()) {
            return Err(WireError::generic(format!(
                "{method} takes {fewest} to {most} arguments, got {}",
                args.len()
            )));
        }
        Ok(Args { method, args })
    }

    pub fn len(&self) -> usize {
        self.args.len()
    }

    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    pub fn get(&self, index: usize) -> &'a Value {
        &self.args[index]
    }

    /// An options object of boolean flags, each of `known`; answers the
    /// flags set. Absent: none.
    pub fn flags(
        &self,
        index: usize,
        known: &[&'static str],
    ) -> Result<Vec<&'static str>, WireError> {
        let Some(value) = self.args.get(index) else {
            return Ok(Vec::new());
        };
        let object = value
            .as_object()
            .ok_or_else(|| self.bad(index, "is not an object of options"))?;
        let mut set = Vec::new();
        for (name, flag) in object {
            let Some(known) = known.iter().find(|known| **known == name) else {
                return Err(self.bad(
                    index,
                    format!(
                        "has the unknown option {name:?} (known: {})",
                        known.join(", ")
                    ),
                ));
            };
            match flag.as_bool() {
                Some(true) => set.push(*known),
                Some(false) => {}
                None => return Err(self.bad(index, format!("option {name:?} is not a boolean"))),
            }
        }
        Ok(set)
    }

    /// An error about argument `index` (counted from 1 in the text).
    pub fn bad(&self, index: usize, what: impl std::fmt::Display) -> WireError {
        WireError::generic(format!("{}: argument {} {what}", self.method, index + 1))
    }

    pub fn string(&self, index: usize) -> Result<&'a str, WireError> {
        self.get(index)
            .as_str()
            .ok_or_else(|| self.bad(index, "is not a string"))
    }

    pub fn bool(&self, index: usize) -> Result<bool, WireError> {
        self.get(index)
            .as_bool()
            .ok_or_else(|| self.bad(index, "is not a boolean"))
    }

    pub fn i64(&self, index: usize) -> Result<i64, WireError> {
        self.get(index)
            .as_i64()
            .ok_or_else(|| self.bad(index, "is not an integer"))
    }

    pub fn u64(&self, index: usize) -> Result<u64, WireError> {
        self.get(index)
            .as_u64()
            .ok_or_else(|| self.bad(index, "is not a non-negative integer"))
    }

    pub fn list(&self, index: usize) -> Result<&'a [Value], WireError> {
        self.get(index)
            .as_array()
            .map(Vec::as_slice)
            .ok_or_else(|| self.bad(index, "is not a list"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_with_trailing_newline_and_version() {
        let request = parse_request(b"{\"method\": \"echo\", \"args\": [\"x\"], \"version\": 3}\n")
            .expect("valid");
        assert_eq!(request.method, "echo");
        assert_eq!(request.args, vec![json!("x")]);
    }

    #[test]
    fn malformed_requests_are_generic_errors_saying_what_is_wrong() {
        let cases: [(&[u8], &str); 7] = [
            (b"\xff\xfe", "UTF-8"),
            (b"{\"method\": ", "not valid JSON"),
            (b"[1, 2]", "not a JSON object"),
            (b"{\"args\": []}", "no field 'method'"),
            (b"{\"method\": 1, \"args\": []}", "'method' is not a string"),
            (b"{\"method\": \"echo\"}", "no field 'args'"),
            (
                b"{\"method\": \"echo\", \"args\": {}}",
                "'args' is not a list",
            ),
        ];
        for (frame, expected) in cases {
            let error = parse_request(frame).expect_err(expected);
            assert_eq!(error.class, "GenericError");
            assert!(error.message().contains(expected), "{error}");
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = format!(
            "{{\"method\": \"echo\", \"args\": [{}{}]}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let error = parse_request(deep.as_bytes()).expect_err("too deep");
        assert!(error.message().contains("recursion limit"), "{error}");
    }

    #[test]
    fn responses_are_ganeti_shaped() {
        let mut out = Vec::new();
        encode_success(&json!([]), &mut out);
        encode_failure(&WireError::generic("no"), &mut out);
        let text = String::from_utf8(out).expect("utf-8");
        let mut parts = text.split('\u{3}');
        let ok: Value = serde_json::from_str(parts.next().expect("one")).expect("json");
        assert_eq!(ok, json!({"success": true, "result": []}));
        let failed: Value = serde_json::from_str(parts.next().expect("two")).expect("json");
        assert_eq!(
            failed,
            json!({"success": false, "result": ["GenericError", ["no"]]})
        );
        assert_eq!(parts.next(), Some(""));
        let mut out = Vec::new();
        encode_success(
            &json!([["node/a", "exclusive"], {"k": "\u{3}\""}]),
            &mut out,
        );
        assert_eq!(
            out,
            b"{\"success\":true,\"result\":[[\"node/a\",\"exclusive\"],{\"k\":\"\\u0003\\\"\"}]}\x03"
        );
    }
}
