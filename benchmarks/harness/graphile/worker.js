// The graphile-worker side of `python -m benchmarks.sla --target graphile` (see benchmarks/harness/graphile_target.py).
//
//   node worker.js migrate '<settings json>'   install graphile-worker's schema, print its version
//   node worker.js run '<settings json>'       run a worker; print "ready", then "<id> <epoch ms>" per job run
//
// The database URL comes from DATABASE_URL (not argv, where `ps` would show it). The task does
// nothing but note when it ran; lines are written once per event-loop turn, the time is taken
// when graphile-worker calls the task. Logs (warnings and errors only) go to stderr.
"use strict";

const { run, runMigrations, Logger } = require("graphile-worker");
const { version } = require("graphile-worker/package.json");

const TASK = "chronos_bench";

const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") {
    process.stderr.write(`graphile-worker ${level}: ${message}\n`);
  }
});

function preset(settings) {
  // The throughput configuration of graphile-worker's performance page: many concurrent jobs,
  // a pool fetching jobs in batches (localQueue), completions batched, prepared statements.
  return {
    worker: {
      connectionString: process.env.DATABASE_URL,
      concurrentJobs: settings.concurrency,
      maxPoolSize: settings.maxPoolSize,
      pollInterval: settings.pollInterval,
      preparedStatements: true,
      localQueue: { size: settings.localQueueSize },
      completeJobBatchDelay: settings.completeJobBatchDelay,
      failJobBatchDelay: settings.completeJobBatchDelay,
      logger,
    },
  };
}

async function main() {
  const [command, json] = process.argv.slice(2);
  const settings = JSON.parse(json || "{}");
  if (command === "migrate") {
    await runMigrations({ preset: preset(settings) });
    process.stdout.write(`${version}\n`);
    return;
  }
  if (command !== "run") {
    throw new Error(`unknown command ${command}: want migrate or run`);
  }
  const clock = performance; // timeOrigin + now(): epoch milliseconds with microseconds
  let pending = [];
  let flushScheduled = false;
  const flush = () => {
    flushScheduled = false;
    if (pending.length) {
      process.stdout.write(pending.join(""));
      pending = [];
    }
  };
  const taskList = {
    [TASK]: async (payload) => {
      const at = clock.timeOrigin + clock.now();
      if (payload.r !== settings.tag) {
        return; // a job of an earlier run
      }
      pending.push(`${payload.i} ${at.toFixed(3)}\n`);
      if (!flushScheduled) {
        flushScheduled = true;
        setImmediate(flush);
      }
    },
  };
  const runner = await run({ preset: preset(settings), taskList, noHandleSignals: true });
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await runner.stop();
    flush();
    process.exit(0);
  };
  // SIGINT stays ignored as the harness's processes have it: Ctrl-C stops the run through the harness
  process.on("SIGTERM", stop);
  // the harness's process holds our stdin: when it goes away, so do we
  process.stdin.on("end", stop);
  process.stdin.on("error", stop);
  process.stdin.resume();
  process.stdout.write("ready\n");
  await runner.promise;
  flush();
}

main().catch((err) => {
  process.stderr.write(`graphile-worker bench: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
