//! Livelock files and the death probe (LIVENESS.md).
//!
//! A process proves it is alive by holding a lock on its livelock file in
//! `<root>/livelocks/`: warden's processes an exclusive flock ([`Livelock`]),
//! Ganeti's own clients a POSIX write lock (`fcntl.lockf`). [`is_dead`] asks
//! the kernel whether anyone still holds either, without blocking and without
//! disturbing the holder; pids are never trusted.
//!
//! Rules this module keeps, which the daemons rely on:
//! - Nothing here ever follows a symlink at the last component of a livelock
//!   path, or blocks; the probe and stale removal only open what they found
//!   to be a regular file (and check again on the open descriptor).
//! - A file is only ever removed while the remover holds its exclusive flock
//!   and after checking that the name still refers to the file it locked, so
//!   a removal can never take away the file of a process that has locked it.
//! - Probing from a process that itself holds POSIX locks on the probed file
//!   would drop them (closing any descriptor of a file drops the process's
//!   POSIX locks on it); warden's daemons lock with flock only.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{self, File, Metadata, OpenOptions, TryLockError};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::libc;

use crate::limits::{
    LIVELOCK_CREATE_ATTEMPTS, LIVELOCK_CREATE_RETRY_PAUSE, LIVELOCK_NAME_BYTES_MAX,
    LIVELOCK_STALE_AGE_MIN,
};
use crate::sys;

/// The livelock file name of a job's runner: `job_<id zero-padded to 6>_<unix
/// secs>`, as Ganeti names it (`job_000042_1700000000`).
pub fn job_livelock_name(job_id: u64, unix_secs: u64) -> String {
    format!("job_{job_id:06}_{unix_secs}")
}

/// The livelock file name of a daemon: `<daemon>_<unix secs>`, for example
/// `wconf-daemon_1700000000` or `luxi-daemon_1700000000`.
pub fn daemon_livelock_name(daemon: &str, unix_secs: u64) -> String {
    format!("{daemon}_{unix_secs}")
}

/// Whether `name` can be the name of a file directly inside the livelock
/// directory: not empty, not `.` or `..`, no `/` or NUL, at most
/// [`LIVELOCK_NAME_BYTES_MAX`] bytes.
fn is_livelock_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= LIVELOCK_NAME_BYTES_MAX
        && name != b"."
        && name != b".."
        && !name.contains(&b'/')
        && !name.contains(&0)
}

/// Whether an owner's livelock `path` (as sent on the wire) is acceptable:
/// exactly `<livelock_dir>/<name>`, absolute, with `name` a plain file name
/// (see LOCKS.md "Lock owners").
///
/// Only direct children of the directory are allowed, never files in
/// subdirectories: stale removal only ever looks at direct children
/// (LIVENESS.md "The probe"), and a single level makes "inside the
/// directory" a purely lexical fact. The comparison is on the spelling:
/// `.`/`..` components, doubled or trailing slashes and NUL bytes are
/// refused (two spellings of one file would otherwise make two owners).
/// `livelock_dir` is compared after lexical clean-up of its own spelling;
/// it must be absolute (the daemon makes its root absolute at start-up),
/// otherwise every path is refused. Symlinks are not resolved here; the
/// probe never follows a symlink at the file name itself.
pub fn livelock_path_allowed(livelock_dir: &Path, path: &str) -> bool {
    let Some(dir) = clean_absolute(livelock_dir) else {
        return false;
    };
    let Some((head, name)) = rsplit_once_byte(path.as_bytes(), b'/') else {
        return false;
    };
    // `dir` is "/" or has no trailing slash, so `<dir>/<name>` has head
    // `dir` (or "" when `dir` is the root directory).
    let dir_bytes = dir.as_os_str().as_bytes();
    let head_matches = if dir_bytes == b"/" {
        head.is_empty()
    } else {
        head == dir_bytes
    };
    head_matches && is_livelock_name(name)
}

/// The spelling of an absolute path without `.` components and repeated or
/// trailing slashes; `None` if it is relative or has `..` components.
fn clean_absolute(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return None;
    }
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::RootDir | Component::Normal(_) => clean.push(component),
            Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(clean)
}

