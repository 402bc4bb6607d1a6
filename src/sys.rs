//! The one place for raw OS calls: each function here wraps a single call
//! that std does not offer, says why warden needs it, and turns its failure
//! into an `io::Error` value. Everything is done through the safe wrappers of
//! `nix` and `rustix`, except [`release_free_memory`] and `sync_file_range`,
//! calls into the C library that neither wraps: the only `unsafe` in
//! warden. (The one
//! socket option nix does not name, `SO_PEEK_OFF`, is defined with nix's
//! own `sockopt_impl!`, whose expansion makes the `setsockopt` call the
//! way nix's named options do.)
//!
//! Callers elsewhere use std for everything std can do (files, flock through
//! `File::try_lock`, metadata); only what is missing from std lives here.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::libc;
use nix::sys::signal::Signal;
use nix::sys::socket::{MsgFlags, getsockopt, setsockopt, sockopt};
use nix::unistd::Pid;

/// Who is at the other end of a connected Unix socket, as the kernel recorded
/// it when the peer called `connect` (or `socketpair`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCredentials {
    /// The peer's process id at connect time.
    pub pid: u32,
    /// The peer's effective user id at connect time.
    pub uid: u32,
    /// The peer's effective *primary* group id at connect time (not its
    /// supplementary groups).
    pub gid: u32,
}

/// The credentials of the peer of a connected Unix stream socket
/// (`SO_PEERCRED`).
///
/// Why: the daemons decide on accept who may talk to them (root, their own
/// uid, members of the socket group; PROTOCOL.md "Credentials
/// (SO_PEERCRED)"), and an owner who is not privileged may only act with
/// its own pid. std has no way to read peer credentials on stable Rust.
///
/// The values are the ones at connect time and cannot be forged by the peer.
/// `gid` is only the primary group: membership of a group through
/// supplementary groups must be checked separately (for example against the
/// group's member list).
pub fn peer_credentials<F: AsFd>(socket: &F) -> io::Result<PeerCredentials> {
    let credentials = getsockopt(socket, sockopt::PeerCredentials)?;
    let pid = u32::try_from(credentials.pid()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("SO_PEERCRED gave a negative pid {}", credentials.pid()),
        )
    })?;
    Ok(PeerCredentials {
        pid,
        uid: credentials.uid(),
        gid: credentials.gid(),
    })
}

/// A pidfd for the process `pid` (`pidfd_open(2)` with `PIDFD_NONBLOCK`; the
/// kernel always sets close-on-exec on it).
///
/// Why: luxid must learn at once that a runner it started exited, inside its
/// mio event loop and without a timer (LIVENESS.md "Who probes, when"). A
/// pidfd becomes readable when its process exits (also while it is a zombie
/// not yet reaped), so it can be registered with mio like a socket. It also
/// names one process for good: unlike a pid it is never reused.
///
/// Open it while the process is known to exist (for a child: before reaping
/// it); `ESRCH` means there is no such process. `pid` 0 and pids beyond
/// `i32::MAX` are refused with `InvalidInput`.
/// A random (version 4) UUID, from the kernel's random source.
pub fn random_uuid() -> io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let raw = i32::try_from(pid).map_err(|_| invalid_pid(pid))?;
    let pid = rustix::process::Pid::from_raw(raw).ok_or_else(|| invalid_pid(0))?;
    let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::NONBLOCK)?;
    Ok(fd)
}

/// Sends `signal` to the process `pid` (`kill(2)`); `None` sends no signal
/// and only checks that the process exists and may be signalled.
///
/// Why: std can only kill (SIGKILL) its own `Child` handles; the daemons must
/// also send SIGTERM, and signal processes they did not start (a runner that
/// outlived a luxid restart).
///
/// A process that no longer exists gives an error with `raw_os_error() ==
/// Some(ESRCH)`, which callers may ignore. `pid` 0 and pids beyond
/// `i32::MAX` are refused with `InvalidInput`: `kill(0, ..)` and negative
/// pids address process groups, which is [`send_signal_to_group`]'s job.
pub fn send_signal(pid: u32, signal: impl Into<Option<Signal>>) -> io::Result<()> {
    nix::sys::signal::kill(positive_pid(pid)?, signal)?;
    Ok(())
}

