//! `config.data`: the cluster configuration wconfd keeps for its clients
//! (LOCKS.md, "The config lock and the configuration"). wconfd understands
//! only `serial_no` and `mtime`; everything else is kept exactly as
//! written, in its order, so an existing Ganeti `config.data` loads and
//! round-trips.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::{StoreError, atomic_write};

use crate::paths::CONFIG_FILE;

/// Why a configuration was not written.
#[derive(Debug, thiserror::Error)]
pub enum ConfigWriteError {
    /// It would not load again: refused, nothing written.
    #[error("invalid configuration: {}", .0.join("; "))]
    Invalid(Vec<String>),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A write checked by [`ConfigStore::prepare`] and not yet installed.
#[derive(Debug)]
pub struct PreparedWrite {
    config: Value,
    serial: u64,
}

impl PreparedWrite {
    /// The configuration as it would be stored.
    pub fn config(&self) -> &Value {
        &self.config
    }
}

pub struct ConfigStore {
    path: PathBuf,
    config: Value,
}

impl ConfigStore {
    /// Loads `config.data` from `dir`, creating a minimal one if there is
    /// none. A file that is not a valid configuration is an error naming it.
    pub fn open(dir: &Path, now_secs: f64) -> Result<ConfigStore, StoreError> {
        let path = dir.join(CONFIG_FILE);
        let config = match fs::read(&path) {
            Ok(bytes) => {
                let config: Value = serde_json::from_slice(&bytes).map_err(|error| {
                    StoreError::damaged(&path, format!("not valid JSON: {error}"))
                })?;
                let problems = verify(&config);
                if !problems.is_empty() {
                    return Err(StoreError::damaged(&path, problems.join("; ")));
                }
                config
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let config = minimal_config(now_secs);
                let bytes = serde_json::to_vec(&config).expect("JSON to a Vec cannot fail");
                atomic_write(&path, &bytes).map_err(StoreError::io(&path))?;
                config
            }
            Err(error) => return Err(StoreError::io(&path)(error)),
        };
        Ok(ConfigStore { path, config })
    }

