//! The job queue on disk (JOBS.md "Queue on disk"): `<root>/queue` with
//! Ganeti's layout. `serial` (last id handed out, current with every
//! commit of new jobs: see [`SerialFile`]), `version`, `lock` (held
//! by the running luxid), `drain` (present = drained), `job-<id>` per live
//! job, `archive/<id div 10000>/job-<id>` per archived job.
//!
//! Every write is atomic (temp file, fsync, rename); the directory is
//! synced when the set of files changes. Both luxid and the job runner
//! write job files through here: luxid until the runner starts and after it
//! died, the runner in between.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::{Arc, Mutex};

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::jobs::{Job, JobId, Status, Timestamp};
use crate::limits::{QUEUE_LOCK_RETRY_PAUSE, QUEUE_LOCK_WAIT, STALE_TEMP_AGE_MIN};
use crate::paths::{
    ARCHIVE_DIR, DRAIN_FILE, FILTERS_FILE, QUEUE_DIR, QUEUE_LOCK_FILE, SERIAL_FILE, VERSION_FILE,
};
use crate::scheduling::filters::FilterRule;
use crate::store::{StoreError, atomic_write, sync_dir};

/// The queue format this code reads and writes.
pub const QUEUE_VERSION: u32 = 1;
/// Archived jobs are spread over directories of this many ids.
pub const ARCHIVE_IDS_PER_DIR: JobId = 10_000;

/// The serial file's fixed length: the id, left-aligned and padded with
/// spaces to the 20 digits of the largest `u64`, then a newline. Ganeti's
/// readers strip trailing white space (Python's `int`, Haskell's
/// `rStripSpace`), so they read it as the plain number.
const SERIAL_FILE_BYTES: usize = 21;

/// The serial file's content for `serial`: always [`SERIAL_FILE_BYTES`]
/// long.
fn serial_text(serial: JobId) -> [u8; SERIAL_FILE_BYTES] {
    let mut text = [b' '; SERIAL_FILE_BYTES];
    let digits = serial.to_string();
    text[..digits.len()].copy_from_slice(digits.as_bytes());
    text[SERIAL_FILE_BYTES - 1] = b'\n';
    text
}

/// `queue/serial`, kept current while luxid runs: it names the last id
/// handed out once the commit of that id's job returned (Ganeti's layout
/// keeps it so, and tools outside warden read it).
///
/// The file is created once (atomic replace) and then overwritten in
/// place: each commit writes the new value over the old with one
/// positioned write, so no file is created per commit (D41, D42). Every
/// value has the same length, so the file's size and blocks never change
/// after its creation and the write touches only the first bytes of its
/// one block: a crash leaves the old value or the new one, never a mix or
/// a hole (a kill cannot stop a write inside one page half-way; a device
/// writes a sector whole). Even so the serial is never the only record of
/// an id: the commit syncs the job files too, and [`Queue::open`] takes
/// the largest of the serial, the job files and the archive.
struct SerialFile {
    path: PathBuf,
    state: Mutex<SerialState>,
}

struct SerialState {
    /// Open for writing once the file has the fixed length.
    file: Option<File>,
    /// The value the file durably holds (0: none yet).
    written: JobId,
}

/// How an overwrite of the serial is made durable.
#[derive(Clone, Copy, PartialEq)]
enum SerialFlush {
    /// Written to the page cache and its write to the device started;
    /// the caller then waits for it ([`SerialFile::wait_written`]) and
    /// syncs the queue directory after its renames: that journal commit
    /// flushes the device's cache, the serial's block with it (D42). A
    /// group commit does this.
    ByDirectorySync,
    /// `fdatasync` now (luxid's clean stop: no directory sync follows).
    Now,
}

impl SerialFile {
    /// Makes the file name at least `serial` (creating it on first use;
    /// durable once `flush` says). Two commits in flight at once cannot
    /// take it back: a value not above the one written is not written
    /// again.
    fn advance(&self, serial: JobId, flush: SerialFlush) -> io::Result<()> {
        let mut state = self.state();
        if serial <= state.written && state.file.is_some() {
            return Ok(());
        }
        let text = serial_text(serial.max(state.written));
        match &state.file {
            Some(file) => {
                file.write_all_at(&text, 0)?;
                match flush {
                    SerialFlush::ByDirectorySync => {
                        crate::sys::start_write_back(file, 0, SERIAL_FILE_BYTES as u64)?
                    }
                    SerialFlush::Now => file.sync_data()?,
                }
            }
            None => {
                atomic_write(&self.path, &text)?;
                state.file = Some(OpenOptions::new().write(true).open(&self.path)?);
            }
        }
        state.written = state.written.max(serial);
        Ok(())
    }

