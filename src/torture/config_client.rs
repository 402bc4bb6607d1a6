//! The config client: a thread that rewrites wconfd's configuration
//! through Ganeti's config half, `lockConfig` then `writeConfigAndUnlock`
//! (or `writeConfig` and `unlockConfig`), each write by a new owner (a
//! real process, as the lock clients' are) and each naming the cluster
//! `torture-<n>`, n growing by one per write.
//!
//! [`ConfigHistory`] is what wconfd acknowledged: the last write answered
//! and the later ones whose answers were lost to a kill (each either
//! applied before the kill or not at all). Every configuration read, by
//! the client through `lockConfig` and by the checks after each start of
//! wconfd and at the end, must be one of those, and its `serial_no` never
//! goes back.

use crate::protocol::wconfd::WconfdRequest;
use std::collections::BTreeSet;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use crate::client::{ClientError, Daemon};

use super::processes::OwnerProcess;
use super::rng::Rng;
use super::{Connection, Shared};

/// The cluster name of write `n`.
fn cluster_name(n: u64) -> String {
    format!("torture-{n}")
}

/// The write a configuration carries (0: none of this client's).
fn write_of(config: &Value) -> Option<u64> {
    match config["cluster"]["cluster_name"].as_str() {
        None => Some(0),
        Some(name) => name.strip_prefix("torture-")?.parse().ok(),
    }
}

/// The configuration writes wconfd acknowledged, and those whose answers
/// were lost.
#[derive(Debug, Default)]
pub struct ConfigHistory {
    /// The last write known applied: answered, or seen since.
    applied: u64,
    /// Later writes whose answers were lost.
    lost: BTreeSet<u64>,
    /// The highest `serial_no` read.
    serial_no: u64,
}

impl ConfigHistory {
    fn acknowledge(&mut self, write: u64) {
        self.applied = write;
        self.lost.clear();
    }

    fn lose(&mut self, write: u64) {
        self.lost.insert(write);
    }

    /// Takes note of a configuration read from wconfd; an error says why
    /// it cannot be the state.
    pub fn check(&mut self, config: &Value) -> Result<(), String> {
        let Some(write) = write_of(config) else {
            return Err(format!("wconfd's configuration is none of ours: {config}"));
        };
        if write != self.applied && !self.lost.contains(&write) {
            return Err(format!(
                "wconfd's configuration is write {write}, but write {} was the last \
                 acknowledged (answers lost: {:?})",
                self.applied, self.lost
            ));
        }
        let Some(serial_no) = config["serial_no"].as_u64() else {
            return Err(format!("wconfd's configuration has no serial_no: {config}"));
        };
        if serial_no < self.serial_no {
            return Err(format!(
                "wconfd's configuration went back from serial_no {} to {serial_no}",
                self.serial_no
            ));
        }
        self.serial_no = serial_no;
        // Seen, so durable; nothing older can come back.
        self.applied = write;
        self.lost.retain(|&lost| lost > write);
        Ok(())
    }
}

/// The client's thread: write until told to stop.
pub fn run(shared: &Shared) {
    let mut client = ConfigClient {
        shared,
        rng: Rng::stream(shared.seed, 3000),
        connection: Connection::new(Daemon::Wconfd),
        writes: 0,
    };
    while !shared.stopping() {
        std::thread::sleep(Duration::from_millis(client.rng.between(5, 40)));
        client.write_once();
    }
}

struct ConfigClient<'a> {
    shared: &'a Shared,
    rng: Rng,
    connection: Connection,
    /// Writes sent so far (the next is named for one more).
    writes: u64,
}

/// How a call ended.
enum Called {
    Answer(Value),
    /// The connection (and the answer) was lost.
    Lost,
    /// wconfd refused, or a violation was reported: give up this write.
    Failed,
}