/// Sends `signal` to every process of the process group `pgid`
/// (`killpg(2)`); `None` only checks that the group exists.
///
/// Why: runners start in their own process group, and cancel-with-kill (or
/// the death of a runner) must kill every process of the job, including the
/// commands the runner started (LIVENESS.md "Livelock files").
///
/// `ESRCH` means no process is left in the group. `pgid` 0 (our own group)
/// and values beyond `i32::MAX` are refused with `InvalidInput`.
pub fn send_signal_to_group(pgid: u32, signal: impl Into<Option<Signal>>) -> io::Result<()> {
    nix::sys::signal::killpg(positive_pid(pgid)?, signal)?;
    Ok(())
}

/// Makes this process the subreaper of its descendants
/// (`prctl(PR_SET_CHILD_SUBREAPER)`): an orphan among them is re-parented
/// to it, not to init.
///
/// Why: a runner must find what a timed-out program started and left (a
/// pipeline's other half after its shell died) to signal it too (D64);
/// re-parented to init, it would be indistinguishable from any process.
pub fn become_subreaper() -> io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)?;
    Ok(())
}

/// Reaps the child `pid` if it has exited (`waitpid(pid, WNOHANG)`);
/// `Ok(false)` if it still runs.
///
/// Why: std reaps only the `Child` handles it spawned; a subreaper must
/// also reap the orphans it adopted ([`become_subreaper`]), or they stay
/// zombies until it exits.
pub fn reap_child(pid: u32) -> io::Result<bool> {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    match waitpid(positive_pid(pid)?, Some(WaitPidFlag::WNOHANG))? {
        WaitStatus::StillAlive => Ok(false),
        _ => Ok(true),
    }
}

/// The pid of a process holding a POSIX (`fcntl`) write lock on any part of
/// `file`, if there is one (`fcntl(F_GETLK)` asking for a read lock over the
/// whole file).
///
/// Why: Ganeti's own clients hold their livelocks with `fcntl.lockf`, which
/// a flock probe cannot see; the death probe must see both kinds
/// (LIVENESS.md "The probe"). std only offers flock.
///
/// Only queries, never takes a lock. Limits of `F_GETLK` the caller must know:
/// - locks held by the calling process itself are never reported;
/// - an open file description lock (`F_OFD_SETLK`) is reported with pid -1;
/// - closing *any* descriptor of a file drops every POSIX lock the calling
///   process holds on it, so a process must not probe a file it locks with
///   POSIX locks itself.
pub fn posix_write_lock_holder(file: &File) -> io::Result<Option<i32>> {
    // Every field is set: this is the whole struct on Linux (x86_64,
    // aarch64, gnu and musl), so no zeroed/unsafe initialisation is needed.
    let mut query = libc::flock {
        l_type: libc::F_RDLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        // 0 means "to the end of the file, however far it grows".
        l_len: 0,
        l_pid: 0,
    };
    fcntl(file, FcntlArg::F_GETLK(&mut query))?;
    if query.l_type == libc::F_UNLCK as libc::c_short {
        Ok(None)
    } else {
        Ok(Some(query.l_pid))
    }
}

/// Sets or clears the close-on-exec flag of a descriptor (`fcntl(F_SETFD)`).
///
/// Why: every descriptor warden opens is close-on-exec (std's default),
/// except a job's livelock, which is handed on *on purpose* to the processes
/// the runner starts so that the job counts as alive while any of them runs
/// (LIVENESS.md "Livelock files"). std cannot clear the flag.
pub fn set_close_on_exec<F: AsFd>(fd: &F, close_on_exec: bool) -> io::Result<()> {
    let current = fcntl(fd, FcntlArg::F_GETFD)?;
    let mut flags = FdFlag::from_bits_retain(current);
    flags.set(FdFlag::FD_CLOEXEC, close_on_exec);
    fcntl(fd, FcntlArg::F_SETFD(flags))?;
    Ok(())
}