    /// Waits until the device has taken every overwrite started so far.
    fn wait_written(&self) -> io::Result<()> {
        match &self.state().file {
            Some(file) => crate::sys::wait_written_back(file, 0, SERIAL_FILE_BYTES as u64),
            None => Ok(()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SerialState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A job file name: `job-<id>`.
pub fn job_file_name(id: JobId) -> String {
    format!("job-{id}")
}

/// The id of a job file name, or `None` for any other file (temp files,
/// `serial`, ...).
pub fn parse_job_file_name(name: &str) -> Option<JobId> {
    let digits = name.strip_prefix("job-")?;
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&id| id > 0)
}

/// Where a job's file lives while it is in the queue.
pub fn job_path(queue_dir: &Path, id: JobId) -> PathBuf {
    queue_dir.join(job_file_name(id))
}

/// Where luxid leaves a new priority for a started job's runner (which
/// applies it to its unfinished opcodes, then removes the file).
pub fn priority_request_path(queue_dir: &Path, id: JobId) -> PathBuf {
    queue_dir.join(format!("job-{id}.priority"))
}

/// Where a job's file lives once archived.
pub fn archived_job_path(queue_dir: &Path, id: JobId) -> PathBuf {
    queue_dir
        .join(ARCHIVE_DIR)
        .join((id / ARCHIVE_IDS_PER_DIR).to_string())
        .join(job_file_name(id))
}

/// Reads and decodes a job file; `Ok(None)` when it does not exist.
pub fn read_job_file(path: &Path) -> Result<Option<Job>, StoreError> {
    Ok(read_job_file_bytes(path)?.map(|(job, _)| job))
}

/// A job file decoded, and its bytes.
fn read_job_file_bytes(path: &Path) -> Result<Option<(Job, Vec<u8>)>, StoreError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(StoreError::io(path)(error)),
    };
    let job: Job = serde_json::from_slice(&bytes)
        .map_err(|error| StoreError::damaged(path, format!("not a job file: {error}")))?;
    let named = path
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(parse_job_file_name);
    if named.is_some_and(|id| id != job.id) {
        return Err(StoreError::damaged(
            path,
            format!("holds job {} under another job's name", job.id),
        ));
    }
    if job.ops.is_empty() {
        return Err(StoreError::damaged(path, "a job without opcodes"));
    }
    Ok(Some((job, bytes)))
}

/// A finished job as luxid keeps it in memory: its encoded form, decoded
/// when asked for, and what the queue needs without decoding. A finished
/// job never changes, and a queue holds many of them: as bytes one costs a
/// sixth of its decoded form.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedJob {
    pub id: JobId,
    pub status: Status,
    pub end_timestamp: Option<Timestamp>,
    encoded: Box<[u8]>,
}

impl FinishedJob {
    /// `job` must be final.
    pub fn new(job: &Job) -> FinishedJob {
        FinishedJob::with_encoded(job, encode_job(job))
    }

    fn with_encoded(job: &Job, encoded: Vec<u8>) -> FinishedJob {
        debug_assert!(job.is_final());
        FinishedJob {
            id: job.id,
            status: job.status(),
            end_timestamp: job.end_timestamp,
            encoded: encoded.into_boxed_slice(),
        }
    }

    pub fn job(&self) -> Job {
        serde_json::from_slice(&self.encoded).expect("a finished job was decoded before")
    }
}

/// The encoded form of a job file.
pub fn encode_job(job: &Job) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(job).expect("a job always serializes");
    bytes.push(b'\n');
    bytes
}

/// How a job file is replaced: always atomically (a reader sees the old
/// file or the new one); `Synced` also syncs it before the rename, so the
/// new content survives a crash of the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    Synced,
    /// For states that a crash makes moot (a runner's `waiting`, `running`
    /// and log batches: if the machine dies, so does the runner, and the
    /// job ends `error` whatever its file said).
    Visible,
}

