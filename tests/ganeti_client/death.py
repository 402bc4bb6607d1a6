"""Scenario (d): a client process that dies holding locks loses them.

The doomed helper (this script again, as a separate process with its own
LiveLock, held with fcntl locks as Ganeti's LiveLock does) takes the BGL
shared and node/n1 exclusively and tells the survivor (this process). The
survivor sees the helper's locks in listAllLocksOwners, is blocked by it,
and files a waiting request for node/n1. Then it SIGKILLs the helper (which
never releases anything) and, polling listAllLocksOwners with a deadline,
sees the helper's locks freed by wconfd's death detection alone; its own
waiting request is granted and announced by SIGHUP.

With the argument `livelock-removed` after ROOT it also checks what Ganeti's
WConfD does (DeathDetection.cleanupLocksTask) and warden keeps
(design/LOCKS.md, "Death of an owner": the dead livelock file is removed):
once cleanupLocks has run, the dead helper's livelock file is gone.
"""

import json
import os
import signal
import subprocess
import sys
import time

import common
from common import check, equal, say, wire

ROOT = common.root()
errors, wconfd, livelock = common.use_wconfd(ROOT)


def doomed():
    client = wconfd.Client()
    lock = livelock.LiveLock("doomed")
    me = common.owner("doomed", lock)
    equal(client.TryUpdateLocks(me, [["cluster/BGL", "shared"],
                                     ["node/n1", "exclusive"]]), [],
          "the doomed helper takes the BGL shared and node/n1 exclusively")
    common.tell("holding", common.as_json(wire(me)))
    time.sleep(4 * common.WAIT_SECONDS)
    common.fail("the doomed helper was never killed")


def owners_of(listing):
    """Every owner in a listAllLocksOwners answer."""
    return [holder for _, holders in listing for holder, _ in holders]


def survivor(check_livelock_removed):
    sighups = common.SighupWatch()
    client = wconfd.Client()
    me = common.owner("survivor", livelock.LiveLock("survivor"))
    ME = wire(me)

    say("starting the doomed helper")
    helper = subprocess.Popen([sys.executable, __file__, ROOT, "doomed"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        words = common.read_line(helper, "the helper holds its locks")
        words = words.split(" ", 1)
        equal(words[0], "holding", "the helper's line")
        dead = json.loads(words[1])
        equal(dead[2], helper.pid, "the helper's client id names its pid")
        check(os.path.exists(dead[1]), "the helper's livelock %s exists"
              % dead[1])
        equal(client.ListAllLocksOwners(), [
            ["cluster/[lockset]", []],
            ["cluster/BGL", [[dead, "shared"]]],
            ["node/[lockset]", []],
            ["node/n1", [[dead, "exclusive"]]],
        ], "ListAllLocksOwners while the helper lives")
        equal(client.TryUpdateLocks(me, [["node/n1", "exclusive"]]), [dead],
              "the helper blocks the survivor")
        equal(client.UpdateLocksWaiting(me, 0, [["node/n1", "exclusive"]]),
              [dead], "the survivor waits for node/n1")

        say("killing the helper")
        os.kill(helper.pid, signal.SIGKILL)
        equal(helper.wait(timeout=common.WAIT_SECONDS), -signal.SIGKILL,
              "the helper's exit status")
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()

    say("waiting for wconfd to free the dead helper's locks")
    common.wait_until(
        lambda: dead not in owners_of(client.ListAllLocksOwners()),
        "the dead helper's locks freed")
    sighups.wait("the grant of node/n1 once the dead helper's was freed")
    equal(client.HasPendingRequest(me), False,
          "the survivor's request is no longer pending")
    equal(client.ListLocks(me), [["node/n1", "exclusive"]],
          "the survivor holds node/n1")
    equal(client.ListLocksWaitingStatus(),
          [[["node/[lockset]", []], ["node/n1", [[ME, "exclusive"]]]], []],
          "ListLocksWaitingStatus after the death")

    equal(client.CleanupLocks(), [], "CleanupLocks")
    check(os.path.exists(me[1]), "the survivor's livelock is kept")
    if check_livelock_removed:
        check(not os.path.exists(dead[1]),
              "after CleanupLocks, the dead helper's livelock %s is removed"
              % dead[1])
    equal(client.FreeLocks(me), [], "the survivor frees its locks")
    say("ok")


if common.role_args() == ["doomed"]:
    doomed()
elif common.role_args() in ([], ["livelock-removed"]):
    survivor(common.role_args() == ["livelock-removed"])
else:
    common.fail("unknown arguments %r" % (common.role_args(),))