/// Whether the close-on-exec flag of a descriptor is set (`fcntl(F_GETFD)`).
///
/// Why: lets tests and debug checks verify the "all descriptors are
/// close-on-exec except the livelock" rule.
pub fn close_on_exec<F: AsFd>(fd: &F) -> io::Result<bool> {
    let current = fcntl(fd, FcntlArg::F_GETFD)?;
    Ok(FdFlag::from_bits_retain(current).contains(FdFlag::FD_CLOEXEC))
}

/// The alignment direct I/O (`O_DIRECT`) needs for file offsets, lengths
/// and memory on the file system holding `file`, if it offers direct I/O
/// (`statx(2)` with `STATX_DIOALIGN`, Linux 6.1 and later).
///
/// Why: wconfd writes its lock journal with `O_DIRECT | O_DSYNC` in aligned
/// blocks where the file system supports it; std has no `statx`. `None`
/// means the file system does not say it supports direct I/O (tmpfs, or a
/// kernel before 6.1): the journal is then written through the page cache.
pub fn direct_io_alignment(file: &File) -> io::Result<Option<usize>> {
    use rustix::fs::{AtFlags, StatxFlags, statx};
    let stat = statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN)?;
    if !StatxFlags::from_bits_retain(stat.stx_mask).contains(StatxFlags::DIOALIGN)
        || stat.stx_dio_offset_align == 0
    {
        return Ok(None);
    }
    let alignment = stat.stx_dio_offset_align.max(stat.stx_dio_mem_align);
    Ok(Some(alignment as usize))
}

// nix's own macro for a socket option it does not name yet: the same
// code as nix's named options, with an integer value.
use nix::{setsockopt_impl, sockopt_impl};
sockopt_impl!(
    /// `SO_PEEK_OFF`: where the next `MSG_PEEK` read of a socket starts.
    PeekOffset,
    SetOnly,
    libc::SOL_SOCKET,
    libc::SO_PEEK_OFF,
    libc::c_int
);

/// Makes `MSG_PEEK` reads of a socket advance (`SO_PEEK_OFF`, starting at
/// 0): each [`peek`] returns the bytes after the ones peeked before, and
/// an ordinary read (which consumes) moves the peek offset back by what it
/// took.
///
/// Why: wconfd reads a request without consuming it and consumes it only
/// once the reply is written. Consuming bytes from a Unix socket wakes the
/// writer's wait queue, which is also where the client sleeps waiting for
/// the reply; consuming after the reply merges that wake-up with the one
/// of the reply (design/PERFORMANCE.md). std offers neither the option
/// nor `MSG_PEEK` on Unix streams.
pub fn enable_peek_offset<F: AsFd>(socket: &F) -> io::Result<()> {
    setsockopt(socket, PeekOffset, &0)?;
    Ok(())
}

/// Reads what a socket holds after the peek offset without consuming it
/// (`recv(2)` with `MSG_PEEK | MSG_DONTWAIT`); see [`enable_peek_offset`].
/// 0 means the peer shut down its end and everything it sent was peeked.
pub fn peek<F: AsFd>(socket: &F, buffer: &mut [u8]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let read = nix::sys::socket::recv(
        socket.as_fd().as_raw_fd(),
        buffer,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    )?;
    Ok(read)
}

/// Opens an existing file for reading and for writing with `O_DIRECT |
/// O_DSYNC`: each write goes to the device, bypassing the page cache, and
/// returns once it is durable (with the metadata needed to read it back).
///
/// Why: a write of one aligned block into an already written (zero-filled)
/// file this way costs about half of a page-cache write plus `fdatasync`
/// on the machines warden was measured on (design/PERFORMANCE.md); std can
/// pass the flags, but only this module names raw OS flags. Writes through
/// the handle must be aligned as [`direct_io_alignment`] says; a file
/// system without direct I/O refuses the open with `EINVAL`.
pub fn open_direct_dsync(path: &std::path::Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(path)
}

/// Starts writing the dirty pages of `file` in `offset..offset + len` to
/// the device (`sync_file_range` with `WRITE`) and returns without waiting;
/// [`wait_written_back`] waits. Neither flushes the device's cache nor
/// writes the file's metadata.
///
/// Why: the queue's serial is overwritten in place with every group
/// commit, and that commit ends with a directory `fsync` whose journal
/// commit flushes the device's cache. A write the device has already
/// taken is made durable by that flush, so an `fdatasync` of its own (a
/// second flush, beside the job files') is not needed: it cost the
/// received-to-started latency about 10% (design/PERFORMANCE.md). std and
/// the wrappers offer no `sync_file_range`.
pub fn start_write_back(file: &File, offset: u64, len: u64) -> io::Result<()> {
    sync_file_range(file, offset, len, libc::SYNC_FILE_RANGE_WRITE)
}