/// Replaces the file of a job that already has one (atomic; the set of
/// files does not change, so the directory is not synced).
pub fn replace_job_file(queue_dir: &Path, job: &Job, how: Durability) -> io::Result<()> {
    let path = job_path(queue_dir, job.id);
    let temp = temp_path(&path);
    let written = match how {
        Durability::Synced => write_synced(&temp, &encode_job(job)),
        Durability::Visible => fs::write(&temp, encode_job(job)),
    };
    let result = written.and_then(|()| fs::rename(&temp, &path));
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// A temp file beside `path`, named for the writing process: luxid and a
/// runner (or two runners, one about to give up its claim) never share
/// one.
fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// Writes and syncs a new temp file; on failure it is removed again (a
/// partial temp file on a full disk would keep the space it took).
fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    let result = file.write_all(bytes).and_then(|()| file.sync_all());
    if result.is_err() {
        drop(file);
        let _ = fs::remove_file(path);
    }
    result
}

/// New jobs on their way to disk ([`Queue::new_commit`]).
pub struct NewJobsCommit {
    dir: PathBuf,
    /// Each job file's final path with its content.
    files: Vec<(PathBuf, Vec<u8>)>,
    /// The queue's serial file and the last id handed out when the
    /// commit was made.
    serial_file: Arc<SerialFile>,
    serial: JobId,
}

impl NewJobsCommit {
    /// Makes the files durable (see [`Queue::commit_new`]).
    pub fn run(&self) -> io::Result<()> {
        // The serial's write to the device runs beside the temp files'
        // syncs and is waited for after them; the directory sync at the
        // end makes it durable (no sync of its own: D42).
        self.serial_file
            .advance(self.serial, SerialFlush::ByDirectorySync)?;
        let written = self.write_temps().and_then(|()| {
            self.serial_file
                .wait_written()
                .inspect_err(|_| self.remove_temps())
        });
        written?;
        self.put_in_place()
    }

    /// Writes and syncs every file as a temp file beside its final path,
    /// in parallel when there are several (one is written on this thread:
    /// handing it to rayon costs a wake-up and a spinning worker). Nothing
    /// anyone reads changes yet: a runner started meanwhile finds no job
    /// file. On failure every temp file is removed (one left on a full
    /// disk would keep the space that is missing).
    fn write_temps(&self) -> io::Result<()> {
        let written: Vec<io::Result<()>> = match self.files.as_slice() {
            [(path, bytes)] => vec![write_synced(&temp_path(path), bytes)],
            files => files
                .par_iter()
                .map(|(path, bytes)| write_synced(&temp_path(path), bytes))
                .collect(),
        };
        match written.into_iter().find_map(Result::err) {
            Some(error) => {
                self.remove_temps();
                Err(error)
            }
            None => Ok(()),
        }
    }

    /// Renames the synced temp files into place, then syncs the
    /// directory. On failure the job files already renamed go again (best
    /// effort): refused jobs must not come back at the next start.
    fn put_in_place(&self) -> io::Result<()> {
        let unrename = |renamed: &[(PathBuf, Vec<u8>)]| {
            for (path, _) in renamed {
                let _ = fs::remove_file(path);
            }
        };
        for (index, (path, _)) in self.files.iter().enumerate() {
            if let Err(error) = fs::rename(temp_path(path), path) {
                unrename(&self.files[..index]);
                self.remove_temps();
                return Err(error);
            }
        }
        sync_dir(&self.dir).inspect_err(|_| unrename(&self.files))
    }

    fn remove_temps(&self) {
        for (path, _) in &self.files {
            let _ = fs::remove_file(temp_path(path));
        }
    }
}

/// What luxid found in the queue at start-up.
pub struct Loaded {
    /// Unfinished jobs of the queue, by id.
    pub jobs: Vec<Job>,
    /// Finished jobs of the queue (not archived), by id.
    pub finished: Vec<FinishedJob>,
    /// The livelocks finished jobs name that still exist: a runner killed
    /// between its final write and its exit leaves its file behind.
    pub finished_livelocks: Vec<PathBuf>,
    /// Job files that could not be read: each is logged and left alone.
    pub skipped: Vec<StoreError>,
}

/// The queue of one root, held by one luxid.
pub struct Queue {
    dir: PathBuf,
    /// The flock on `queue/lock`, held for luxid's life.
    _lock: File,
    /// The last id handed out (in memory; durable once committed).
    serial: JobId,
    serial_file: Arc<SerialFile>,
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("another luxid is running on this queue (it holds {0})")]
    AlreadyRunning(PathBuf),
}

