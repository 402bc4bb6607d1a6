"""Scenario (a): echo and the lock calls, as Ganeti's WConfD client makes
them and receives their answers.

Two owners in this process, each with its own LiveLock: "client1" (a name,
as Ganeti's masterd threads use) and 42 (a job id). Checks: echo; shared
BGL for both; an exclusive node lock conflict answering the blocker as a
client id; blocked requests change nothing; the listings (listLocks,
listAllLocks, listAllLocksOwners, listLocksWaitingStatus) in the shapes
Ganeti's client gets; an order violation raising errors.GenericError
"Order violation..."; releases; downGradeLocksLevel, freeLocksLevel,
intersectLocks, opportunisticLockUnion, guardedOpportunisticLockUnion,
freeLocks.
"""

import common
from common import equal, raises, say, wire

errors, wconfd, livelock = common.use_wconfd(common.root())

client = wconfd.Client()

say("echo")
for text in ["hello", "", "w\u00e4rden \u2603 \U0001f512"]:
    equal(client.Echo(text), text, "Echo(%r)" % text)

a = common.owner("client1", livelock.LiveLock("client1"))
b = common.owner(42, livelock.LiveLock("job42"))
A, B = wire(a), wire(b)

say("shared BGL for both owners")
equal(client.TryUpdateLocks(a, [["cluster/BGL", "shared"]]), [],
      "client1 takes the BGL shared")
equal(client.TryUpdateLocks(b, [["cluster/BGL", "shared"]]), [],
      "job 42 takes the BGL shared too")

say("an exclusive node lock, and the conflicts it causes")
equal(client.TryUpdateLocks(a, [["node/n1", "exclusive"]]), [],
      "client1 takes node/n1 exclusively")
equal(client.TryUpdateLocks(a, [["node/n1", "exclusive"]]), [],
      "the same request again (a retried call) is satisfied")
equal(client.TryUpdateLocks(b, [["node/n1", "exclusive"]]), [A],
      "job 42 asking for node/n1 exclusively is blocked by client1")
equal(client.TryUpdateLocks(b, [["node/n1", "shared"]]), [A],
      "job 42 asking for node/n1 shared is blocked by client1")
equal(client.TryUpdateLocks(b, [["node/[lockset]", "shared"]]), [A],
      "job 42 asking for all nodes is blocked by client1's member lock")
equal(client.TryUpdateLocks(b, [["node/n2", "exclusive"],
                                ["node/n1", "shared"]]), [A],
      "a request blocked in one entry")
equal(client.ListLocks(b), [["cluster/BGL", "shared"]],
      "blocked requests changed nothing for job 42")
equal(client.HasPendingRequest(b), False,
      "a blocked tryUpdateLocks leaves no pending request")

say("the listings")
equal(client.ListLocks(a),
      [["cluster/BGL", "shared"], ["node/n1", "exclusive"]],
      "ListLocks(client1)")
equal(client.ListAllLocks(),
      ["cluster/[lockset]", "cluster/BGL", "node/[lockset]", "node/n1"],
      "ListAllLocks (groups used only through a member included)")
owners = [
    ["cluster/[lockset]", []],
    ["cluster/BGL", [[A, "shared"], [B, "shared"]]],
    ["node/[lockset]", []],
    ["node/n1", [[A, "exclusive"]]],
]
equal(client.ListAllLocksOwners(), owners,
      "ListAllLocksOwners (names before job ids)")
equal(client.ListLocksWaitingStatus(), [owners, []],
      "ListLocksWaitingStatus: the owners and no pending request")

say("order violations")
raises(errors.GenericError, "Order violation",
       "client1 asking for instance/i1 below node/n1",
       client.TryUpdateLocks, a, [["instance/i1", "exclusive"]])
raises(errors.GenericError, "Order violation",
       "client1 releasing node/n1 and taking a lower lock in one request",
       client.TryUpdateLocks, a, [["node/n1", "release"],
                                  ["instance/i1", "shared"]])
raises(errors.GenericError, "Order violation",
       "client1 upgrading the BGL below its node lock",
       client.TryUpdateLocks, a, [["cluster/BGL", "exclusive"]])
equal(client.ListLocks(a),
      [["cluster/BGL", "shared"], ["node/n1", "exclusive"]],
      "errors changed nothing for client1")

say("release, then the other owner gets the lock")
equal(client.TryUpdateLocks(a, [["node/n1", "release"]]), [],
      "client1 releases node/n1")
equal(client.TryUpdateLocks(a, [["node/n1", "release"]]), [],
      "releasing it again is satisfied")
equal(client.TryUpdateLocks(b, [["node/n1", "exclusive"]]), [],
      "job 42 now gets node/n1 exclusively")
equal(client.TryUpdateLocks(a, [["node/n1", "shared"]]), [B],
      "and blocks client1 (a job id as a blocker)")

say("downGradeLocksLevel and freeLocksLevel")
equal(client.DownGradeLocksLevel(b, "node"), [],
      "DownGradeLocksLevel(job 42, node)")
equal(client.ListLocks(b), [["cluster/BGL", "shared"], ["node/n1", "shared"]],
      "job 42's node lock is shared now")
equal(client.TryUpdateLocks(a, [["node/n1", "shared"]]), [],
      "client1 shares node/n1 with job 42")
equal(client.FreeLocksLevel(b, "node"), [], "FreeLocksLevel(job 42, node)")
equal(client.ListLocks(b), [["cluster/BGL", "shared"]],
      "job 42 kept only its BGL")
equal(client.ListAllLocksOwners(), [
    ["cluster/[lockset]", []],
    ["cluster/BGL", [[A, "shared"], [B, "shared"]]],
    ["node/[lockset]", []],
    ["node/n1", [[A, "shared"]]],
], "ListAllLocksOwners after freeing job 42's node level")

say("opportunistic unions")
wanted = [["node/n1", "exclusive"], ["node/n2", "exclusive"],
          ["node/n3", "exclusive"]]
equal(sorted(client.OpportunisticLockUnion(b, wanted)),
      ["node/n2", "node/n3"],
      "OpportunisticLockUnion(job 42): all but client1's node/n1")
equal(client.ListLocks(b), [["cluster/BGL", "shared"],
                            ["node/n2", "exclusive"],
                            ["node/n3", "exclusive"]],
      "job 42 holds what the union answered")
wanted = [["node/n2", "exclusive"], ["node/n3", "exclusive"],
          ["node/n4", "exclusive"]]
equal(client.GuardedOpportunisticLockUnion(2, a, wanted), [],
      "GuardedOpportunisticLockUnion(2, client1): only node/n4 is free")
equal(client.ListLocks(a), [["cluster/BGL", "shared"], ["node/n1", "shared"]],
      "the failed guarded union changed nothing")
equal(client.GuardedOpportunisticLockUnion(1, a, wanted), ["node/n4"],
      "GuardedOpportunisticLockUnion(1, client1)")

say("intersectLocks and freeLocks")
equal(client.IntersectLocks(b, ["cluster/BGL", "node/n3", "node/n9"]), [],
      "IntersectLocks(job 42)")
equal(client.ListLocks(b), [["cluster/BGL", "shared"],
                            ["node/n3", "exclusive"]],
      "job 42 kept the listed locks it held")
equal(client.FreeLocks(a), [], "FreeLocks(client1)")
equal(client.FreeLocks(b), [], "FreeLocks(job 42)")
equal(client.ListLocks(a), [], "client1 holds nothing")
equal(client.ListAllLocksOwners(), [], "no lock is in use")
equal(client.ListLocksWaitingStatus(), [[], []], "nothing in use or waiting")

say("ok")
