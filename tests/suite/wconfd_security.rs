//! Who may talk to wconfd (PROTOCOL.md, "Credentials (SO_PEERCRED)"): peers
//! are checked with SO_PEERCRED (root, wconfd's own uid, members of
//! `socket_group`), and a peer that is neither root nor wconfd's uid may
//! act only as owners of its own pid. The peers here are real processes
//! running as `nobody`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use serde_json::json;

use crate::daemon::Wconfd;

/// `nobody` and `nogroup` on Debian.
const NOBODY_UID: u32 = 65534;
const NOGROUP_GID: u32 = 65534;

/// Connects as `nobody`, sends each request and prints one line per answer
/// (`reply <json>`), or `closed` when wconfd hangs up, or `refused <errno>`
/// when the connect itself fails. Owners named `SELF` get the script's own
/// pid; `LIVELOCK` is a livelock the script creates and flocks first.
const PEER: &str = r#"
import fcntl, json, os, socket, sys
socket_path, livelock_dir, requests = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
livelock = os.path.join(livelock_dir, "job_000077_1")
try:
    lock = open(livelock, "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
except OSError:
    livelock = os.path.join(livelock_dir, "unwritable")
text = json.dumps(requests).replace('"SELF"', str(os.getpid())).replace('"LIVELOCK"', json.dumps(livelock))
client = socket.socket(socket.AF_UNIX)
try:
    client.connect(socket_path)
except OSError as error:
    print("refused", error.errno, flush=True)
    sys.exit(0)
for request in json.loads(text):
    try:
        client.sendall(json.dumps(request).encode() + b"\n\x03")
        data = b""
        while not data.endswith(b"\x03"):
            chunk = client.recv(65536)
            if not chunk:
                break
            data += chunk
    except (BrokenPipeError, ConnectionResetError):
        data = b""
    if not data:
        print("closed", flush=True)
        sys.exit(0)
    print("reply", data[:-1].decode(), flush=True)
"#;

fn run_as_nobody(wconfd: &Wconfd, requests: serde_json::Value) -> Vec<String> {
    let output = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(PEER)
        .arg(wconfd.root().socket())
        .arg(wconfd.livelock_dir())
        .arg(requests.to_string())
        .uid(NOBODY_UID)
        .gid(NOGROUP_GID)
        .output()
        .expect("run python3 as nobody");
    assert!(
        output.status.success(),
        "peer failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_owned)
        .collect()
}

fn open_to_everyone(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn a_peer_outside_the_allowed_users_is_closed_even_when_the_files_let_it_in() {
    let wconfd = Wconfd::start();
    let root = wconfd.root().path();
    // Defeat the file permissions, so that SO_PEERCRED alone decides.
    open_to_everyone(&root, 0o755);
    open_to_everyone(&root.join("socket"), 0o755);
    open_to_everyone(&wconfd.root().socket(), 0o666);
    let lines = run_as_nobody(&wconfd, json!([{"method": "echo", "args": ["x"]}]));
    assert_eq!(lines, vec!["closed".to_owned()]);
    assert!(
        wconfd.log().contains("refused a connection"),
        "{}",
        wconfd.log()
    );
    let mut client = wconfd.client();
    assert_eq!(
        client.ok("echo", json!(["still here"])),
        json!("still here")
    );
}

#[test]
fn a_socket_group_member_may_act_only_as_owners_of_its_own_pid() {
    let wconfd = Wconfd::start_with_settings(&format!("[wconfd]\nsocket_group = {NOGROUP_GID}\n"));
    let root = wconfd.root().path();
    open_to_everyone(&root, 0o755);
    for (path, mode) in [
        (root.join("socket"), 0o750),
        (wconfd.root().socket(), 0o660),
        (wconfd.livelock_dir(), 0o770),
    ] {
        let metadata = fs::metadata(&path).expect("stat");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(metadata.gid(), NOGROUP_GID, "group of {}", path.display());
        assert_eq!(metadata.mode() & 0o777, mode, "mode of {}", path.display());
    }
    let lines = run_as_nobody(
        &wconfd,
        json!([
            {"method": "echo", "args": ["member"]},
            {"method": "tryUpdateLocks", "args": [[77, "LIVELOCK", 1], [["node/n1", "exclusive"]]]},
            {"method": "tryUpdateLocks", "args": [[77, "LIVELOCK", "SELF"], [["node/n1", "exclusive"]]]},
        ]),
    );
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0], r#"reply {"success":true,"result":"member"}"#);
    assert!(
        lines[1].contains("permission denied") && lines[1].contains(r#""success":false"#),
        "{}",
        lines[1]
    );
    assert_eq!(lines[2], r#"reply {"success":true,"result":[]}"#);
}