impl Queue {
    /// Opens (creating if needed) the queue under `root`, takes its lock
    /// and reads every job file (in parallel).
    pub fn open(root: &Path) -> Result<(Queue, Loaded), QueueError> {
        let dir = root.join(QUEUE_DIR);
        for path in [&dir, &dir.join(ARCHIVE_DIR)] {
            match fs::create_dir(path) {
                Ok(()) => sync_dir(path.parent().expect("under the root"))
                    .map_err(StoreError::io(path))?,
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
                Err(error) => return Err(StoreError::io(path)(error).into()),
            }
        }
        let lock_path = dir.join(QUEUE_LOCK_FILE);
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(StoreError::io(&lock_path))?;
        // A luxid killed while it spawned a runner leaves the child a copy
        // of the lock's descriptor until the child's exec closes it: wait
        // out that moment before calling the queue taken.
        let deadline = std::time::Instant::now() + QUEUE_LOCK_WAIT;
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(QUEUE_LOCK_RETRY_PAUSE);
                }
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(QueueError::AlreadyRunning(lock_path));
                }
                Err(fs::TryLockError::Error(error)) => {
                    return Err(StoreError::io(&lock_path)(error).into());
                }
            }
        }
        check_version(&dir)?;
        let serial_path = dir.join(SERIAL_FILE);
        let (serial, serial_bytes) = read_serial(&serial_path)?;
        let (loaded, highest) = scan(&dir)?;
        // A serial file of the fixed length is written in place from now
        // on; any other (none yet, or one written by an older luxid or by
        // Ganeti) is replaced whole by the first commit.
        let file = if serial_bytes == SERIAL_FILE_BYTES {
            Some(
                OpenOptions::new()
                    .write(true)
                    .open(&serial_path)
                    .map_err(StoreError::io(&serial_path))?,
            )
        } else {
            None
        };
        let serial_file = Arc::new(SerialFile {
            path: serial_path,
            state: Mutex::new(SerialState {
                file,
                written: serial,
            }),
        });
        let mut queue = Queue {
            serial,
            dir,
            _lock: lock,
            serial_file,
        };
        // The serial file is current up to the last commit that returned;
        // a job file may be newer (a commit cut short after its renames),
        // or the serial file may be gone or older (removed, or written by
        // a luxid before D42). A damaged job file counts too (a new job
        // must not replace it), and so does the archive (a lost serial
        // must not hand out an archived job's id again): ids never go
        // backwards.
        let archived = queue.archived_ids().last().copied().unwrap_or(0);
        queue.serial = serial.max(highest).max(archived);
        Ok((queue, loaded))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn serial(&self) -> JobId {
        self.serial
    }

    /// Hands out the next id (durable with the next [`Queue::commit_new`]).
    pub fn next_id(&mut self) -> JobId {
        self.serial += 1;
        self.serial
    }

    /// Writes the last id handed out to `serial`, durably (at luxid's
    /// clean stop). Every commit of new jobs already did (D42), so this
    /// writes only if an id was handed out since the last commit that
    /// returned (one whose commit failed). Nothing is written before the
    /// first id.
    pub fn save_serial(&self) -> io::Result<()> {
        if self.serial == 0 {
            return Ok(());
        }
        self.serial_file.advance(self.serial, SerialFlush::Now)
    }

    /// Makes new jobs durable together: every job file is written to a
    /// temp file and synced in parallel (the syncs overlap in the device),
    /// while the serial file is overwritten in place with the last id
    /// handed out and written to the device; then the job files are
    /// renamed into place, then the directory is synced once, which
    /// flushes the device's cache and with it the serial. No file is created for the
    /// serial on a submission's way (D41, D42): it is written in place.
    pub fn commit_new(&self, jobs: &[Job]) -> io::Result<()> {
        self.new_commit(jobs).run()
    }

    /// [`Queue::commit_new`] as a value that owns what it writes, to run
    /// on another thread: luxid starts the new jobs' runners meanwhile.
    pub fn new_commit(&self, jobs: &[Job]) -> NewJobsCommit {
        let files = jobs
            .iter()
            .map(|job| (job_path(&self.dir, job.id), encode_job(job)))
            .collect();
        NewJobsCommit {
            dir: self.dir.clone(),
            files,
            serial_file: Arc::clone(&self.serial_file),
            serial: self.serial,
        }
    }

    /// Rewrites the file of a job luxid owns (not started, or its runner
    /// is dead).
    pub fn write_job(&self, job: &Job) -> io::Result<()> {
        replace_job_file(&self.dir, job, Durability::Synced)
    }

    pub fn read_job(&self, id: JobId) -> Result<Option<Job>, StoreError> {
        read_job_file(&job_path(&self.dir, id))
    }

    pub fn read_archived(&self, id: JobId) -> Result<Option<Job>, StoreError> {
        read_job_file(&archived_job_path(&self.dir, id))
    }

    /// Every archived job id, for a query of all jobs including archived.
    pub fn archived_ids(&self) -> Vec<JobId> {
        let mut ids = Vec::new();
        let Ok(dirs) = fs::read_dir(self.dir.join(ARCHIVE_DIR)) else {
            return ids;
        };
        for dir in dirs.flatten() {
            let Ok(files) = fs::read_dir(dir.path()) else {
                continue;
            };
            ids.extend(
                files
                    .flatten()
                    .filter_map(|file| parse_job_file_name(file.file_name().to_str()?)),
            );
        }
        ids.sort_unstable();
        ids
    }

    /// Moves a job's file into the archive, durably.
    pub fn archive(&self, id: JobId) -> io::Result<()> {
        let target = archived_job_path(&self.dir, id);
        let target_dir = target.parent().expect("archive paths have a directory");
        match fs::create_dir(target_dir) {
            Ok(()) => sync_dir(&self.dir.join(ARCHIVE_DIR))?,
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(error),
        }
        fs::rename(job_path(&self.dir, id), &target)?;
        sync_dir(target_dir)?;
        sync_dir(&self.dir)
    }

    pub fn is_drained(&self) -> bool {
        self.dir.join(DRAIN_FILE).exists()
    }

    pub fn set_drained(&self, drained: bool) -> io::Result<()> {
        let path = self.dir.join(DRAIN_FILE);
        if drained {
            atomic_write(&path, b"")
        } else {
            match fs::remove_file(&path) {
                Ok(()) => sync_dir(&self.dir),
                Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(error) => Err(error),
            }
        }
    }
}