/// Writes what [`start_write_back`] has not yet written of the range and
/// waits until the device has taken all of it (`sync_file_range` with
/// `WAIT_BEFORE | WRITE | WAIT_AFTER`).
pub fn wait_written_back(file: &File, offset: u64, len: u64) -> io::Result<()> {
    sync_file_range(
        file,
        offset,
        len,
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER,
    )
}

fn sync_file_range(file: &File, offset: u64, len: u64, flags: libc::c_uint) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let range = |value: u64| {
        i64::try_from(value)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file range beyond i64"))
    };
    let (offset, len) = (range(offset)?, range(len)?);
    // SAFETY: sync_file_range takes no pointer; an invalid descriptor or
    // range is answered with an error code, not undefined behaviour.
    let result = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Gives the memory the C library's allocator holds free back to the
/// system (glibc's `malloc_trim(0)`; nothing elsewhere).
///
/// Why: a large answer (a listing of 100,000 locks) is built from many
/// small allocations; freed, glibc keeps their pages, and the daemon's
/// resident memory stayed 77 MiB higher for good (design/RELIABILITY.md).
/// Called after such an answer is written; it costs a walk of the free
/// lists, small beside building a megabyte of answer. musl's allocator
/// gives back large free areas by itself.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only reads and updates the allocator's own state,
    // under its locks; it takes no pointer and is safe to call at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn positive_pid(pid: u32) -> io::Result<Pid> {
    match i32::try_from(pid) {
        Ok(raw) if raw > 0 => Ok(Pid::from_raw(raw)),
        _ => Err(invalid_pid(pid)),
    }
}

fn invalid_pid(pid: u32) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{pid} is not a valid process id (must be 1..=i32::MAX)"),
    )
}

/// Blocks `signals` for the calling thread; answers the mask before, for
/// [`restore_signal_mask`].
///
/// Why: a process spawned meanwhile inherits the mask, so those signals
/// stay pending until it has installed its handlers and unblocked them
/// ([`unblock_signals`]); sent earlier, their default action would kill
/// it. luxid spawns job runners this way (a plain spawn, no `pre_exec`).
pub fn block_signals(signals: &[Signal]) -> io::Result<nix::sys::signal::SigSet> {
    use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
    let mut set = SigSet::empty();
    for signal in signals {
        set.add(*signal);
    }
    let mut old = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old))?;
    Ok(old)
}

/// Sets the calling thread's signal mask back to `old`.
pub fn restore_signal_mask(old: &nix::sys::signal::SigSet) -> io::Result<()> {
    use nix::sys::signal::{SigmaskHow, pthread_sigmask};
    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(old), None)?;
    Ok(())
}