/// `bytes` split at its last `separator` (std has `rsplit_once` only for
/// `str`).
fn rsplit_once_byte(bytes: &[u8], separator: u8) -> Option<(&[u8], &[u8])> {
    let at = bytes.iter().rposition(|&b| b == separator)?;
    Some((&bytes[..at], &bytes[at + 1..]))
}

/// Opens an existing livelock file for probing: read-only, close-on-exec
/// (std's default), never following a symlink at the last component
/// (`O_NOFOLLOW`: the probe must not lock files elsewhere on behalf of
/// whoever placed a link), and never blocking in `open` (`O_NONBLOCK`: a FIFO
/// at the path would otherwise block until a writer appears).
fn open_for_probe(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// Whether two metadata describe the same file (device and inode).
fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// The death probe of LIVENESS.md "The probe": true iff `path` does not
/// exist, or a non-blocking shared flock on it succeeds *and* no other
/// process holds a POSIX write lock on it.
///
/// Never blocks and never disturbs the holder: a shared flock it obtained is
/// released at once (by closing its own descriptor), and POSIX locks are only
/// queried. Anything doubtful counts as alive and is logged with a warning:
/// a symlink at `path` (it is never followed), anything but a regular file
/// (it is not even opened, so devices see no open), permission or I/O
/// errors. Wrongly "alive" only delays freeing locks; wrongly "dead" would
/// free them under a running process.
pub fn is_dead(path: &Path) -> bool {
    match probe(path) {
        Ok(dead) => dead,
        Err(error) => {
            tracing::warn!(
                path = %path.display(),
                %error,
                "livelock probe failed; counting its owner as alive"
            );
            false
        }
    }
}

/// [`is_dead`] with its doubts as errors.
fn probe(path: &Path) -> io::Result<bool> {
    match fs::symlink_metadata(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(true),
        Err(error) => return Err(error),
        Ok(metadata) if !metadata.file_type().is_file() => {
            return Err(not_a_regular_file(&metadata));
        }
        Ok(_) => {}
    }
    let file = match open_for_probe(path) {
        // Removed since the check above: its owner released it.
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(true),
        Err(error) => return Err(error),
        Ok(file) => file,
    };
    // Replaced by something else since the check above.
    let metadata = file.metadata()?;
    if !metadata.file_type().is_file() {
        return Err(not_a_regular_file(&metadata));
    }
    match file.try_lock_shared() {
        Err(TryLockError::WouldBlock) => return Ok(false),
        Err(TryLockError::Error(error)) => return Err(error),
        Ok(()) => {}
    }
    let posix_holder = sys::posix_write_lock_holder(&file)?;
    // Dropping `file` closes our only descriptor of this open file
    // description, which releases the shared flock.
    drop(file);
    Ok(posix_holder.is_none())
}

fn not_a_regular_file(metadata: &Metadata) -> io::Error {
    let file_type = metadata.file_type();
    let kind = if file_type.is_symlink() {
        "a symlink, which is never followed"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    };
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("a livelock must be a regular file; this is {kind}"),
    )
}

/// A livelock held by this process: a regular file directly inside the
/// livelock directory, with an exclusive flock on it for as long as this
/// value lives (flock locks belong to the open file description, so the
/// lock also lives in any process that inherited the descriptor, see
/// [`Livelock::hand_on_to_children`]).
///
/// Dropping it releases the lock but leaves the file (it is then stale and
/// [`remove_stale_livelocks`] removes it); [`Livelock::release`] removes it.
#[derive(Debug)]
pub struct Livelock {
    file: File,
    path: PathBuf,
}

