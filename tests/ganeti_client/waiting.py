"""Scenario (b): a waiting request granted with SIGHUP, the way Ganeti's job
processes wait for locks (mcpu._RequestAndWait).

The holder (this process) takes the BGL shared and node/n1 exclusively, then
starts the waiter: this script again, as a separate process with its own
LiveLock and a SIGHUP handler. The waiter takes the BGL shared, asks
updateLocksWaiting for node/n1 exclusively, gets the holder as its blocker,
is pending (and re-sending the identical request changes nothing), and tells
the holder. The holder sees the pending request in listLocksWaitingStatus
exactly as sent, then releases node/n1. The waiter must get a SIGHUP (within
a deadline), confirms with hasPendingRequest false and listLocks showing
node/n1, frees its locks and exits. The holder gets no SIGHUP.
"""

import json
import subprocess
import sys

import common
from common import equal, say, wire

ROOT = common.root()
errors, wconfd, livelock = common.use_wconfd(ROOT)

REQUEST = [["node/n1", "exclusive"]]
PRIORITY = 0  # constants.OP_PRIO_DEFAULT


def waiter(holder):
    sighups = common.SighupWatch()
    client = wconfd.Client()
    me = common.owner("waiter", livelock.LiveLock("waiter"))
    equal(client.TryUpdateLocks(me, [["cluster/BGL", "shared"]]), [],
          "the waiter takes the BGL shared")
    equal(client.UpdateLocksWaiting(me, PRIORITY, REQUEST), [holder],
          "UpdateLocksWaiting answers the holder as the blocker")
    equal(client.HasPendingRequest(me), True,
          "the waiter has a pending request")
    equal(client.UpdateLocksWaiting(me, PRIORITY, REQUEST), [holder],
          "re-sending the identical waiting request answers the blocker")
    equal(client.ListLocks(me), [["cluster/BGL", "shared"]],
          "the waiter holds only the BGL while it waits")
    common.tell("blocked", common.as_json(wire(me)))
    say("waiting for SIGHUP")
    sighups.wait("the grant of node/n1 after the holder released it")
    equal(client.HasPendingRequest(me), False,
          "after the SIGHUP, the request is no longer pending")
    equal(client.ListLocks(me),
          [["cluster/BGL", "shared"], ["node/n1", "exclusive"]],
          "after the SIGHUP, the waiter holds node/n1")
    equal(client.FreeLocks(me), [], "the waiter frees its locks")
    common.tell("granted")


def holder():
    sighups = common.SighupWatch()
    client = wconfd.Client()
    me = common.owner("holder", livelock.LiveLock("holder"))
    ME = wire(me)
    equal(client.TryUpdateLocks(me, [["cluster/BGL", "shared"],
                                     ["node/n1", "exclusive"]]), [],
          "the holder takes the BGL shared and node/n1 exclusively")

    say("starting the waiter")
    helper = subprocess.Popen(
        [sys.executable, __file__, ROOT, "waiter", common.as_json(ME)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        words = common.read_line(helper, "the waiter blocked").split(" ", 1)
        equal(words[0], "blocked", "the waiter's first line")
        waiting = json.loads(words[1])
        equal(waiting[2], helper.pid, "the waiter's client id names its pid")

        equal(client.HasPendingRequest(waiting), True,
              "HasPendingRequest(waiter), asked by the holder")
        owners = [
            ["cluster/[lockset]", []],
            ["cluster/BGL", [[ME, "shared"], [waiting, "shared"]]],
            ["node/[lockset]", []],
            ["node/n1", [[ME, "exclusive"]]],
        ]
        equal(client.ListLocksWaitingStatus(),
              [owners, [[PRIORITY, waiting, REQUEST]]],
              "ListLocksWaitingStatus: the locks and the pending request")

        say("releasing node/n1")
        equal(client.TryUpdateLocks(me, [["node/n1", "release"]]), [],
              "the holder releases node/n1")
        equal(common.read_line(helper, "the waiter got node/n1"), "granted",
              "the waiter's second line")
        common.wait_exit(helper, "the waiter")
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()

    equal(client.ListLocksWaitingStatus(),
          [[["cluster/[lockset]", []], ["cluster/BGL", [[ME, "shared"]]]],
           []],
          "after the waiter left: only the holder's BGL")
    equal(sighups.count, 0, "SIGHUPs the holder got (it never waited)")
    equal(client.FreeLocks(me), [], "the holder frees its locks")
    say("ok")


if common.role_args()[:1] == ["waiter"]:
    waiter(json.loads(common.role_args()[1]))
else:
    holder()