impl Queue {
    /// The job filter rules (SCHEDULING.md); none if the file is absent.
    /// A file that cannot be read whole, or a rule in it that luxid would
    /// refuse from a client, is damaged: luxid does not start on it.
    pub fn read_filters(&self) -> Result<Vec<FilterRule>, StoreError> {
        let path = self.dir.join(FILTERS_FILE);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(StoreError::io(&path)(error)),
        };
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|error| StoreError::damaged(&path, format!("not JSON: {error}")))?;
        let Some(rules) = value.get("rules").and_then(serde_json::Value::as_array) else {
            return Err(StoreError::damaged(&path, "no list of \"rules\""));
        };
        rules
            .iter()
            .enumerate()
            .map(|(index, rule)| {
                decode_stored_rule(rule)
                    .map_err(|what| StoreError::damaged(&path, format!("rule {index}: {what}")))
            })
            .collect()
    }

    /// Replaces the stored filter rules, atomically and durably.
    pub fn write_filters(&self, rules: &[FilterRule]) -> io::Result<()> {
        let rules: Vec<serde_json::Value> = rules.iter().map(FilterRule::to_json).collect();
        let mut bytes =
            serde_json::to_vec(&serde_json::json!({ "rules": rules })).map_err(io::Error::other)?;
        bytes.push(b'\n');
        atomic_write(&self.dir.join(FILTERS_FILE), &bytes)
    }
}

/// A rule as [`FilterRule::to_json`] wrote it.
fn decode_stored_rule(rule: &serde_json::Value) -> Result<FilterRule, String> {
    let text = |name: &str| {
        rule.get(name)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("no text {name:?}"))
    };
    let uuid = text("uuid")?;
    let watermark = rule
        .get("watermark")
        .and_then(serde_json::Value::as_u64)
        .ok_or("no watermark")?;
    let part = |name: &str| rule.get(name).ok_or_else(|| format!("no {name:?}"));
    let parts =
        crate::scheduling::decode_rule(part("priority")?, part("predicates")?, part("action")?)?;
    let reason_trail = part("reason_trail")?.clone();
    Ok(FilterRule::new(uuid, watermark, parts, reason_trail))
}

fn check_version(dir: &Path) -> Result<(), StoreError> {
    let path = dir.join(VERSION_FILE);
    match fs::read_to_string(&path) {
        Ok(text) if text.trim() == QUEUE_VERSION.to_string() => Ok(()),
        Ok(text) => Err(StoreError::damaged(
            &path,
            format!(
                "queue format '{}' is not the one this luxid reads ({QUEUE_VERSION})",
                text.trim()
            ),
        )),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            atomic_write(&path, format!("{QUEUE_VERSION}\n").as_bytes())
                .map_err(StoreError::io(&path))
        }
        Err(error) => Err(StoreError::io(&path)(error)),
    }
}

