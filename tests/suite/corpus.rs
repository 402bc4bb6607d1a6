//! Bad input made systematically, for the bad-input tests of both daemons:
//! from a valid request of each method, every argument position replaced
//! by a value of every wrong JSON type, every truncation of the request,
//! invalid UTF-8 at every string, nesting bombs in every position, and
//! frames around the frame limit. [`send_expecting_errors`] sends a batch
//! over one connection and checks that each frame is answered with an
//! error.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde_json::{Value, json};

use crate::daemon::{Client, message};

/// Whether a value is accepted in one argument position (such a
/// substitution is a valid request and is left out of the corpus).
pub type Accepts = fn(&Value) -> bool;

/// One method: its name, a valid argument list, and what each position
/// accepts.
pub struct Method {
    pub name: &'static str,
    pub args: Vec<Value>,
    pub accepts: Vec<Accepts>,
}

impl Method {
    pub fn new(name: &'static str, args: Vec<(Value, Accepts)>) -> Method {
        let (args, accepts) = args.into_iter().unzip();
        Method {
            name,
            args,
            accepts,
        }
    }

    /// The valid request as a client encodes it, without its ETX.
    pub fn request(&self) -> Vec<u8> {
        request(self.name, &Value::Array(self.args.clone()))
    }
}

pub fn request(method: &str, args: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"method": method, "args": args})).expect("JSON to a Vec")
}

pub fn nothing(_: &Value) -> bool {
    false
}

pub fn anything(_: &Value) -> bool {
    true
}

/// One value of each JSON type, and the edges of each: none contains an
/// ETX (it would split the frame).
pub fn palette() -> Vec<Value> {
    vec![
        json!(null),
        json!(true),
        json!(false),
        json!(0),
        json!(-1),
        json!(1.5),
        json!(-0.0),
        json!(1e300),
        json!(u64::MAX),
        json!(i64::MIN),
        // Beyond 64 bits: a float to serde.
        serde_json::from_str("18446744073709551616").expect("a number"),
        json!(""),
        json!("x"),
        json!("\u{0}"),
        json!("x".repeat(10_000)),
        json!([]),
        json!([null]),
        json!([1, "x", [], {}]),
        json!({}),
        json!({"a": 1}),
    ]
}

/// Nested lists and objects `depth` deep, as text: past 128 levels the
/// request is refused as JSON before any method sees it.
pub fn nested(depth: usize, object: bool) -> String {
    if object {
        format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
    } else {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }
}

/// Every bad request made from `method`, each a frame with its ETX.
pub fn bad_frames(method: &Method) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let mut push = |bytes: Vec<u8>| {
        let mut frame = bytes;
        frame.push(0x03);
        frames.push(frame);
    };
    // Wrong argument counts.
    for count in [0, method.args.len() + 1, method.args.len() + 3]
        .into_iter()
        .chain(method.args.len().checked_sub(1))
    {
        if count != method.args.len() {
            // The valid arguments again, or nulls for a method of none.
            let args: Vec<Value> = (0..count)
                .map(|index| {
                    method
                        .args
                        .get(index % method.args.len().max(1))
                        .cloned()
                        .unwrap_or(Value::Null)
                })
                .collect();
            push(request(method.name, &Value::Array(args)));
        }
    }
    // A wrong value in each position.
    for (position, accepts) in method.accepts.iter().enumerate() {
        for value in palette() {
            if accepts(&value) {
                continue;
            }
            let mut args = method.args.clone();
            args[position] = value;
            push(request(method.name, &Value::Array(args)));
        }
        // Nesting bombs: within serde's recursion limit (the method sees
        // them) and far past it.
        for depth in [100, 129, 10_000] {
            for object in [false, true] {
                let bomb = nested(depth, object);
                if depth < 128
                    && accepts(&serde_json::from_str(&bomb).expect("nesting within the limit"))
                {
                    continue;
                }
                let mut args: Vec<String> = method.args.iter().map(Value::to_string).collect();
                args[position] = bomb;
                let text = format!(
                    "{{\"method\":{},\"args\":[{}]}}",
                    json!(method.name),
                    args.join(",")
                );
                push(text.into_bytes());
            }
        }
    }
    let valid = method.request();
    // Every truncation.
    for end in 0..valid.len() {
        push(valid[..end].to_vec());
    }
    // Invalid UTF-8 after every quote: inside each string, or just after
    // one.
    for (index, _) in valid.iter().enumerate().filter(|(_, byte)| **byte == b'"') {
        for bad in [
            &b"\xff"[..],
            b"\xc3\x28",
            b"\xc0\x80",
            b"\xed\xa0\x80",
            b"\xf4\x90\x80\x80",
        ] {
            let mut bytes = valid[..=index].to_vec();
            bytes.extend_from_slice(bad);
            bytes.extend_from_slice(&valid[index + 1..]);
            push(bytes);
        }
    }
    frames
}

