"""Scenario (luxi): Ganeti 3.0's own `gnt-job` command against luxid.

ROOT holds a running wconfd and a luxid started with max_running_jobs = 1.
Every subcommand is the unmodified `gnt-job` of the package (its entry
point runs `ganeti.client.gnt_job.Main()`), run as a separate process
pointed at luxid through a minimal fake Ganeti root (see
`common.ganeti_root`).
Each check is on its exit status and output, and on the effect in luxid,
seen through `ganeti.luxi.Client`: list (default fields, -o, job ids, a
filter, --archived, an unknown field), list-fields, info, cancel (a queued
job, --pending, --kill on a running job), change-priority, watch, wait,
archive and autoarchive.
"""

import os

import common
from common import check, equal, say

ROOT = common.root()
# pylint: disable=wrong-import-position,import-error
from ganeti import constants, luxi, opcodes

LUXID_SOCKET = os.path.join(ROOT, "socket", "luxid.sock")


def gnt_job(*args):
    """Runs `gnt-job ARGS...`; answers (exit status, stdout, stderr)."""
    return common.gnt("job", ROOT, *args)


def succeeds(*args):
    code, out, err = gnt_job(*args)
    equal(code, 0, "exit status of gnt-job %s (stderr: %s)" % (args, err))
    return out


def lines(text):
    return [line.split() for line in text.splitlines()]


client = luxi.Client(address=LUXID_SOCKET)


def status(job):
    return client.QueryJobs([job], ["status"])[0][0]


def delay(duration, **kwargs):
    return client.SubmitJob([opcodes.OpTestDelay(duration=duration,
                                                 on_master=False, **kwargs)])


def wait_status(job, wanted):
    common.wait_until(lambda: status(job) in wanted,
                      "job %s reaches %s" % (job, wanted))


say("a finished job to look at")
first = delay(0.01)
wait_status(first, constants.JOBS_FINALIZED)
failed = client.SubmitJob([opcodes.OpTestDelay(duration=-1,
                                               on_master=False)])
wait_status(failed, constants.JOBS_FINALIZED)

say("list: the default fields")
out = succeeds("list")
equal(lines(out), [["ID", "Status", "Summary"],
                   [str(first), "success", "TEST_DELAY(0.01)"],
                   [str(failed), "error", "TEST_DELAY(-1)"]],
      "gnt-job list")

say("list: -o, job ids, no headers, a separator")
out = succeeds("list", "--no-headers", "--separator=|", "-o",
               "id,status,priority,opstatus", first)
equal(out.splitlines(), ["%d|success|0|['success']" % first],
      "gnt-job list -o ... ID")
out = succeeds("list", "--no-headers", "-o", "id", "--error")
equal(lines(out), [[str(failed)]], "gnt-job list --error")

say("list: a filter in Ganeti's query language")
out = succeeds("list", "--no-headers", "-o", "id", "-F",
               'status == "success" or id > %d' % failed)
equal(lines(out), [[str(first)]], "gnt-job list -F")
out = succeeds("list", "--no-headers", "-o", "id",
               "(status =~ /^succ/) or id == 12345")
equal(lines(out), [[str(first)]], "a regular expression")
out = succeeds("list", "--no-headers", 12345)
equal(lines(out), [["12345", "-", "-"]],
      "a job asked for by id that does not exist: its values unavailable")
code, out, err = gnt_job("list", "-F", 'nosuch == 1')
equal(code, 1, "exit status of a filter on an unknown field")
check("Can't find field named 'nosuch'" in err, "its error: %r" % err)

say("list: an unknown field")
code, out, err = gnt_job("list", "-o", "id,nosuch")
equal(code, constants.EXIT_UNKNOWN_FIELD, "exit status with an unknown field")
check("Warning: Queried for unknown fields nosuch" in err,
      "the warning: %r" % err)

say("list-fields")
out = succeeds("list-fields")
rows = lines(out)
equal(rows[0], ["Name", "Type", "Title", "Description"], "the header")
equal(len(rows), 17, "one line per job field and the header")
check(["summary", "Custom", "Summary", "List", "of", "per-opcode",
       "summaries"] in rows, "the summary field: %r" % rows)
code, out, _ = gnt_job("list-fields", "status", "nosuch")
equal(code, constants.EXIT_UNKNOWN_FIELD, "list-fields of an unknown field")
equal(lines(out)[1][:3], ["status", "Text", "Status"], "a named field")

say("info")
out = succeeds("info", first)
check("Job ID: %d" % first in out, "the job id in: %r" % out)
check("Status: success" in out, "the status in: %r" % out)
check("OP_TEST_DELAY" in out, "the opcode in: %r" % out)
out = succeeds("info", 99999)
check("Job ID 99999 not found" in out, "a missing job: %r" % out)

say("change-priority and cancel of queued jobs behind a running one")
running = delay(30)
wait_status(running, ["running"])
queued = delay(0.01)
pending = delay(0.01)
equal(status(queued), "queued", "the job behind the running one")
out = succeeds("change-priority", "--priority", "high", queued)
check("changed to -10" in out, "change-priority's message: %r" % out)
equal(client.QueryJobs([queued], ["priority"])[0][0],
      constants.OP_PRIO_HIGH, "the new priority")
succeeds("cancel", queued)
equal(status(queued), "canceled", "a canceled queued job")
# --force: without it gnt-job asks on the terminal.
out = succeeds("cancel", "--pending", "--force")
check(str(pending) in out, "the pending job's message: %r" % out)
wait_status(pending, ["canceled"])
equal(status(running), "running", "--pending leaves the running job alone")

say("cancel --kill of the running job")
code, _, err = gnt_job("cancel", "--kill", running)
equal(code, 1, "--kill without --yes-do-it")
check("--yes-do-it" in err, "its error: %r" % err)
succeeds("cancel", "--kill", "--yes-do-it", running)
wait_status(running, ["error"])

say("watch and wait")
watched = delay(0.05, repeat=2)
out = succeeds("watch", watched)
check(out.startswith("Output from job %d follows" % watched),
      "watch's header: %r" % out)
equal(status(watched), "success", "the watched job")
waited = delay(0.05)
out = succeeds("wait", waited)
equal(out, "", "wait prints nothing")
equal(status(waited), "success", "the waited-for job")
bad = client.SubmitJob([opcodes.OpTestDelay(duration=-1, on_master=False)])
code, _, err = gnt_job("watch", bad)
equal(code, 1, "watch of a failing job")
check("Job %d failed" % bad in err, "its error: %r" % err)

say("archive")
succeeds("archive", first)
equal(client.QueryJobs([first], ["archived"])[0][0], True,
      "the archived job")
code, _, err = gnt_job("archive", 99999)
equal(code, 1, "archive of a missing job")
check("Failed to archive job with ID '99999'" in err, "its error: %r" % err)
out = succeeds("list", "--no-headers", "--archived", "-o", "id,archived",
               first, failed)
equal(lines(out), [[str(first), "Y"], [str(failed), "N"]],
      "list --archived")

say("autoarchive")
out = succeeds("autoarchive", "all")
check(out.startswith("Archived "), "autoarchive's report: %r" % out)
equal(out.split()[1], "7", "every finished job but the archived one: %r" % out)
out = succeeds("list", "--no-headers")
equal(out, "", "nothing left in the queue")
finished = [failed, queued, pending, running, watched, waited, bad]
equal([row[0] for row in client.QueryJobs(finished, ["archived"])],
      [True] * len(finished), "all archived")

say("gnt-job works against warden")
