"""What the scenario scripts share: pointing Ganeti's client at a wconfd,
checks that stop the scenario on the first failure, and bounded waits.

Every scenario runs as `/usr/bin/python3 SCRIPT ROOT [ROLE ARGS...]` with
PYTHONPATH naming the Python tree of Debian's ganeti-3.0 package (see
setup.sh). ROOT is the canonical root of a running wconfd: its socket is
ROOT/socket/wconfd.sock, and livelocks are made in ROOT/livelocks, the only
place wconfd accepts them from.

Only Ganeti's own client code talks to wconfd: `ganeti.wconfd.Client` for
the calls and `ganeti.utils.livelock.LiveLock` for the livelocks. Nothing of
Ganeti is patched but the two paths in `ganeti.pathutils`.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time

# Every wait of a scenario ends by then at the latest.
WAIT_SECONDS = 10.0

_scenario = os.path.basename(sys.argv[0]) + "".join(
    " " + arg for arg in sys.argv[2:3])


def say(message):
    """A progress line, so a failure's output shows how far it got. On
    stderr: a helper's stdout carries its lines to the scenario (`tell`)."""
    print("%s: %s" % (_scenario, message), file=sys.stderr, flush=True)


def fail(message):
    """Stops the scenario with a non-zero exit status."""
    print("%s: FAILED: %s" % (_scenario, message), file=sys.stderr, flush=True)
    sys.exit(1)


def check(condition, what):
    if not condition:
        fail(what)


def equal(actual, expected, what):
    if actual != expected:
        fail("%s:\n    expected %r\n    got      %r" % (what, expected, actual))


def raises(error_class, text_prefix, what, function, *args):
    """Calls `function(*args)`, which must raise exactly `error_class` (a
    class of ganeti.errors, as Ganeti's client re-raises a failure) whose
    first argument starts with `text_prefix`. Returns the exception."""
    try:
        result = function(*args)
    except Exception as error:  # pylint: disable=broad-except
        check(type(error) is error_class,
              "%s: expected %s, got %s: %r" % (what, error_class.__name__,
                                               type(error).__name__,
                                               error.args))
        check(len(error.args) >= 1 and isinstance(error.args[0], str)
              and error.args[0].startswith(text_prefix),
              "%s: expected a message starting with %r, got %r"
              % (what, text_prefix, error.args))
        return error
    fail("%s: expected %s, but it answered %r"
         % (what, error_class.__name__, result))
    return None


def root():
    if len(sys.argv) < 2:
        fail("usage: %s ROOT [ROLE ARGS...]" % _scenario)
    return sys.argv[1]


def role_args():
    """The arguments after ROOT (a scenario runs its helper processes as
    itself with a role)."""
    return sys.argv[2:]


def use_wconfd(wconfd_root):
    """Points Ganeti's paths at the wconfd under `wconfd_root`; answers the
    ganeti modules the scenarios use."""
    from ganeti import pathutils  # pylint: disable=import-outside-toplevel
    pathutils.WCONFD_SOCKET = os.path.join(wconfd_root, "socket", "wconfd.sock")
    pathutils.LIVELOCK_DIR = os.path.join(wconfd_root, "livelocks")
    # pylint: disable=import-outside-toplevel
    from ganeti import errors, wconfd
    from ganeti.utils import livelock
    return errors, wconfd, livelock


# LiveLocks in use: a LiveLock that is garbage-collected closes its file and
# so drops its lock, and wconfd would rightly find its owner dead (Ganeti
# keeps its LiveLock in the job's context for the same reason).
_LIVE_LOCKS = []


def owner(ident, live_lock):
    """A client id as Ganeti builds one (config.GetWConfdContext): the job
    id or a name, the livelock's path, our pid. Keeps the LiveLock alive."""
    _LIVE_LOCKS.append(live_lock)
    return (ident, live_lock.GetPath(), os.getpid())


def wire(client_id):
    """A client id as it comes back from wconfd: a JSON array."""
    return list(client_id)