impl Livelock {
    /// Creates `<dir>/<name>` (mode 0600, before the umask) and takes an
    /// exclusive flock on it, without blocking. `dir` must exist.
    ///
    /// A stale file of the same name (a process that died in the same second
    /// left it) is taken over: the file is opened without `O_EXCL` and
    /// without truncation, and whoever gets its flock owns it. A name held by
    /// a live process gives an error of kind `WouldBlock`. After locking, the
    /// name is checked to still refer to the locked file (a stale removal may
    /// have removed it in between); if not, creation starts over. Both
    /// retries are bounded ([`LIVELOCK_CREATE_ATTEMPTS`]).
    ///
    /// The name must be a plain file name (`InvalidInput` otherwise); a
    /// symlink or anything but a regular file at the name is an error.
    pub fn create(dir: &Path, name: &str) -> io::Result<Livelock> {
        if !is_livelock_name(name.as_bytes()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name:?} is not a valid livelock file name"),
            ));
        }
        let path = dir.join(name);
        let mut last_error = None;
        for attempt in 0..LIVELOCK_CREATE_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(LIVELOCK_CREATE_RETRY_PAUSE);
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&path)?;
            let metadata = file.metadata()?;
            if !metadata.file_type().is_file() {
                return Err(not_a_regular_file(&metadata));
            }
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    last_error = Some(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        format!("livelock {} is held by another process", path.display()),
                    ));
                    continue;
                }
                Err(TryLockError::Error(error)) => return Err(error),
            }
            match fs::symlink_metadata(&path) {
                Ok(now) if same_file(&now, &metadata) => {
                    return Ok(Livelock { file, path });
                }
                // Removed or replaced between our open and our lock: the file
                // we locked is not the one the name refers to.
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
            last_error = Some(io::Error::other(format!(
                "livelock {} was removed or replaced while being created",
                path.display()
            )));
        }
        Err(last_error.expect("LIVELOCK_CREATE_ATTEMPTS is at least 1, and every retry sets it"))
    }

    /// The livelock's path (`<dir>/<name>` as given to
    /// [`create`](Self::create)).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the livelock's descriptor survive `exec` (clears close-on-exec),
    /// so every process the caller starts from now on inherits it and keeps
    /// the job alive while it runs (LIVENESS.md "Livelock files").
    ///
    /// Only a job's runner does this, on purpose; every other descriptor
    /// stays close-on-exec. The children must not close the descriptor
    /// (they need not know of it), and the runner must start them in the
    /// job's process group so that cancel-with-kill reaches them all.
    pub fn hand_on_to_children(&self) -> io::Result<()> {
        sys::set_close_on_exec(&self.file, false)
    }

    /// Releases the livelock: removes the file while still holding the lock,
    /// then closes it (which releases the lock, unless children that
    /// inherited the descriptor still run: release only after they ended).
    ///
    /// If the name no longer refers to this livelock's file (someone removed
    /// or replaced it behind our back), nothing is removed and an error says
    /// so; the lock is released either way.
    pub fn release(self) -> io::Result<()> {
        let ours = self.file.metadata()?;
        match fs::symlink_metadata(&self.path) {
            Ok(current) if same_file(&current, &ours) => fs::remove_file(&self.path),
            Ok(_) => Err(io::Error::other(format!(
                "livelock {} was replaced by another file; left it in place",
                self.path.display()
            ))),
            Err(error) => Err(error),
        }
        // `self.file` is dropped here, after the removal: closing it
        // releases the flock.
    }
}