/// The serial file's id and its length in bytes (0 and 0 if there is
/// none).
fn read_serial(path: &Path) -> Result<(JobId, usize), StoreError> {
    match fs::read_to_string(path) {
        Ok(text) => text
            .trim()
            .parse()
            .map(|serial| (serial, text.len()))
            .map_err(|_| StoreError::damaged(path, format!("not a job id: '{}'", text.trim()))),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok((0, 0)),
        Err(error) => Err(StoreError::io(path)(error)),
    }
}

/// Reads every `job-<id>` file of the queue directory in parallel; answers
/// them with the highest id named by a job file (read or skipped). Temp
/// files left by a crash are removed once they are old (they were never
/// renamed into place, so nothing acknowledged depends on them; a young
/// one may be a live runner's write in progress).
fn scan(dir: &Path) -> Result<(Loaded, JobId), StoreError> {
    let mut names = Vec::new();
    let mut highest = 0;
    for entry in fs::read_dir(dir).map_err(StoreError::io(dir))? {
        let entry = entry.map_err(StoreError::io(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with("job-") && name.ends_with(".tmp") {
            let old = entry
                .metadata()
                .and_then(|metadata| metadata.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok())
                .is_some_and(|age| age >= STALE_TEMP_AGE_MIN);
            if old {
                let _ = fs::remove_file(entry.path());
            }
        } else if let Some(id) = parse_job_file_name(name) {
            highest = highest.max(id);
            names.push(entry.path());
        }
    }
    // Finished jobs are kept encoded from the start, so the decoded form of
    // the whole queue never exists at once.
    type Scanned = Result<Job, (FinishedJob, Option<PathBuf>)>;
    let results: Vec<Result<Option<Scanned>, StoreError>> = names
        .par_iter()
        .map(|path| {
            Ok(read_job_file_bytes(path)?.map(|(job, bytes)| {
                if job.is_final() {
                    let left = job
                        .livelock
                        .as_ref()
                        .map(PathBuf::from)
                        .filter(|livelock| fs::symlink_metadata(livelock).is_ok());
                    Err((FinishedJob::with_encoded(&job, bytes), left))
                } else {
                    Ok(job)
                }
            }))
        })
        .collect();
    let mut loaded = Loaded {
        jobs: Vec::new(),
        finished: Vec::with_capacity(results.len()),
        finished_livelocks: Vec::new(),
        skipped: Vec::new(),
    };
    for result in results {
        match result {
            Ok(Some(Ok(job))) => loaded.jobs.push(job),
            Ok(Some(Err((finished, left)))) => {
                loaded.finished.push(finished);
                loaded.finished_livelocks.extend(left);
            }
            Ok(None) => {}
            Err(error) => loaded.skipped.push(error),
        }
    }
    loaded.jobs.sort_unstable_by_key(|job| job.id);
    loaded.finished.sort_unstable_by_key(|job| job.id);
    Ok((loaded, highest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::QueuedOpcode;
    use serde_json::json;

    fn job(id: JobId) -> Job {
        Job {
            id,
            ops: vec![QueuedOpcode::new(
                json!({"OP_ID": "OP_TEST_DELAY", "duration": 0.1}),
                0,
            )],
            received_timestamp: None,
            start_timestamp: None,
            end_timestamp: None,
            livelock: None,
            process_id: None,
            workers: Vec::new(),
        }
    }

    #[test]
    fn job_file_names() {
        assert_eq!(parse_job_file_name("job-17"), Some(17));
        for name in ["job-", "job-0", "job-1.tmp", "job--1", "serial", "job-1a"] {
            assert_eq!(parse_job_file_name(name), None, "{name}");
        }
        assert_eq!(
            archived_job_path(Path::new("/q"), 12_345),
            Path::new("/q/archive/1/job-12345")
        );
    }

    #[test]
    fn new_jobs_and_their_ids_survive_a_reopen() {
        let root = tempfile::tempdir().unwrap();
        let (mut queue, loaded) = Queue::open(root.path()).unwrap();
        assert!(loaded.jobs.is_empty());
        let jobs: Vec<Job> = (0..3).map(|_| job(queue.next_id())).collect();
        queue.commit_new(&jobs).unwrap();
        // As if luxid was killed: no clean stop.
        drop(queue);
        let (queue, loaded) = Queue::open(root.path()).unwrap();
        assert_eq!(queue.serial(), 3);
        assert_eq!(loaded.jobs, jobs);
        assert!(loaded.finished.is_empty());
    }

    #[test]
    fn a_saved_serial_outlives_removed_job_files() {
        let root = tempfile::tempdir().unwrap();
        let (mut queue, _) = Queue::open(root.path()).unwrap();
        queue.save_serial().unwrap();
        assert!(!queue.dir().join(SERIAL_FILE).exists(), "no id yet");
        let jobs = [job(queue.next_id()), job(queue.next_id())];
        queue.commit_new(&jobs).unwrap();
        queue.save_serial().unwrap();
        drop(queue);
        for id in [1, 2] {
            fs::remove_file(job_path(&root.path().join(QUEUE_DIR), id)).unwrap();
        }
        let (mut queue, _) = Queue::open(root.path()).unwrap();
        assert_eq!(queue.next_id(), 3);
    }

    fn serial_on_disk(queue: &Queue) -> String {
        fs::read_to_string(queue.dir().join(SERIAL_FILE)).unwrap()
    }

    #[test]
    fn the_serial_file_names_the_last_id_after_every_commit() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let (mut queue, _) = Queue::open(root.path()).unwrap();
        let path = queue.dir().join(SERIAL_FILE);
        assert!(!path.exists(), "no id handed out yet");
        let first = job(queue.next_id());
        queue.commit_new(&[first]).unwrap();
        assert_eq!(serial_on_disk(&queue).trim(), "1");
        let inode = fs::metadata(&path).unwrap().ino();
        for expected in 2..=12u64 {
            let jobs: Vec<Job> = (0..2).map(|_| job(queue.next_id())).collect();
            queue.commit_new(&jobs).unwrap();
            let text = serial_on_disk(&queue);
            assert_eq!(text.trim(), (expected * 2 - 1).to_string(), "{text:?}");
            // Written in place: the same file, the same length, and as
            // Ganeti's readers read it (trailing white space stripped).
            assert_eq!(text.len(), SERIAL_FILE_BYTES, "{text:?}");
            assert!(text.ends_with('\n') && !text.starts_with(' '), "{text:?}");
            assert_eq!(fs::metadata(&path).unwrap().ino(), inode);
        }
        assert!(!queue.dir().join("serial.tmp").exists());
        // After a kill (no clean stop) the file tells, job files removed.
        drop(queue);
        for entry in fs::read_dir(root.path().join(QUEUE_DIR)).unwrap() {
            let entry = entry.unwrap();
            if parse_job_file_name(entry.file_name().to_str().unwrap()).is_some() {
                fs::remove_file(entry.path()).unwrap();
            }
        }
        let (mut queue, _) = Queue::open(root.path()).unwrap();
        assert_eq!(queue.next_id(), 24);
    }

    #[test]
    fn an_old_serial_file_is_replaced_whole_then_written_in_place() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join(QUEUE_DIR);
        fs::create_dir_all(&dir).unwrap();
        // As an older luxid or Ganeti writes it.
        fs::write(dir.join(SERIAL_FILE), b"7\n").unwrap();
        let (mut queue, _) = Queue::open(root.path()).unwrap();
        assert_eq!(queue.serial(), 7);
        let id = queue.next_id();
        queue.commit_new(&[job(id)]).unwrap();
        assert_eq!(serial_on_disk(&queue).trim(), "8");
        assert_eq!(serial_on_disk(&queue).len(), SERIAL_FILE_BYTES);
        let inode = fs::metadata(dir.join(SERIAL_FILE)).unwrap().ino();
        drop(queue);
        let (mut queue, _) = Queue::open(root.path()).unwrap();
        let id = queue.next_id();
        assert_eq!(id, 9);
        queue.commit_new(&[job(id)]).unwrap();
        assert_eq!(serial_on_disk(&queue).trim(), "9");
        assert_eq!(fs::metadata(dir.join(SERIAL_FILE)).unwrap().ino(), inode);
    }

    #[test]
    fn commits_finishing_out_of_order_never_take_the_serial_back() {
        let root = tempfile::tempdir().unwrap();
        let (mut queue, _) = Queue::open(root.path()).unwrap();
        let first = job(queue.next_id());
        let early = queue.new_commit(&[first]);
        let second = job(queue.next_id());
        let late = queue.new_commit(&[second]);
        late.run().unwrap();
        early.run().unwrap();
        assert_eq!(serial_on_disk(&queue).trim(), "2");
    }

    #[test]
    fn every_serial_text_has_the_fixed_length() {
        for serial in [0, 1, 9, 10, 123_456, u64::MAX] {
            let text = serial_text(serial);
            let text = std::str::from_utf8(&text).unwrap();
            assert_eq!(text.len(), SERIAL_FILE_BYTES);
            assert_eq!(text.trim_end().parse::<u64>().unwrap(), serial);
        }
    }

    #[test]
    fn a_second_opener_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let _first = Queue::open(root.path()).unwrap();
        assert!(matches!(
            Queue::open(root.path()),
            Err(QueueError::AlreadyRunning(_))
        ));
    }

    #[test]
    fn serial_never_goes_behind_a_job_file() {
        let root = tempfile::tempdir().unwrap();
        let (queue, _) = Queue::open(root.path()).unwrap();
        // A serial saved at a clean stop, then a job written.
        atomic_write(&queue.dir().join(SERIAL_FILE), b"4\n").unwrap();
        queue.write_job(&job(9)).unwrap();
        drop(queue);
        let (mut queue, loaded) = Queue::open(root.path()).unwrap();
        assert_eq!(loaded.jobs.len(), 1);
        assert_eq!(queue.next_id(), 10);
    }

    #[test]
    fn serial_never_goes_behind_a_damaged_or_archived_job() {
        let root = tempfile::tempdir().unwrap();
        let (queue, _) = Queue::open(root.path()).unwrap();
        queue.commit_new(&[job(1), job(2)]).unwrap();
        queue.archive(2).unwrap();
        fs::write(queue.dir().join("job-7"), b"{garbage").unwrap();
        drop(queue);
        let (mut queue, loaded) = Queue::open(root.path()).unwrap();
        assert_eq!(loaded.skipped.len(), 1);
        assert_eq!(queue.next_id(), 8);
        fs::remove_file(queue.dir().join("job-7")).unwrap();
        drop(queue);
        let (mut queue, _) = Queue::open(root.path()).unwrap();
        assert_eq!(queue.next_id(), 3, "archived job 2 keeps its id");
    }

    #[test]
    fn a_failed_commit_leaves_no_file_behind() {
        let root = tempfile::tempdir().unwrap();
        let (mut queue, _) = Queue::open(root.path()).unwrap();
        let jobs = [job(queue.next_id()), job(queue.next_id())];
        // The second job's temp file cannot be created: a directory is in
        // its place.
        let blocked = temp_path(&job_path(queue.dir(), 2));
        fs::create_dir(&blocked).unwrap();
        queue.commit_new(&jobs).unwrap_err();
        fs::remove_dir(&blocked).unwrap();
        let mut names: Vec<String> = fs::read_dir(queue.dir())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        // The serial may name the refused ids (it never goes back).
        names.retain(|name| name != SERIAL_FILE);
        assert_eq!(names, ["archive", "lock", "version"]);
    }

    #[test]
    fn a_damaged_job_file_is_skipped_and_named() {
        let root = tempfile::tempdir().unwrap();
        let (queue, _) = Queue::open(root.path()).unwrap();
        queue.commit_new(&[job(1)]).unwrap();
        fs::write(queue.dir().join("job-2"), b"{garbage").unwrap();
        drop(queue);
        let (_, loaded) = Queue::open(root.path()).unwrap();
        assert_eq!(loaded.jobs.len(), 1);
        assert_eq!(loaded.skipped.len(), 1);
        assert!(loaded.skipped[0].to_string().contains("job-2"));
    }

    #[test]
    fn archive_moves_the_file_and_keeps_it_readable() {
        let root = tempfile::tempdir().unwrap();
        let (queue, _) = Queue::open(root.path()).unwrap();
        queue.commit_new(&[job(1)]).unwrap();
        queue.archive(1).unwrap();
        assert_eq!(queue.read_job(1).unwrap(), None);
        assert_eq!(queue.read_archived(1).unwrap(), Some(job(1)));
        assert_eq!(queue.archived_ids(), [1]);
    }

    #[test]
    fn drain_flag_is_a_file() {
        let root = tempfile::tempdir().unwrap();
        let (queue, _) = Queue::open(root.path()).unwrap();
        assert!(!queue.is_drained());
        queue.set_drained(true).unwrap();
        assert!(queue.is_drained());
        queue.set_drained(false).unwrap();
        assert!(!queue.is_drained());
    }
}