/// Envelopes that are not requests, whatever the daemon.
pub fn bad_envelopes() -> Vec<Vec<u8>> {
    let mut frames: Vec<Vec<u8>> = [
        &b""[..],
        b" \n\t",
        b"{",
        b"}",
        b"[]",
        b"null",
        b"\"echo\"",
        b"1",
        b"{}",
        b"{\"method\": \"echo\"}",
        b"{\"args\": []}",
        b"{\"method\": null, \"args\": []}",
        b"{\"method\": [], \"args\": []}",
        b"{\"method\": \"x\", \"args\": null}",
        b"{\"method\": \"x\", \"args\": {}}",
        b"{\"method\": \"x\", \"args\": []} []",
        b"{\"method\": \"x\", \"args\": [],}",
        b"{'method': 'x', 'args': []}",
        b"{\"method\": \"\\ud800\", \"args\": []}",
        b"{\"method\": \"x\", \"args\": [NaN]}",
        b"{\"method\": \"x\", \"args\": [1e999]}",
        b"\xef\xbb\xbf{\"method\": \"x\", \"args\": []}",
        b"\x00",
    ]
    .iter()
    .map(|bytes| bytes.to_vec())
    .collect();
    frames.push(nested(1_000_000, false).into_bytes());
    frames.push(nested(100_000, true).into_bytes());
    frames.push(format!("{{\"method\": \"{}\", \"args\": []}}", "m".repeat(50_000)).into_bytes());
    for frame in &mut frames {
        frame.push(0x03);
    }
    frames
}

/// Sends `frames` over one new connection (from another thread, so a
/// daemon that stops reading while its replies back up cannot deadlock the
/// test) and checks that each is answered with an error of one of
/// `classes`. Answers how many were sent.
pub fn send_expecting_errors(socket: &Path, frames: &[Vec<u8>], classes: &[&str]) -> usize {
    let stream = UnixStream::connect(socket).expect("connect");
    let mut writer = stream.try_clone().expect("clone the stream");
    let sent: Vec<Vec<u8>> = frames.to_vec();
    let writing = std::thread::spawn(move || {
        for frame in &sent {
            writer.write_all(frame).expect("send a frame");
        }
    });
    let mut client = Client::over(stream);
    for frame in frames {
        let shown = String::from_utf8_lossy(&frame[..frame.len().min(120)]).into_owned();
        match client.read_response() {
            Ok(Err((class, args))) => assert!(
                classes.contains(&class.as_str()),
                "{shown:?}: {class}: {}",
                message(&args)
            ),
            Ok(Ok(value)) => panic!("{shown:?} was answered {value}"),
            Err(error) => panic!("{shown:?}: no answer: {error}"),
        }
    }
    writing.join().expect("the writer");
    frames.len()
}

/// Frames of exactly `limit - 1`, `limit` and `limit + 1` bytes (padding
/// after a valid request, which the envelope allows): the first two are
/// answered, the last is refused and its connection closed. Answers how
/// many were sent.
pub fn check_frame_limit(socket: &Path, limit: usize, method: &str, args: Value) -> usize {
    let valid = request(method, &args);
    let padded = |size: usize| {
        let mut frame = valid.clone();
        frame.resize(size, b' ');
        frame.push(0x03);
        frame
    };
    let mut client = Client::connect(socket);
    for size in [limit - 1, limit] {
        client.send_raw(&padded(size)).expect("send");
        let answer = client.read_response().expect("an answer");
        assert!(answer.is_ok(), "{size} bytes: {answer:?}");
    }
    // The daemon may close before it has read all: a failed write is fine.
    let _ = client.send_raw(&padded(limit + 1));
    let (class, args) = client
        .read_response()
        .expect("an answer")
        .expect_err("refused");
    assert_eq!(class, "GenericError");
    assert!(
        message(&args).contains(&format!("frame limit of {limit} bytes")),
        "{args}"
    );
    assert!(client.closed_by_daemon());
    3
}