impl AsFd for Livelock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Removes the stale livelock files of `dir`: regular files directly inside
/// it that are not `referenced`, are dead by the probe, and were last
/// modified at least [`LIVELOCK_STALE_AGE_MIN`] ago. Returns the paths
/// removed (as `dir.join(name)`).
///
/// `referenced` holds the livelock paths of known owners; they are compared
/// by directory (after lexical clean-up, as in [`livelock_path_allowed`])
/// and file name, so any spelling of a path directly inside `dir` counts.
///
/// Never removes directories, symlinks (dangling or not; never followed) or
/// anything else but a regular file, never looks below `dir`. Each removal
/// holds the file's exclusive flock (taken without blocking) while it checks
/// for POSIX locks and age, checks that the name still refers to the locked
/// file, and unlinks it, so it cannot race with a process creating or taking
/// over the same name. The age rule covers processes that create their file
/// first and lock it a moment later (Ganeti's clients).
///
/// An error reading `dir` itself is returned; a failure on one entry is
/// logged with a warning and the entry is left alone.
pub fn remove_stale_livelocks(
    dir: &Path,
    referenced: &HashSet<PathBuf>,
) -> io::Result<Vec<PathBuf>> {
    let dir_clean = clean_for_comparison(dir);
    let referenced_names: HashSet<&OsStr> = referenced
        .iter()
        .filter(|path| {
            path.parent()
                .is_some_and(|parent| clean_for_comparison(parent) == dir_clean)
        })
        .filter_map(|path| path.file_name())
        .collect();
    let now = SystemTime::now();
    let mut removed = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot read livelock directory entry");
                continue;
            }
        };
        let name = entry.file_name();
        if referenced_names.contains(name.as_os_str()) {
            continue;
        }
        // Not following symlinks: `DirEntry::file_type` is the entry's own
        // type.
        match entry.file_type() {
            Ok(file_type) if file_type.is_file() => {}
            Ok(_) => continue,
            Err(error) => {
                tracing::warn!(path = %entry.path().display(), %error, "cannot stat livelock file");
                continue;
            }
        }
        let path = entry.path();
        match remove_if_stale(&path, now) {
            Ok(true) => removed.push(path),
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(
                    path = %path.display(),
                    %error,
                    "cannot check livelock file for staleness; leaving it"
                );
            }
        }
    }
    Ok(removed)
}

/// The spelling of a path used to compare directories in
/// [`remove_stale_livelocks`]: `.` components and repeated or trailing
/// slashes removed (`..` kept, it is not lexically removable).
fn clean_for_comparison(path: &Path) -> PathBuf {
    path.components()
        .filter(|component| *component != Component::CurDir)
        .collect()
}

/// Removes the livelock of an owner just found dead and freed, without
/// waiting for it to age: the owner had it locked once, so dead now means
/// gone for good. The same checks as stale removal otherwise: a regular
/// file directly in `dir`, dead by the probe while we hold its flock, never
/// through a symlink. Whether it removed the file.
pub fn remove_dead_livelock(dir: &Path, path: &Path) -> io::Result<bool> {
    let Some(text) = path.to_str() else {
        return Ok(false);
    };
    if !livelock_path_allowed(dir, text) {
        return Ok(false);
    }
    match fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_file() => {}
        Ok(_) => return Ok(false),
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
    }
    remove_if_dead(path, SystemTime::now(), Duration::ZERO)
}

/// Removes `path` if it is a dead, old regular file; whether it did.
fn remove_if_stale(path: &Path, now: SystemTime) -> io::Result<bool> {
    remove_if_dead(path, now, LIVELOCK_STALE_AGE_MIN)
}

