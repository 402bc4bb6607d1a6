"""Scenario (luxi): Ganeti's own LUXI client and cli.PollJob against luxid.

ROOT holds a running wconfd and a luxid started with max_running_jobs = 1,
so that a job submitted behind a long one stays queued. Checks, all through
`ganeti.luxi.Client(address=...)` and Ganeti's opcode classes:
SubmitJob of OpTestDelay polled to the end with cli.PollJob (its log
messages reported through the feedback function); QueryJobs; SubmitManyJobs
with a relative dependency, both polled; ChangeJobPriority and CancelJob of
a queued job (PollJob then raises JobCanceled); a failing job (PollJob
raises OpExecError); ArchiveJob and a query of the archived job;
SetQueueDrainFlag and QueryConfigValues.
"""

import os

import common
from common import check, equal, raises, say

ROOT = common.root()
# pylint: disable=wrong-import-position,import-error
from ganeti import cli, constants, errors, luxi, opcodes

client = luxi.Client(address=os.path.join(ROOT, "socket", "luxid.sock"))

say("SubmitJob of an OpTestDelay, polled to the end with cli.PollJob")
job = client.SubmitJob([opcodes.OpTestDelay(duration=0.5, on_master=False)])
check(isinstance(job, int), "SubmitJob answers a job id, got %r" % (job,))
messages = []
result = cli.PollJob(job, cl=client,
                     feedback_fn=lambda msg: messages.append(msg))
equal(result, [None], "the OpTestDelay's result")

say("QueryJobs")
rows = client.QueryJobs([job], ["id", "status", "opstatus", "summary"])
equal(rows, [[job, "success", ["success"], ["TEST_DELAY(0.5)"]]],
      "the finished job's row")

say("SubmitManyJobs with a relative dependency")
results = client.SubmitManyJobs([
    [opcodes.OpTestDelay(duration=0.2, on_master=False)],
    [opcodes.OpTestDelay(duration=0.01, on_master=False,
                         depends=[[-1, [constants.JOB_STATUS_SUCCESS]]])],
])
equal([ok for ok, _ in results], [True, True], "both jobs accepted")
first, second = [job_id for _, job_id in results]
equal(second, first + 1, "consecutive ids")
equal(cli.PollJob(second, cl=client, feedback_fn=lambda _: None), [None],
      "the dependant succeeds")
end_first = client.QueryJobs([first], ["end_ts"])[0][0]
start_second = client.QueryJobs([second], ["start_ts"])[0][0]
check(tuple(start_second) >= tuple(end_first),
      "the dependant started after its dependency ended")

say("ChangeJobPriority and CancelJob of a queued job")
long_job = client.SubmitJob([opcodes.OpTestDelay(duration=5, on_master=False)])
queued = client.SubmitJob([opcodes.OpTestDelay(duration=0.01,
                                               on_master=False)])
common.wait_until(
    lambda: client.QueryJobs([long_job], ["status"])[0][0] == "running",
    "the long job runs")
equal(client.QueryJobs([queued], ["status"])[0][0], "queued",
      "the second job waits behind it")
changed, _ = client.ChangeJobPriority(queued, constants.OP_PRIO_HIGH)
check(changed, "ChangeJobPriority of a queued job")
equal(client.QueryJobs([queued], ["priority"])[0][0], constants.OP_PRIO_HIGH,
      "the new priority")
canceled, message = client.CancelJob(queued)
check(canceled, "CancelJob of a queued job: %s" % message)
raises(errors.JobCanceled, "Job was canceled", "PollJob of a canceled job",
       cli.PollJob, queued, client, lambda _: None)
killed, _ = client.CancelJob(long_job, True)
check(killed, "CancelJob with kill of a running job")
raises(errors.OpExecError, "", "PollJob of a killed job",
       cli.PollJob, long_job, client, lambda _: None)

say("a failing opcode")
bad = client.SubmitJob([opcodes.OpTestDelay(duration=-1, on_master=False)])
try:
    cli.PollJob(bad, cl=client, feedback_fn=lambda _: None)
    common.fail("PollJob of a failing job did not raise")
except (errors.OpExecError, errors.OpPrereqError) as error:
    say("the failing job raised %s" % type(error).__name__)

say("ArchiveJob")
equal(client.ArchiveJob(job), True, "archiving a finished job")
equal(client.QueryJobs([job], ["id", "status", "archived"]),
      [[job, "success", True]], "the archived job is still queryable")

say("drain flag")
client.SetQueueDrainFlag(True)
equal(client.QueryConfigValues(["drain_flag"]), [True], "drained")
raises(errors.GenericError, "Queue drained", "SubmitJob to a drained queue",
       client.SubmitJob, [opcodes.OpTestDelay(duration=0.01,
                                              on_master=False)])
client.SetQueueDrainFlag(False)
equal(client.QueryConfigValues(["drain_flag"]), [False], "not drained")
say("done")
