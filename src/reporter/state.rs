//! The reporter's durable state (`reporter/state.json`): how far it has
//! read each sequence into the metrics, how far the hooks are done, the
//! metrics themselves, and when statsd was last sent to. Written whole
//! (`atomic_write`) by the elected reporter; read by the next one.

use std::path::Path;

use serde_json::{Value, json};

use super::metrics::Metrics;
use crate::store::atomic_write;

const VERSION: u64 = 1;

#[derive(Clone, Debug, Default)]
pub struct SavedState {
    /// Per source (luxid, wconfd): the last event in the metrics.
    pub read: [u64; 2],
    /// Per source: every hook run of every event up to here is done.
    pub hooks_done: [u64; 2],
    pub metrics: Metrics,
    /// When the last statsd packet was sent (seconds since the epoch).
    pub statsd_sent_at: f64,
}

/// The saved state; none yet: from the beginning.
pub fn load(path: &Path) -> Result<SavedState, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(SavedState::default());
        }
        Err(error) => return Err(format!("cannot read it: {error}")),
    };
    let value: Value =
        serde_json::from_slice(&bytes).map_err(|error| format!("not JSON: {error}"))?;
    if value.get("version").and_then(Value::as_u64) != Some(VERSION) {
        return Err(format!("not of version {VERSION}"));
    }
    let pair = |name: &str| -> Result<[u64; 2], String> {
        let of = |source: &str| {
            value[name][source]
                .as_u64()
                .ok_or_else(|| format!("no {name}.{source}"))
        };
        Ok([of("luxid")?, of("wconfd")?])
    };
    let read = pair("read")?;
    let hooks_done = pair("hooks_done")?;
    if hooks_done[0] > read[0] || hooks_done[1] > read[1] {
        return Err("hooks done past what was read".to_owned());
    }
    Ok(SavedState {
        read,
        hooks_done,
        metrics: Metrics::restore(&value["metrics"])?,
        statsd_sent_at: value["statsd_sent_at"].as_f64().unwrap_or(0.0),
    })
}

pub fn save(path: &Path, state: &SavedState) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let value = json!({
        "version": VERSION,
        "read": {"luxid": state.read[0], "wconfd": state.read[1]},
        "hooks_done": {"luxid": state.hooks_done[0], "wconfd": state.hooks_done[1]},
        "statsd_sent_at": state.statsd_sent_at,
        "metrics": state.metrics.save(),
    });
    atomic_write(path, value.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_round_trips_and_damage_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("reporter/state.json");
        assert_eq!(load(&path).expect("none yet").read, [0, 0]);
        let state = SavedState {
            read: [10, 20],
            hooks_done: [9, 20],
            metrics: Metrics::new(),
            statsd_sent_at: 12.5,
        };
        save(&path, &state).expect("saved");
        let back = load(&path).expect("loaded");
        assert_eq!((back.read, back.hooks_done), ([10, 20], [9, 20]));
        assert_eq!(back.statsd_sent_at, 12.5);
        std::fs::write(&path, b"{\"version\": 1}").expect("written");
        assert!(load(&path).unwrap_err().contains("read"));
        std::fs::write(&path, b"not json").expect("written");
        assert!(load(&path).unwrap_err().contains("not JSON"));
    }
}
