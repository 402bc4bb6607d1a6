//! The reporter's endpoint: `GET /metrics` (Prometheus text exposition
//! 0.0.4) and `GET /status.json` (the same figures and the reporter's
//! state, for `warden status --json`), one thread, one request per
//! connection. Anything else is answered 404 or 405.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{Shared, now_secs};

/// A request head larger than this is refused.
const HEAD_BYTES_MAX: usize = 8 * 1024;

/// A client that sends nothing for this long is dropped.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `address` and serves it on a thread of its own.
pub fn serve(address: &str, shared: Arc<Shared>) -> std::io::Result<()> {
    let listener = TcpListener::bind(address)?;
    std::thread::Builder::new()
        .name("metrics-http".to_owned())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(error) = answer(stream, &shared) {
                    tracing::debug!(%error, "a metrics client went away");
                }
            }
        })?;
    Ok(())
}

fn answer(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..read]);
        if head.len() > HEAD_BYTES_MAX {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"",
            );
        }
    }
    let line = head.split(|byte| *byte == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            b"GET only\n",
        );
    }
    let now = now_secs();
    let (content_type, body) = match path {
        "/metrics" => {
            let metrics = shared.metrics.lock().expect("no panic holding it");
            let text = metrics.prometheus_text_with(
                now,
                &[(
                    "warden_reporter_leader",
                    "1 on the elected reporter (the one that serves this).",
                    1.0,
                )],
            );
            (
                "text/plain; version=0.0.4; charset=utf-8",
                text.into_bytes(),
            )
        }
        "/status.json" => {
            let figures = shared
                .metrics
                .lock()
                .expect("no panic holding it")
                .to_json(now);
            let status = shared.status.lock().expect("no panic holding it").clone();
            let value = json!({
                "reporter": {
                    "pid": status.pid,
                    "elected_at": status.elected_at,
                    "read": {"luxid": status.read[0], "wconfd": status.read[1]},
                    "hooks_done": {"luxid": status.hooks_done[0], "wconfd": status.hooks_done[1]},
                    "hooks_running": status.hooks_running,
                    "hooks_pending": status.hooks_pending,
                },
                "metrics": figures,
            });
            ("application/json", value.to_string().into_bytes())
        }
        _ => {
            return respond(
                &mut stream,
                "404 Not Found",
                "text/plain",
                b"/metrics or /status.json\n",
            );
        }
    };
    let body = if method == "HEAD" { Vec::new() } else { body };
    respond(&mut stream, "200 OK", content_type, &body)
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}