/// Removes `path` if it is a dead regular file at least `age_min` old.
fn remove_if_dead(path: &Path, now: SystemTime, age_min: Duration) -> io::Result<bool> {
    let file = match open_for_probe(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
        Ok(file) => file,
    };
    let metadata = file.metadata()?;
    if !metadata.file_type().is_file() {
        return Ok(false);
    }
    // Exclusive, unlike the probe: from here to the unlink nobody can take
    // the file over, and a creator that opened it meanwhile finds the name
    // gone after getting the lock and starts over.
    match file.try_lock() {
        Err(TryLockError::WouldBlock) => return Ok(false),
        Err(TryLockError::Error(error)) => return Err(error),
        Ok(()) => {}
    }
    if sys::posix_write_lock_holder(&file)?.is_some() {
        return Ok(false);
    }
    // A modification time in the future (clock set back) counts as young.
    let young = match now.duration_since(metadata.modified()?) {
        Ok(age) => age < age_min,
        Err(_) => true,
    };
    if young {
        return Ok(false);
    }
    match fs::symlink_metadata(path) {
        Ok(current) if same_file(&current, &metadata) => {}
        Ok(_) => return Ok(false),
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
    }
    fs::remove_file(path)?;
    // `file` is dropped only now: the lock was held across the unlink.
    drop(file);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command, Stdio};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use nix::sys::signal::Signal;

    const DEADLINE: Duration = Duration::from_secs(10);

    /// An executable on PATH (or, for python3, at /usr/bin/python3).
    fn find_program(name: &str) -> Option<PathBuf> {
        let on_path = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|candidate| candidate.is_file())
        });
        on_path.or_else(|| {
            let usr_bin = Path::new("/usr/bin").join(name);
            usr_bin.is_file().then_some(usr_bin)
        })
    }

    fn python3() -> PathBuf {
        find_program("python3").expect(
            "these tests need python3 (on PATH or at /usr/bin/python3) to hold locks from \
             another process",
        )
    }

    /// Another process holding a lock on a file, in its own process group,
    /// killed (the whole group) and reaped when dropped.
    struct Holder {
        child: Child,
    }

    impl Holder {
        /// Starts `command` (which prints `locked` once it holds the lock)
        /// and waits, with a deadline, for that line.
        fn start(mut command: Command) -> Holder {
            let mut child = command
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .process_group(0)
                .spawn()
                .expect("cannot start the lock holder");
            let stdout = child.stdout.take().expect("stdout is piped");
            let holder = Holder { child };
            let (send, receive) = mpsc::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(stdout).read_line(&mut line);
                let _ = send.send(line);
            });
            let line = receive
                .recv_timeout(DEADLINE)
                .expect("the lock holder did not report within the deadline");
            assert_eq!(line.trim(), "locked", "the lock holder failed to lock");
            holder
        }

        /// A process holding an exclusive flock on `path`: python3's
        /// `fcntl.flock`, or util-linux `flock(1)` without python3.
        fn flock(path: &Path) -> Holder {
            if let Some(python) = find_program("python3") {
                let mut command = Command::new(python);
                command.args([
                    "-c",
                    "import fcntl,sys,time\n\
                     f=open(sys.argv[1],'a')\n\
                     fcntl.flock(f, fcntl.LOCK_EX)\n\
                     print('locked', flush=True)\n\
                     time.sleep(30)",
                ]);
                command.arg(path);
                Holder::start(command)
            } else {
                let flock = find_program("flock").expect(
                    "these tests need python3 or flock(1) (util-linux) to hold a flock from \
                     another process",
                );
                let mut command = Command::new(flock);
                command
                    .arg("-x")
                    .arg(path)
                    .args(["sh", "-c", "echo locked; exec sleep 30"]);
                Holder::start(command)
            }
        }

        /// A process holding a POSIX write lock (`fcntl.lockf`, as Ganeti's
        /// clients do) on `path`.
        fn posix(path: &Path) -> Holder {
            let mut command = Command::new(python3());
            command.args([
                "-c",
                "import fcntl,sys,time\n\
                 f=open(sys.argv[1],'a')\n\
                 fcntl.lockf(f, fcntl.LOCK_EX)\n\
                 print('locked', flush=True)\n\
                 time.sleep(30)",
            ]);
            command.arg(path);
            Holder::start(command)
        }

        fn pid(&self) -> u32 {
            self.child.id()
        }

        /// Kills the holder's process group and reaps the holder.
        fn kill(mut self) {
            self.kill_and_reap();
        }

        fn kill_and_reap(&mut self) {
            // The group may already be gone; that is fine.
            let _ = sys::send_signal_to_group(self.child.id(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }

    impl Drop for Holder {
        fn drop(&mut self) {
            self.kill_and_reap();
        }
    }

    /// Waits, with a deadline, for `condition` to hold.
    fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + DEADLINE;
        while !condition() {
            assert!(Instant::now() < deadline, "not within {DEADLINE:?}: {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn touch(path: &Path) -> File {
        File::create(path).unwrap()
    }

    /// Sets a file's modification time far enough in the past to be old
    /// for stale removal.
    fn make_old(path: &Path) {
        let old = SystemTime::now() - LIVELOCK_STALE_AGE_MIN - Duration::from_secs(60);
        OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }

    #[test]
    fn names() {
        assert_eq!(job_livelock_name(1, 1_700_000_000), "job_000001_1700000000");
        assert_eq!(job_livelock_name(1_234_567, 5), "job_1234567_5");
        assert_eq!(
            daemon_livelock_name("wconf-daemon", 1_700_000_000),
            "wconf-daemon_1700000000"
        );
    }

    #[test]
    fn a_missing_file_is_dead() {
        let dir = tempfile::tempdir().unwrap();
        assert!(is_dead(&dir.path().join("job_000001_1")));
        assert!(is_dead(&dir.path().join("no-such-dir").join("x")));
    }

    #[test]
    fn an_unlocked_file_is_dead() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job_000001_1");
        let _file = touch(&path);
        assert!(is_dead(&path));
    }

    #[test]
    fn a_file_flocked_by_another_process_is_alive_until_it_dies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job_000001_1");
        touch(&path);
        let holder = Holder::flock(&path);
        assert!(!is_dead(&path));
        // Probing again: the first probe did not take the lock away.
        assert!(!is_dead(&path));
        holder.kill();
        eventually("the livelock is dead after its holder was killed", || {
            is_dead(&path)
        });
        assert!(path.exists(), "the probe never removes");
    }

    #[test]
    fn a_file_with_a_posix_write_lock_is_alive_until_its_holder_dies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job_000002_1");
        touch(&path);
        let holder = Holder::posix(&path);
        let holder_pid = i32::try_from(holder.pid()).unwrap();
        let file = File::open(&path).unwrap();
        assert_eq!(
            sys::posix_write_lock_holder(&file).unwrap(),
            Some(holder_pid)
        );
        // The flock half of the probe alone would call it dead.
        file.try_lock_shared().unwrap();
        drop(file);
        assert!(!is_dead(&path));
        assert!(!is_dead(&path));
        // The probe did not disturb the holder: it still holds its lock.
        let file = File::open(&path).unwrap();
        assert_eq!(
            sys::posix_write_lock_holder(&file).unwrap(),
            Some(holder_pid)
        );
        drop(file);
        holder.kill();
        eventually("the livelock is dead after its holder was killed", || {
            is_dead(&path)
        });
    }

    #[test]
    fn a_livelock_of_this_process_is_alive_and_dead_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let livelock = Livelock::create(dir.path(), "wconf-daemon_1").unwrap();
        let path = livelock.path().to_path_buf();
        assert_eq!(path, dir.path().join("wconf-daemon_1"));
        assert!(!is_dead(&path));
        // The probe did not disturb the holder: another open file
        // description still cannot take the lock.
        let other = File::open(&path).unwrap();
        assert!(matches!(other.try_lock(), Err(TryLockError::WouldBlock)));
        drop(other);
        assert!(!is_dead(&path));
        livelock.release().unwrap();
        assert!(!path.exists());
        assert!(is_dead(&path));
    }

    #[test]
    fn a_dropped_livelock_is_dead_but_its_file_stays() {
        let dir = tempfile::tempdir().unwrap();
        let livelock = Livelock::create(dir.path(), "job_000003_1").unwrap();
        let path = livelock.path().to_path_buf();
        drop(livelock);
        assert!(path.exists());
        // Another test's child, between its fork and its exec, may still
        // share the open file (and so the flock) for a moment.
        eventually("the dropped livelock is dead", || is_dead(&path));
    }

    #[test]
    fn a_livelock_file_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let livelock = Livelock::create(dir.path(), "job_000004_1").unwrap();
        let mode = fs::metadata(livelock.path()).unwrap().mode();
        assert_eq!(mode & 0o077, 0, "mode {mode:o}");
        livelock.release().unwrap();
    }

    #[test]
    fn creating_a_livelock_held_elsewhere_fails() {
        let dir = tempfile::tempdir().unwrap();
        let first = Livelock::create(dir.path(), "job_000005_1").unwrap();
        let error = Livelock::create(dir.path(), "job_000005_1").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
        assert!(
            error.to_string().contains("held by another process"),
            "{error}"
        );
        // The failed attempt did not disturb the holder.
        assert!(!is_dead(first.path()));

        let path = dir.path().join("job_000006_1");
        touch(&path);
        let _holder = Holder::flock(&path);
        let error = Livelock::create(dir.path(), "job_000006_1").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
        first.release().unwrap();
    }

    #[test]
    fn a_stale_file_of_the_same_name_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wconf-daemon_7");
        fs::write(&path, b"left over").unwrap();
        let livelock = Livelock::create(dir.path(), "wconf-daemon_7").unwrap();
        assert!(!is_dead(&path));
        livelock.release().unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn creating_refuses_bad_names_and_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["", ".", "..", "a/b", "a\0b", &"x".repeat(256)] {
            let error = Livelock::create(dir.path(), name).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{name:?}");
        }
        let target = dir.path().join("target");
        std::os::unix::fs::symlink(&target, dir.path().join("link")).unwrap();
        assert!(Livelock::create(dir.path(), "link").is_err());
        assert!(!target.exists(), "created a file through a symlink");
        fs::create_dir(dir.path().join("subdir")).unwrap();
        assert!(Livelock::create(dir.path(), "subdir").is_err());
    }

    #[test]
    fn a_livelock_can_be_handed_on_to_children() {
        let dir = tempfile::tempdir().unwrap();
        let livelock = Livelock::create(dir.path(), "job_000008_1").unwrap();
        assert!(sys::close_on_exec(&livelock).unwrap());
        livelock.hand_on_to_children().unwrap();
        assert!(!sys::close_on_exec(&livelock).unwrap());
        // A child started now inherits the lock: it keeps the livelock alive
        // after this process let go of its own descriptor.
        let mut child = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        // Tests run in threads that spawn processes too; close the window in
        // which theirs could inherit the livelock as well.
        sys::set_close_on_exec(&livelock, true).unwrap();
        let path = livelock.path().to_path_buf();
        drop(livelock);
        assert!(!is_dead(&path), "the child's inherited lock keeps it alive");
        sys::send_signal_to_group(child.id(), Signal::SIGKILL).unwrap();
        child.wait().unwrap();
        eventually("the livelock is dead after the child was killed", || {
            is_dead(&path)
        });
    }

    #[test]
    fn doubtful_paths_count_as_alive() {
        let dir = tempfile::tempdir().unwrap();
        // A symlink is never followed, whatever it points to.
        let dead_target = dir.path().join("dead");
        touch(&dead_target);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&dead_target, &link).unwrap();
        assert!(!is_dead(&link));
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nothing"), &dangling).unwrap();
        assert!(!is_dead(&dangling));
        // A directory is not a livelock.
        let subdir = dir.path().join("subdir");
        fs::create_dir(&subdir).unwrap();
        assert!(!is_dead(&subdir));
    }

    #[test]
    fn livelock_paths_must_be_direct_children_of_the_directory() {
        let dir = Path::new("/srv/warden/livelocks");
        for dir in [
            dir,
            Path::new("/srv/warden/livelocks/"),
            Path::new("/srv//warden/./livelocks"),
        ] {
            assert!(livelock_path_allowed(
                dir,
                "/srv/warden/livelocks/job_000001_1"
            ));
            assert!(livelock_path_allowed(
                dir,
                "/srv/warden/livelocks/wconf-daemon_1"
            ));
            assert!(livelock_path_allowed(dir, "/srv/warden/livelocks/..."));
        }
        let refused = [
            "",
            "job_000001_1",
            "livelocks/job_000001_1",
            "./job_000001_1",
            "/srv/warden/livelocks",
            "/srv/warden/livelocks/",
            "/srv/warden/livelocks/.",
            "/srv/warden/livelocks/..",
            "/srv/warden/livelocks/../livelocks/job_000001_1",
            "/srv/warden/livelocks/a/b",
            "/srv/warden/livelocks//job_000001_1",
            "/srv/warden/livelocks/./job_000001_1",
            "/srv/warden/livelocks/job_000001_1/",
            "/srv/warden/livelocks/job\0",
            "/srv/warden/other/job_000001_1",
            "/srv/warden/livelocks2/job_000001_1",
            "/srv/warden/job_000001_1",
            "/job_000001_1",
        ];
        for path in refused {
            assert!(!livelock_path_allowed(dir, path), "{path:?} was allowed");
        }
        let long = format!(
            "/srv/warden/livelocks/{}",
            "x".repeat(LIVELOCK_NAME_BYTES_MAX)
        );
        assert!(livelock_path_allowed(dir, &long));
        let too_long = format!("{long}x");
        assert!(!livelock_path_allowed(dir, &too_long));
        // The directory itself must be absolute and free of `..`.
        assert!(!livelock_path_allowed(
            Path::new("livelocks"),
            "livelocks/x"
        ));
        assert!(!livelock_path_allowed(
            Path::new("/srv/../livelocks"),
            "/srv/../livelocks/x"
        ));
        assert!(livelock_path_allowed(Path::new("/"), "/x"));
        assert!(!livelock_path_allowed(Path::new("/"), "//x"));
    }

    #[test]
    fn stale_removal_removes_only_old_dead_unreferenced_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let d = dir.path();

        let dead = d.join("job_000001_1");
        touch(&dead);
        make_old(&dead);
        let dead_young = d.join("job_000002_1");
        touch(&dead_young);
        let referenced_dead = d.join("job_000003_1");
        touch(&referenced_dead);
        make_old(&referenced_dead);
        let livelock = Livelock::create(d, "wconf-daemon_1").unwrap();
        make_old(livelock.path());
        let flocked = d.join("job_000004_1");
        touch(&flocked);
        make_old(&flocked);
        let flock_holder = Holder::flock(&flocked);
        let posix_locked = d.join("job_000005_1");
        touch(&posix_locked);
        make_old(&posix_locked);
        let posix_holder = Holder::posix(&posix_locked);
        // Symlinks: dangling, to a dead file inside, to a dead file outside.
        let dangling = d.join("job_000006_1");
        std::os::unix::fs::symlink(d.join("nothing"), &dangling).unwrap();
        let inner_target = d.join("job_000007_1");
        touch(&inner_target);
        make_old(&inner_target);
        let link_inside = d.join("link_inside");
        std::os::unix::fs::symlink(&inner_target, &link_inside).unwrap();
        let outer_target = outside.path().join("job_000008_1");
        touch(&outer_target);
        make_old(&outer_target);
        let link_outside = d.join("job_000008_1");
        std::os::unix::fs::symlink(&outer_target, &link_outside).unwrap();
        // A subdirectory with a dead old file in it.
        let subdir = d.join("job_000009_1");
        fs::create_dir(&subdir).unwrap();
        let nested = subdir.join("job_000010_1");
        touch(&nested);
        make_old(&nested);

        // Referenced under another spelling of the same directory.
        let referenced: HashSet<PathBuf> = [
            d.join(".").join("job_000003_1"),
            PathBuf::from("/elsewhere/job_000001_1"),
        ]
        .into_iter()
        .collect();
        let mut removed = remove_stale_livelocks(d, &referenced).unwrap();
        removed.sort();
        let mut expected = vec![dead.clone(), inner_target.clone()];
        expected.sort();
        assert_eq!(removed, expected);

        assert!(!dead.exists());
        assert!(!inner_target.exists());
        assert!(dead_young.exists());
        assert!(referenced_dead.exists());
        assert!(livelock.path().exists());
        assert!(flocked.exists());
        assert!(posix_locked.exists());
        assert!(
            fs::symlink_metadata(&dangling)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(
            fs::symlink_metadata(&link_inside)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(
            fs::symlink_metadata(&link_outside)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(outer_target.exists());
        assert!(subdir.is_dir());
        assert!(nested.exists());

        // The holders were not disturbed.
        assert!(!is_dead(livelock.path()));
        assert!(!is_dead(&flocked));
        assert!(!is_dead(&posix_locked));

        // Once dead (and old), they go too; a second pass is idempotent.
        flock_holder.kill();
        posix_holder.kill();
        let livelock_path = livelock.path().to_path_buf();
        drop(livelock);
        let mut removed = remove_stale_livelocks(d, &referenced).unwrap();
        removed.sort();
        let mut expected = vec![livelock_path, flocked, posix_locked];
        expected.sort();
        assert_eq!(removed, expected);
        assert_eq!(
            remove_stale_livelocks(d, &referenced).unwrap(),
            Vec::<PathBuf>::new()
        );
    }

    #[test]
    fn stale_removal_of_a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let error =
            remove_stale_livelocks(&dir.path().join("missing"), &HashSet::new()).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
    }
}