impl ConfigClient<'_> {
    /// Sends `request` with the gate held shared, reconnecting first if
    /// needed; `Lost` if wconfd cannot be reached or the answer is lost.
    fn call(&mut self, request: WconfdRequest) -> Called {
        let Some(client) = self.connection.get(self.shared) else {
            return Called::Lost;
        };
        match client.wconfd(&request) {
            Ok(answer) => Called::Answer(answer),
            Err(ClientError::Failed { class, args, .. }) => {
                self.shared.violation(format!(
                    "wconfd refused the config client's {}: {class} {}",
                    request.method(),
                    Value::Array(args)
                ));
                Called::Failed
            }
            Err(_) => {
                self.connection.lose();
                Called::Lost
            }
        }
    }

    fn history(&self) -> std::sync::MutexGuard<'_, ConfigHistory> {
        self.shared
            .config
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// One write by a new owner: lock, write (and unlock), free, end.
    fn write_once(&mut self) {
        let shared = self.shared;
        let ident = format!("torture-config-{}", self.writes + 1);
        let owner = match OwnerProcess::spawn(&shared.livelock_dir, &ident) {
            Ok(owner) => owner,
            Err(error) => return shared.violation(format!("config client: {error}")),
        };
        if let Some(config) = self.lock(&owner) {
            self.write(&owner, config);
        }
        self.free(&owner);
        owner.exit();
    }

    /// `lockConfig` exclusively until answered (it is idempotent): the
    /// configuration, checked against the history.
    fn lock(&mut self, owner: &OwnerProcess) -> Option<Value> {
        while !self.shared.stopping() {
            let gate = self
                .shared
                .gate
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            match self.call(WconfdRequest::LockConfig {
                owner: owner.owner(),
                shared: false,
            }) {
                Called::Answer(config) if config.is_object() => {
                    self.shared
                        .figures
                        .config_checks
                        .fetch_add(1, Ordering::Relaxed);
                    if let Err(message) = self.history().check(&config) {
                        self.shared.violation(format!("lockConfig: {message}"));
                        return None;
                    }
                    return Some(config);
                }
                Called::Answer(other) => {
                    // Only this client takes the config lock, and every
                    // owner of it frees it before the next one asks.
                    self.shared.violation(format!(
                        "lockConfig answered {other} with nobody else holding the lock"
                    ));
                    return None;
                }
                Called::Failed => return None,
                Called::Lost => drop(gate),
            }
        }
        None
    }

    /// The next write, recorded as acknowledged or lost.
    fn write(&mut self, owner: &OwnerProcess, mut config: Value) {
        self.writes += 1;
        let write = self.writes;
        config["cluster"]["cluster_name"] = json!(cluster_name(write));
        let and_unlock = self.rng.percent(50);
        // What each answers once written (`writeConfigAndUnlock` answers
        // `false` only to an owner without the lock, which this one has).
        let (request, written) = if and_unlock {
            (
                WconfdRequest::WriteConfigAndUnlock {
                    owner: owner.owner(),
                    config,
                },
                json!(true),
            )
        } else {
            (
                WconfdRequest::WriteConfig {
                    owner: owner.owner(),
                    config,
                },
                json!([]),
            )
        };
        let method = request.method();
        let _gate = self
            .shared
            .gate
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        match self.call(request) {
            Called::Answer(answer) if answer == written => {
                self.history().acknowledge(write);
                self.shared
                    .figures
                    .config_writes
                    .fetch_add(1, Ordering::Relaxed);
                if !and_unlock {
                    // Lost or not, `free` below releases it.
                    let _ = self.call(WconfdRequest::UnlockConfig {
                        owner: owner.owner(),
                    });
                }
            }
            Called::Answer(other) => self.shared.violation(format!("{method} answered {other}")),
            Called::Lost => {
                self.history().lose(write);
                self.shared
                    .figures
                    .config_writes_lost
                    .fetch_add(1, Ordering::Relaxed);
            }
            Called::Failed => {}
        }
    }

    /// `freeLocks` until answered, so that the next owner finds the
    /// config lock free.
    fn free(&mut self, owner: &OwnerProcess) {
        // Until the end of the settling too: the lock table must be empty.
        for _attempt in 0..2000 {
            let _gate = self
                .shared
                .gate
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            match self.call(WconfdRequest::FreeLocks {
                owner: owner.owner(),
            }) {
                Called::Answer(_) | Called::Failed => return,
                Called::Lost => {}
            }
        }
        self.shared
            .violation("the config client could not free its locks".to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(write: u64, serial_no: u64) -> Value {
        let cluster = if write == 0 {
            json!({})
        } else {
            json!({"cluster_name": cluster_name(write)})
        };
        json!({"cluster": cluster, "serial_no": serial_no})
    }

    #[test]
    fn a_read_is_the_last_acknowledged_write_or_a_lost_later_one() {
        let mut history = ConfigHistory::default();
        history.check(&config(0, 1)).unwrap();
        history.acknowledge(1);
        history.check(&config(0, 1)).unwrap_err();
        history.check(&config(1, 2)).unwrap();
        history.lose(2);
        history.lose(3);
        history.check(&config(1, 2)).unwrap();
        history.check(&config(3, 3)).unwrap();
        // Seen write 3: write 2 and write 1 can never come back.
        history.check(&config(2, 3)).unwrap_err();
        history.check(&config(1, 3)).unwrap_err();
        history.check(&config(3, 2)).unwrap_err();
        history
            .check(&json!({"cluster": {"cluster_name": "other"}, "serial_no": 9}))
            .unwrap_err();
    }
}
