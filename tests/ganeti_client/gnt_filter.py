"""Scenario (luxi): Ganeti 3.0's own `gnt-filter` command against luxid.

ROOT holds a running wconfd and a luxid started with max_running_jobs = 8.
Every subcommand is the unmodified `gnt-filter` of the package, run as a
separate process pointed at luxid through the same minimal fake Ganeti root
as the gnt-job scenario (only its query socket, a symlink to luxid's).
Checks are on the exit status and output, and on the effect on jobs seen
through `ganeti.luxi.Client`: add a PAUSE rule on an opcode predicate; list
(default fields, -o, a uuid), list-fields and info show it; a matching job
stays queued while a job it does not match runs; replace with ACCEPT starts
the held job; delete removes the rule; a RATE_LIMIT rule and a
`rate-limit:2:x` reason each hold a burst of jobs to their limit; a bad
rule is refused and changes nothing.
"""

import json
import os
import time

import common
from common import check, equal, say

ROOT = common.root()
# pylint: disable=wrong-import-position,import-error
from ganeti import constants, luxi, opcodes

LUXID_SOCKET = os.path.join(ROOT, "socket", "luxid.sock")


def gnt_filter(*args):
    """Runs `gnt-filter ARGS...`; answers (exit status, stdout, stderr)."""
    return common.gnt("filter", ROOT, *args)


def succeeds(*args):
    code, out, err = gnt_filter(*args)
    equal(code, 0, "exit status of gnt-filter %s (stderr: %s)" % (args, err))
    return out


client = luxi.Client(address=LUXID_SOCKET)


def status(job):
    return client.QueryJobs([job], ["status"])[0][0]


def delay(duration, comment=None, reason=None):
    op = opcodes.OpTestDelay(duration=duration, on_master=False,
                             comment=comment)
    if reason is not None:
        op.reason = [("test:client", reason, 0)]
    return client.SubmitJob([op])


def wait_status(job, wanted):
    common.wait_until(lambda: status(job) in wanted,
                      "job %s reaches %s" % (job, wanted))


def stays_queued(job, seconds):
    until = time.time() + seconds
    while time.time() < until:
        equal(status(job), constants.JOB_STATUS_QUEUED,
              "job %s is held" % job)
        time.sleep(0.02)


def most_at_once(jobs):
    """The most of `jobs` that ran at the same time, from their times."""
    edges = []
    for (start, end) in client.QueryJobs(jobs, ["start_ts", "end_ts"]):
        edges.append((start[0] + start[1] / 1e6, 1))
        edges.append((end[0] + end[1] / 1e6, -1))
    edges.sort()
    running = most = 0
    for (_, step) in edges:
        running += step
        most = max(most, running)
    return most


def rules():
    return client.QueryFilters(None, ["uuid", "priority", "predicates",
                                      "action"])


say("add: a PAUSE rule on an opcode predicate")
predicates = [["opcode", ["=", "comment", "hold"]]]
out = succeeds("add", "--priority", "5", "--predicates",
               json.dumps(predicates), "--action", "PAUSE")
uuid = out.strip()
check(len(uuid) == 36 and uuid.count("-") == 4, "a uuid printed: %r" % out)
equal(rules(), [[uuid, 5, predicates, "PAUSE"]], "the rule as luxid has it")

say("list: the default fields, -o, a uuid")
out = succeeds("list")
header = out.splitlines()[0].split()
equal(header, ["UUID", "Watermark", "Priority", "Predicates", "Action",
               "ReasonTrail"], "the header of gnt-filter list")
check(uuid in out and "PAUSE" in out, "the rule listed: %r" % out)
out = succeeds("list", "--no-headers", "--separator=|", "-o",
               "uuid,priority,action", uuid)
equal(out.splitlines(), ["%s|5|PAUSE" % uuid], "gnt-filter list -o ... UUID")

say("list-fields")
out = succeeds("list-fields")
names = sorted(line.split()[0] for line in out.splitlines()[1:])
equal(names, ["action", "predicates", "priority", "reason_trail", "uuid",
              "watermark"], "the fields of a rule")

say("info")
out = succeeds("info", uuid)
check("UUID: %s" % uuid in out, "info names the rule: %r" % out)
check("Priority: 5" in out and "Action: PAUSE" in out,
      "info shows its priority and action: %r" % out)
check("Watermark: " in out and "Reason trail: " in out, "and the rest")

say("a matching job stays queued, one the rule does not match runs")
held = delay(0.01, comment="hold")
free = delay(0.01, comment="go")
wait_status(free, [constants.JOB_STATUS_SUCCESS])
stays_queued(held, 0.5)

say("replace: with ACCEPT the held job starts")
out = succeeds("replace", "--priority", "5", "--predicates",
               json.dumps(predicates), "--action", "ACCEPT", uuid)
equal(out.strip(), uuid, "replace prints the same uuid")
wait_status(held, [constants.JOB_STATUS_SUCCESS])
equal(rules(), [[uuid, 5, predicates, "ACCEPT"]], "replaced, not added")

say("delete")
succeeds("delete", uuid)
equal(rules(), [], "no rule left")
code, _, err = gnt_filter("delete", uuid)
check(code != 0, "deleting it again fails")
check("does not exist" in err, "and says why: %r" % err)

say("a RATE_LIMIT rule holds a burst to its limit")
out = succeeds("add", "--predicates",
               json.dumps([["reason", ["=", "reason", "burst"]]]),
               "--action", "RATE_LIMIT 2")
limit_uuid = out.strip()
burst = [delay(0.3, reason="burst") for _ in range(6)]
for job in burst:
    wait_status(job, [constants.JOB_STATUS_SUCCESS])
equal(most_at_once(burst), 2, "jobs of the RATE_LIMIT rule at once")
succeeds("delete", limit_uuid)

say("a rate-limit:2:x reason holds a burst to its limit")
burst = [delay(0.3, reason="rate-limit:2:x") for _ in range(6)]
for job in burst:
    wait_status(job, [constants.JOB_STATUS_SUCCESS])
equal(most_at_once(burst), 2, "jobs of the rate-limit:2:x bucket at once")

say("a bad rule is refused and changes nothing")
code, _, err = gnt_filter("add", "--predicates", '[["nodeid", null]]',
                          "--action", "PAUSE")
check(code != 0, "an unknown predicate kind is refused")
check("unknown kind" in err, "and named: %r" % err)
code, _, err = gnt_filter("add", "--action", "RATE_LIMIT 0")
check(code != 0, "RATE_LIMIT 0 is refused")
equal(rules(), [], "still no rule")

say("done")