    pub fn config(&self) -> &Value {
        &self.config
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the configuration if `new` differs from it in anything but
    /// `serial_no` and `mtime` ([`ConfigStore::prepare`], then
    /// [`ConfigStore::install`]). Answers whether it changed.
    pub fn write(&mut self, new: Value, now_secs: f64) -> Result<bool, ConfigWriteError> {
        match self.prepare(new, now_secs)? {
            Some(prepared) => {
                self.install(prepared)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The first half of a write, which changes nothing: `None` if `new`
    /// differs from the stored configuration only in `serial_no` and
    /// `mtime`; else the configuration to store, with the serial one up
    /// and `mtime` now. A configuration that `verify` rejects is refused:
    /// written, it would stop the next start-up.
    pub fn prepare(
        &self,
        new: Value,
        now_secs: f64,
    ) -> Result<Option<PreparedWrite>, ConfigWriteError> {
        let Value::Object(mut fields) = new else {
            return Err(ConfigWriteError::Invalid(vec![
                "the configuration is not a JSON object".to_owned(),
            ]));
        };
        if content(&fields) == content(self.fields()) {
            return Ok(None);
        }
        let serial = self.serial_no() + 1;
        fields.insert("serial_no".to_owned(), json!(serial));
        fields.insert("mtime".to_owned(), json!(now_secs));
        let config = Value::Object(fields);
        let problems = verify(&config);
        if !problems.is_empty() {
            return Err(ConfigWriteError::Invalid(problems));
        }
        Ok(Some(PreparedWrite { config, serial }))
    }

    /// The second half: replaces the file atomically and durably, then the
    /// configuration kept. A failed write changes neither. `prepared` must
    /// come from this store's `prepare` with nothing installed since.
    pub fn install(&mut self, prepared: PreparedWrite) -> Result<(), io::Error> {
        assert_eq!(
            prepared.serial,
            self.serial_no() + 1,
            "a prepared write is installed on the configuration it was prepared from"
        );
        let bytes = serde_json::to_vec(&prepared.config).expect("JSON to a Vec cannot fail");
        atomic_write(&self.path, &bytes)?;
        self.config = prepared.config;
        Ok(())
    }

    pub fn serial_no(&self) -> u64 {
        self.config
            .get("serial_no")
            .and_then(Value::as_u64)
            .unwrap_or(0)
    }

    fn fields(&self) -> &Map<String, Value> {
        self.config
            .as_object()
            .expect("a loaded configuration is an object")
    }
}

/// The configuration without the fields wconfd itself maintains.
fn content(fields: &Map<String, Value>) -> Map<String, Value> {
    let mut content = fields.clone();
    content.remove("serial_no");
    content.remove("mtime");
    content
}

/// What is wrong with a configuration (`verifyConfig`); empty if nothing.
pub fn verify(config: &Value) -> Vec<String> {
    let Some(fields) = config.as_object() else {
        return vec!["the configuration is not a JSON object".to_owned()];
    };
    let mut problems = Vec::new();
    match fields.get("serial_no") {
        Some(serial) if serial.as_u64().is_some() => {}
        Some(_) => problems.push("serial_no is not a non-negative integer".to_owned()),
        None => problems.push("serial_no is missing".to_owned()),
    }
    if let Some(mtime) = fields.get("mtime")
        && !mtime.is_number()
    {
        problems.push("mtime is not a number".to_owned());
    }
    for section in [
        "cluster",
        "nodes",
        "nodegroups",
        "instances",
        "networks",
        "disks",
    ] {
        if let Some(value) = fields.get(section)
            && !value.is_object()
        {
            problems.push(format!("{section} is not an object"));
        }
    }
    problems
}

/// The configuration of a fresh root: Ganeti's top-level sections, empty.
fn minimal_config(now_secs: f64) -> Value {
    json!({
        "version": 3000000,
        "cluster": {},
        "nodes": {},
        "nodegroups": {},
        "instances": {},
        "networks": {},
        "disks": {},
        "filters": {},
        "serial_no": 1,
        "ctime": now_secs,
        "mtime": now_secs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_created_minimal_and_survives_reopening() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = ConfigStore::open(dir.path(), 10.0).expect("open");
        assert_eq!(store.serial_no(), 1);
        assert!(verify(store.config()).is_empty());
        let again = ConfigStore::open(dir.path(), 20.0).expect("reopen");
        assert_eq!(again.config(), store.config());
    }

    #[test]
    fn writes_bump_the_serial_only_when_something_changed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut store = ConfigStore::open(dir.path(), 10.0).expect("open");
        let mut new = store.config().clone();
        new["cluster"] = json!({"name": "c1"});
        new["serial_no"] = json!(41);
        assert!(store.write(new.clone(), 11.0).expect("write"));
        assert_eq!(store.serial_no(), 2);
        assert_eq!(store.config()["mtime"], json!(11.0));
        assert!(!store.write(new.clone(), 12.0).expect("same content"));
        assert_eq!(store.serial_no(), 2);
        new["nodes"] = json!([]);
        let refused = store.write(new, 13.0).expect_err("invalid");
        assert!(
            refused.to_string().contains("nodes is not an object"),
            "{refused}"
        );
        assert_eq!(store.serial_no(), 2);
        let reopened = ConfigStore::open(dir.path(), 13.0).expect("reopen");
        assert_eq!(reopened.config()["cluster"], json!({"name": "c1"}));
        assert_eq!(reopened.serial_no(), 2);
    }

    #[test]
    fn a_prepared_write_changes_nothing_until_installed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut store = ConfigStore::open(dir.path(), 10.0).expect("open");
        let on_disk = fs::read(store.path()).expect("read");
        let mut new = store.config().clone();
        new["instances"] = json!({"i1": {"name": "web1"}});
        let prepared = store
            .prepare(new.clone(), 11.0)
            .expect("valid")
            .expect("a change");
        assert_eq!(prepared.config()["serial_no"], json!(2));
        assert_eq!(prepared.config()["instances"], new["instances"]);
        // Dropped: nothing was written.
        drop(prepared);
        assert_eq!(store.serial_no(), 1);
        assert_eq!(fs::read(store.path()).expect("read"), on_disk);
        let prepared = store.prepare(new, 12.0).expect("valid").expect("a change");
        store.install(prepared).expect("install");
        assert_eq!(store.serial_no(), 2);
        let reopened = ConfigStore::open(dir.path(), 13.0).expect("reopen");
        assert_eq!(reopened.config(), store.config());
        // The same content again prepares nothing.
        let same = store.config().clone();
        assert!(store.prepare(same, 14.0).expect("valid").is_none());
    }

    #[test]
    fn key_order_and_unknown_fields_round_trip() {
        let dir = tempfile::tempdir().expect("temp dir");
        let text = r#"{"zeta":1,"version":2070000,"cluster":{"b":1,"a":2},"serial_no":5,"mtime":1.5,"alpha":[1,2]}"#;
        fs::write(dir.path().join(CONFIG_FILE), text).expect("write");
        let store = ConfigStore::open(dir.path(), 10.0).expect("open");
        assert_eq!(serde_json::to_string(store.config()).expect("json"), text);
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        for (text, expected) in [
            ("", "not valid JSON"),
            ("{\"serial_no\": 1", "not valid JSON"),
            ("[]", "not a JSON object"),
            ("{\"serial_no\": -1}", "serial_no"),
            ("{\"mtime\": 1}", "serial_no is missing"),
            (
                "{\"serial_no\": 1, \"nodes\": []}",
                "nodes is not an object",
            ),
        ] {
            fs::write(dir.path().join(CONFIG_FILE), text).expect("write");
            let error = ConfigStore::open(dir.path(), 1.0).err().expect(text);
            assert!(error.to_string().contains(CONFIG_FILE), "{error}");
            assert!(error.to_string().contains(expected), "{text}: {error}");
        }
    }
}
