"""Scenario (c'): a configuration that fails verification, as Ganeti's
ConfigWriter handles one.

Ganeti answers a failed verification with
`["ConfigVerifyError", ["Validation failed", [<problem>, ...]]]`
(Ganeti.WConfd.ConfigVerify.verifyConfigErr), and its ConfigWriter catches
exactly errors.ConfigVerifyError and reads the problems from `err.args[1]`
as a list; any other error class escapes as a crash.

wconfd verifies a configuration before writing it (a stored invalid one
would stop its next start-up), so writing one whose "nodes" section is not
an object raises errors.ConfigVerifyError with a message and a non-empty
list of problems, and changes nothing: the stored configuration, its
serial and the config lock stay as they were, and VerifyConfig passes.
"""

import copy

import common
from common import check, equal, say

errors, wconfd, livelock = common.use_wconfd(common.root())

client = wconfd.Client()
writer = common.owner("writer", livelock.LiveLock("writer"))

config = client.LockConfig(writer, False)
check(isinstance(config, dict), "LockConfig answers a dict: %r" % (config,))
broken = copy.deepcopy(config)
broken["nodes"] = []

say("WriteConfigAndUnlock of a configuration whose nodes section is a list")
try:
    answer = client.WriteConfigAndUnlock(writer, broken)
except errors.ConfigVerifyError as error:
    check(len(error.args) == 2,
          "ConfigVerifyError has two arguments, got %r" % (error.args,))
    check(isinstance(error.args[0], str),
          "its first argument is a message, got %r" % (error.args[0],))
    check(isinstance(error.args[1], list) and error.args[1]
          and all(isinstance(problem, str) for problem in error.args[1]),
          "its second argument is a non-empty list of problems, got %r"
          % (error.args[1],))
    say("problems: %r" % (error.args[1],))
except Exception as error:  # pylint: disable=broad-except
    common.fail("WriteConfigAndUnlock raised %s%r; Ganeti's ConfigWriter "
                "catches only errors.ConfigVerifyError(message, [problems])"
                % (type(error).__name__, error.args))
else:
    common.fail("writing a broken configuration answered %r" % (answer,))

equal(client.ReadConfig(), config, "the stored configuration is unchanged")
equal(client.ListLocks(common.wire(writer)), [["cluster/config", "exclusive"]],
      "the config lock is still held")
equal(client.UnlockConfig(writer), [], "UnlockConfig")
equal(client.VerifyConfig(), [], "VerifyConfig of the stored configuration")

say("ok")