/// Unblocks `signals` for the calling thread (a job runner, once its
/// handlers are installed: see [`block_signals`]).
pub fn unblock_signals(signals: &[Signal]) -> io::Result<()> {
    use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
    let mut set = SigSet::empty();
    for signal in signals {
        set.add(*signal);
    }
    pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::{Command, Stdio};
    use std::time::Duration;

    #[test]
    fn peer_credentials_of_a_socket_pair_are_our_own() {
        let (a, b) = UnixStream::pair().unwrap();
        let expected = PeerCredentials {
            pid: std::process::id(),
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        };
        assert_eq!(peer_credentials(&a).unwrap(), expected);
        assert_eq!(peer_credentials(&b.as_fd()).unwrap(), expected);
    }

    #[test]
    fn peer_credentials_of_a_non_socket_is_an_error() {
        let file = tempfile::tempfile().unwrap();
        assert!(peer_credentials(&file).is_err());
    }

    /// Waits (with a deadline) for `fd` to become readable, the way the
    /// daemons will: registered with mio.
    fn readable_within(fd: &OwnedFd, timeout: Duration) -> bool {
        use mio::unix::SourceFd;
        use mio::{Events, Interest, Poll, Token};
        let mut poll = Poll::new().unwrap();
        let raw = fd.as_raw_fd();
        poll.registry()
            .register(&mut SourceFd(&raw), Token(0), Interest::READABLE)
            .unwrap();
        let mut events = Events::with_capacity(4);
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            poll.poll(&mut events, Some(deadline - now)).unwrap();
            if events
                .iter()
                .any(|e| e.token() == Token(0) && e.is_readable())
            {
                return true;
            }
        }
    }

    #[test]
    fn pidfd_becomes_readable_when_the_process_exits() {
        let mut child = Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let fd = pidfd_open(child.id()).unwrap();
        assert!(close_on_exec(&fd).unwrap(), "a pidfd is close-on-exec");
        assert!(
            !readable_within(&fd, Duration::from_millis(20)),
            "readable while the process runs"
        );
        send_signal(child.id(), Signal::SIGKILL).unwrap();
        assert!(
            readable_within(&fd, Duration::from_secs(10)),
            "not readable after the process was killed"
        );
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn pidfd_open_refuses_invalid_pids() {
        assert_eq!(
            pidfd_open(0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            pidfd_open(u32::MAX).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn signal_none_to_ourselves_succeeds() {
        send_signal(std::process::id(), None).unwrap();
    }

    #[test]
    fn send_signal_refuses_group_addressing_pids() {
        for pid in [0, u32::MAX, 1 << 31] {
            let error = send_signal(pid, None).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "pid {pid}");
        }
        let error = send_signal_to_group(0, None).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn signal_to_a_reaped_child_is_esrch() {
        // The pid of a reaped child is free; it could only be reused after the
        // whole pid space wrapped, which cannot happen between these lines on
        // a machine running tests (pid_max >= 32768).
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let error = send_signal(pid, None).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ESRCH));
    }

    #[test]
    fn signal_to_a_group_kills_every_member() {
        // A shell in its own group starting a grandchild that shares its
        // stdout pipe: the pipe reaches end-of-file only once both are dead
        // (exit closes descriptors even before the parent reaps).
        let mut child = Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        send_signal_to_group(child.id(), Signal::SIGKILL).unwrap();
        let (done, eof) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = done.send(io::Read::read_to_end(&mut stdout, &mut sink));
        });
        eof.recv_timeout(Duration::from_secs(10))
            .expect("a process of the group survived")
            .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn close_on_exec_can_be_cleared_and_set() {
        let file = tempfile::tempfile().unwrap();
        assert!(close_on_exec(&file).unwrap(), "std opens close-on-exec");
        set_close_on_exec(&file, false).unwrap();
        assert!(!close_on_exec(&file).unwrap());
        set_close_on_exec(&file, true).unwrap();
        assert!(close_on_exec(&file).unwrap());
    }

    #[test]
    fn peeks_advance_and_reads_consume_what_was_peeked() {
        use std::io::{Read, Write};
        let (mut a, mut b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        enable_peek_offset(&b).unwrap();
        a.write_all(b"abcdef").unwrap();
        let mut buffer = [0u8; 3];
        assert_eq!(peek(&b, &mut buffer).unwrap(), 3);
        assert_eq!(&buffer, b"abc");
        assert_eq!(peek(&b, &mut buffer).unwrap(), 3);
        assert_eq!(&buffer, b"def");
        let error = peek(&b, &mut buffer).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock, "all peeked");
        // Consuming takes from the front; later bytes are peeked next.
        let mut taken = [0u8; 4];
        assert_eq!(b.read(&mut taken).unwrap(), 4);
        assert_eq!(&taken, b"abcd");
        a.write_all(b"gh").unwrap();
        assert_eq!(peek(&b, &mut buffer).unwrap(), 2);
        assert_eq!(&buffer[..2], b"gh");
        // After the peer is gone, a peek past everything says end of input.
        drop(a);
        assert_eq!(peek(&b, &mut buffer).unwrap(), 0);
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"efgh");
    }

    #[test]
    fn no_posix_lock_on_a_fresh_file() {
        let file = tempfile::tempfile().unwrap();
        assert_eq!(posix_write_lock_holder(&file).unwrap(), None);
    }
}