class SighupWatch:
    """Counts SIGHUPs with a handler, as Ganeti's job processes do
    (mcpu.sighupReceived), and wakes a waiting `wait()` through a wakeup
    pipe (the handler alone would not end a sleep or a select)."""

    def __init__(self):
        self.count = 0
        self._read, write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        signal.signal(signal.SIGHUP, self._handle)

    def _handle(self, _signum, _frame):
        self.count += 1

    def wait(self, what, seconds=WAIT_SECONDS):
        """Waits until at least one SIGHUP has arrived; fails after
        `seconds`."""
        deadline = time.monotonic() + seconds
        while self.count == 0:
            left = deadline - time.monotonic()
            check(left > 0, "no SIGHUP within %.0f s: %s" % (seconds, what))
            ready, _, _ = select.select([self._read], [], [], left)
            if ready:
                try:
                    os.read(self._read, 512)
                except BlockingIOError:
                    pass


def wait_until(condition, what, seconds=WAIT_SECONDS, pause=0.02):
    """Asks `condition()` until it answers a true value, which it returns;
    fails after `seconds`. For effects wconfd produces on its own (death
    detection), which nothing announces to a bystander."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        check(time.monotonic() < deadline,
              "not within %.0f s: %s" % (seconds, what))
        time.sleep(pause)


def read_line(process, what, seconds=WAIT_SECONDS):
    """The next line a helper process prints (its stdout is a pipe), without
    the newline; fails after `seconds` or if the helper exits first."""
    deadline = time.monotonic() + seconds
    stream = process.stdout
    line = b""
    fd = stream.fileno()
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        check(left > 0, "no line from the helper within %.0f s: %s"
              % (seconds, what))
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1)
            if not chunk:
                status = process.wait(timeout=seconds)
                fail("the helper exited (status %s) before: %s"
                     % (status, what))
            line += chunk
    return line.decode("utf-8").rstrip("\n")


def tell(*words):
    """A line from a helper to its scenario (read with `read_line`)."""
    print(" ".join(words), flush=True)


def as_json(value):
    return json.dumps(value, separators=(",", ":"))


def wait_exit(process, what, seconds=WAIT_SECONDS):
    try:
        status = process.wait(timeout=seconds)
    except Exception:  # pylint: disable=broad-except
        process.kill()
        process.wait()
        fail("the helper did not exit within %.0f s: %s" % (seconds, what))
    equal(status, 0, "exit status of the helper (%s)" % what)


GANETI_HOSTNAME = "node1"


def ganeti_root(root):
    """The fake Ganeti root Ganeti's `gnt-*` commands run in, under ROOT.
    Ganeti's paths are virtualised by two environment variables
    (ganeti.vcluster): GANETI_ROOTDIR prefixes every path, and
    GANETI_HOSTNAME must be its last component. The commands need only
    the query socket in it: var/run/ganeti/socket/ganeti-query
    (pathutils.QUERY_SOCKET), here a symlink to luxid's socket. Their
    command log (var/log/ganeti/commands.log) is not needed: Ganeti goes
    on without it when its directory is missing."""
    rootdir = os.path.join(root, "ganeti", GANETI_HOSTNAME)
    socket_dir = os.path.join(rootdir, "var", "run", "ganeti", "socket")
    os.makedirs(socket_dir, exist_ok=True)
    link = os.path.join(socket_dir, "ganeti-query")
    if not os.path.islink(link):
        os.symlink(os.path.join(root, "socket", "luxid.sock"), link)
    return rootdir


def gnt(command, root, *args):
    """Runs Ganeti's `gnt-<command> ARGS...` against luxid in the fake
    Ganeti root; answers (exit status, stdout, stderr)."""
    pythonpath = os.environ["PYTHONPATH"]
    env = dict(os.environ, GANETI_ROOTDIR=ganeti_root(root),
               GANETI_HOSTNAME=GANETI_HOSTNAME, PYTHONPATH=pythonpath)
    result = subprocess.run(
        [sys.executable, os.path.join(pythonpath, "gnt-" + command)] +
        [str(arg) for arg in args],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=WAIT_SECONDS * 3, check=False)
    say("gnt-%s %s: exit %d\n%s%s" % (command,
                                       " ".join(str(a) for a in args),
                                       result.returncode, result.stdout,
                                       result.stderr))
    return result.returncode, result.stdout, result.stderr
