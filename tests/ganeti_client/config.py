"""Scenario (c): the configuration calls, as Ganeti's ConfigWriter makes
them (config._OpenConfig, _WriteConfig, _CloseConfig).

Checks: LockConfig(exclusive) answers the config dict and holds
cluster/config; ReadConfig answers the same; a second client's LockConfig
(exclusive or shared) while the first holds it answers None; asking again
while holding answers the config; WriteConfig with a modified dict bumps
serial_no by one and sets mtime; WriteConfig without the lock is a
GenericError; WriteConfigAndUnlock answers True and releases, and False when
retried; shared LockConfig by two clients; UnlockConfig; VerifyConfig;
FlushConfig; config.data on disk holds what ReadConfig answers.
"""

import copy
import json
import os

import common
from common import check, equal, raises, say, wire

ROOT = common.root()
errors, wconfd, livelock = common.use_wconfd(ROOT)

client = wconfd.Client()
a = common.owner("writer", livelock.LiveLock("writer"))
b = common.owner(7, livelock.LiveLock("job7"))
A, B = wire(a), wire(b)

say("LockConfig exclusive")
config = client.LockConfig(a, False)
check(isinstance(config, dict), "LockConfig(writer, exclusive) answers a "
      "dict, got %r" % (config,))
check(isinstance(config.get("serial_no"), int),
      "the config has an integer serial_no: %r" % (config,))
serial = config["serial_no"]
equal(client.ReadConfig(), config, "ReadConfig answers the same config")
equal(client.ListLocks(a), [["cluster/config", "exclusive"]],
      "LockConfig took cluster/config exclusively")
equal(client.LockConfig(b, False), None,
      "a second client's LockConfig(exclusive) while the first holds it")
equal(client.LockConfig(b, True), None,
      "a second client's LockConfig(shared) while the first holds it")
equal(client.ListLocks(b), [], "the second client got nothing")
equal(client.LockConfig(a, False), config,
      "LockConfig again while holding the lock answers the config")

say("WriteConfig")
changed = copy.deepcopy(config)
changed["cluster"] = {"cluster_name": "warden.example.com"}
equal(client.WriteConfig(a, changed), [], "WriteConfig(writer, changed)")
written = client.ReadConfig()
equal(written["serial_no"], serial + 1, "serial_no after WriteConfig")
equal(written["cluster"], changed["cluster"], "the written cluster section")
check(isinstance(written.get("mtime"), (int, float)),
      "mtime is a number: %r" % (written.get("mtime"),))
raises(errors.GenericError, "Requested lock",
       "WriteConfig by a client without the lock",
       client.WriteConfig, b, changed)
equal(client.ReadConfig(), written, "the refused write changed nothing")

say("WriteConfigAndUnlock")
renamed = copy.deepcopy(written)
renamed["cluster"]["cluster_name"] = "renamed.example.com"
equal(client.WriteConfigAndUnlock(a, renamed), True,
      "WriteConfigAndUnlock(writer)")
final = client.ReadConfig()
equal(final["serial_no"], serial + 2, "serial_no after WriteConfigAndUnlock")
equal(final["cluster"], renamed["cluster"], "the renamed cluster section")
equal(client.ListLocks(a), [], "WriteConfigAndUnlock released the lock")
equal(client.WriteConfigAndUnlock(a, renamed), False,
      "WriteConfigAndUnlock retried after it succeeded")
equal(client.ReadConfig()["serial_no"], serial + 2,
      "the retried call wrote nothing")

say("shared LockConfig by two clients")
equal(client.LockConfig(b, True), final, "LockConfig(job 7, shared)")
equal(client.LockConfig(a, True), final, "LockConfig(writer, shared)")
equal(client.ListAllLocksOwners(),
      [["cluster/config", [[A, "shared"], [B, "shared"]]]],
      "both share cluster/config")
equal(client.LockConfig(a, False), None,
      "upgrading to exclusive while another client shares it")
equal(client.UnlockConfig(a), [], "UnlockConfig(writer)")
equal(client.UnlockConfig(b), [], "UnlockConfig(job 7)")
equal(client.UnlockConfig(b), [], "UnlockConfig again")
equal(client.ListAllLocksOwners(), [], "nobody holds cluster/config")

say("VerifyConfig and FlushConfig")
equal(client.VerifyConfig(), [], "VerifyConfig of a sound config")
equal(client.FlushConfig(), [], "FlushConfig")
with open(os.path.join(ROOT, "config.data"), encoding="utf-8") as data:
    on_disk = json.load(data)
equal(on_disk, final, "config.data on disk")

say("ok")
