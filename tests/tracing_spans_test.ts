// The spans of src/tracing.ts in this process, with a small recording tracer provider, a
// W3C traceparent propagator and an AsyncLocalStorage context manager of this file's own
// (registered before akadze first looks, as a user's SDK would be): what an enqueue and a run
// record, what is stored, and that a stored trace context that is not usable never stops a run.
// tests/tracing_test.ts runs the same through Deno's own exporter, end to end.
import { AsyncLocalStorage } from "node:async_hooks";
import {
  type Attributes,
  type Context,
  context,
  type ContextManager,
  type Link,
  propagation,
  ROOT_CONTEXT,
  type Span,
  type SpanContext,
  type SpanOptions,
  type SpanStatus,
  type TextMapPropagator,
  trace,
  type Tracer,
  type TracerProvider,
} from "@opentelemetry/api";
import { DuplicateJob, Snooze } from "../src/errors.ts";
import { drain } from "../src/testing.ts";
import { assert, assertEquals, assertRejects } from "./assert.ts";
import { startWorker, waitForJob, withApp, withLogs } from "./_helpers.ts";

interface Recorded {
  name: string;
  kind: number;
  context: SpanContext;
  parent: SpanContext | undefined;
  links: Link[];
  attributes: Attributes;
  exceptions: unknown[];
  status: SpanStatus | undefined;
  ended: boolean;
}

const spans: Recorded[] = [];
const hex = (bytes: number) =>
  [...crypto.getRandomValues(new Uint8Array(bytes))].map((b) => b.toString(16).padStart(2, "0"))
    .join("");

function recordingSpan(recorded: Recorded): Span {
  const span = {
    spanContext: () => recorded.context,
    setAttribute: (key: string, value: unknown) => {
      recorded.attributes[key] = value as string;
      return span;
    },
    setAttributes: (attributes: Attributes) => {
      Object.assign(recorded.attributes, attributes);
      return span;
    },
    addEvent: () => span,
    addLink: () => span,
    addLinks: () => span,
    setStatus: (status: SpanStatus) => {
      recorded.status = status;
      return span;
    },
    updateName: () => span,
    end: () => {
      recorded.ended = true;
    },
    isRecording: () => !recorded.ended,
    recordException: (exception: unknown) => {
      recorded.exceptions.push(exception);
    },
  };
  return span as Span;
}

const tracer = {
  startSpan(name: string, options: SpanOptions = {}, ctx: Context = context.active()): Span {
    const parent = trace.getSpanContext(ctx);
    const recorded: Recorded = {
      name,
      kind: options.kind ?? 0,
      context: { traceId: parent?.traceId ?? hex(16), spanId: hex(8), traceFlags: 1 },
      parent,
      links: options.links ?? [],
      attributes: { ...options.attributes },
      exceptions: [],
      status: undefined,
      ended: false,
    };
    spans.push(recorded);
    return recordingSpan(recorded);
  },
} as unknown as Tracer;
const provider: TracerProvider = { getTracer: () => tracer };

const propagator: TextMapPropagator = {
  inject(ctx, carrier, setter) {
    const sc = trace.getSpanContext(ctx);
    if (sc) setter.set(carrier, "traceparent", `00-${sc.traceId}-${sc.spanId}-01`);
  },
  extract(ctx, carrier, getter) {
    const value = getter.get(carrier, "traceparent");
    const match = typeof value === "string" && /^00-([0-9a-f]{32})-([0-9a-f]{16})-01$/.exec(value);
    if (!match) return ctx;
    return trace.setSpanContext(ctx, {
      traceId: match[1],
      spanId: match[2],
      traceFlags: 1,
      isRemote: true,
    });
  },
  fields: () => ["traceparent"],
};

const storage = new AsyncLocalStorage<Context>();
const contextManager: ContextManager = {
  active: () => storage.getStore() ?? ROOT_CONTEXT,
  with: (ctx, fn, thisArg, ...args) => storage.run(ctx, () => fn.call(thisArg, ...args)),
  bind: (_ctx, target) => target,
  enable() {
    return contextManager;
  },
  disable() {
    return contextManager;
  },
};

context.setGlobalContextManager(contextManager);
propagation.setGlobalPropagator(propagator);
trace.setGlobalTracerProvider(provider);

const PRODUCER = 3, CONSUMER = 4; // SpanKind values of the API

/** Run `fn` inside a parent span of the test's own; returns the parent. */
async function inParent(fn: () => Promise<unknown>): Promise<Recorded> {
  const span = tracer.startSpan("request");
  await context.with(trace.setSpan(context.active(), span), fn);
  span.end();
  return spans.find((s) => s.context.spanId === span.spanContext().spanId)!;
}

Deno.test("an enqueue is a PRODUCER span in the caller's span, its context stored with the jobs; a run is its child, a later run linked", async () => {
  await withApp("tracing_spans", async (app, sql) => {
    let snoozed = false;
    const task = app.task("spans.once", () => {
      if (!snoozed) {
        snoozed = true;
        throw new Snooze(0);
      }
    });
    let id = "";
    let ids: string[] = [];
    const parent = await inParent(async () => {
      id = await task.enqueue({});
      ids = await task.enqueueMany([{}, {}, {}]);
    });
    const producers = spans.filter((s) => s.kind === PRODUCER);
    assertEquals(producers.length, 2);
    const [one, batch] = producers;
    for (const producer of producers) {
      assertEquals(producer.parent?.spanId, parent.context.spanId);
      assertEquals(producer.name, "publish default");
      assert(producer.ended);
    }
    assertEquals(one.attributes["messaging.message.id"], id);
    assertEquals(one.attributes["messaging.batch.message_count"], undefined);
    assertEquals(batch.attributes["messaging.batch.message_count"], 3);
    assertEquals(batch.attributes["messaging.message.id"], undefined);
    const stored = await sql`
      select id::text, trace_context from akadze.jobs order by id`;
    const traceparent = (p: Recorded) => `00-${p.context.traceId}-${p.context.spanId}-01`;
    assertEquals(stored.map((r) => [r.id, r.trace_context]), [
      [id, { traceparent: traceparent(one) }],
      ...ids.map((i) => [i, { traceparent: traceparent(batch) }]),
    ]);

    await drain(app);
    const runs = (jobId: string) =>
      spans.filter((s) => s.kind === CONSUMER && s.attributes["messaging.message.id"] === jobId);
    const [first, second] = runs(id);
    assertEquals([first.context.traceId, first.parent?.spanId], [
      one.context.traceId,
      one.context.spanId,
    ]);
    assertEquals(first.attributes["akadze.outcome"], "snooze");
    assertEquals(first.links, []);
    // A snooze repeats the attempt; the next run is a trace of its own, linked to the enqueue.
    assertEquals(second.attributes["akadze.attempt"], 1);
    assertEquals(second.attributes["akadze.run_count"], 2);
    assertEquals(second.attributes["akadze.outcome"], "succeeded");
    assertEquals(second.parent, undefined);
    assertEquals(second.links.map((l) => l.context.spanId), [one.context.spanId]);
    for (const jobId of ids) assertEquals(runs(jobId)[0].parent?.spanId, batch.context.spanId);
  });
});

Deno.test("a refused enqueue records its error on the PRODUCER span; a stored trace context that is not usable never stops a run", async () => {
  await withApp("tracing_spans_errors", async (app, sql) => {
    const task = app.task("spans.unique", () => {});
    await task.using({ uniqueKey: "k" }).enqueue({});
    spans.length = 0;
    await assertRejects(() => task.using({ uniqueKey: "k" }).enqueue({}), DuplicateJob);
    const [refused] = spans;
    assertEquals(refused.status?.code, 2);
    assertEquals(refused.exceptions.length, 1);
    assert(refused.ended);

    await sql`update akadze.jobs set trace_context = '{"traceparent": 5, "tracestate": []}'`;
    const failing = app.task("spans.fails", { maxAttempts: 1 }, () => {
      throw new Error("it fails");
    });
    await failing.enqueue({});
    await sql`update akadze.jobs set trace_context = '{"traceparent": "00-zz"}'
               where task = 'spans.fails'`;
    spans.length = 0;
    assertEquals(await drain(app), 2);
    const byTask = (name: string) => spans.find((s) => s.attributes["akadze.task"] === name)!;
    assertEquals(byTask("spans.unique").parent, undefined);
    assertEquals(byTask("spans.unique").attributes["akadze.outcome"], "succeeded");
    const failed = byTask("spans.fails");
    assertEquals(failed.attributes["akadze.outcome"], "fail");
    assertEquals(failed.status?.code, 2);
    assertEquals((failed.exceptions[0] as { message: string }).message, "it fails");
  });
});

Deno.test("a flow's enqueue is one PRODUCER span whose context every step stores; each step's run is its child", async () => {
  await withApp("tracing_spans_flow", async (app, sql) => {
    const fetch = app.task("spans.fetch", () => 1);
    const sum = app.task("spans.sum", { queue: "sums" }, () => 2);
    let flow = { id: "", jobs: {} as Record<string, string> };
    const parent = await inParent(async () => {
      flow = await app.enqueueFlow({
        a: { task: fetch, args: {} },
        b: { task: fetch, args: {} },
        total: { task: sum, args: {}, dependsOn: ["a", "b"] },
      });
    });
    const [producer] = spans.filter((s) =>
      s.kind === PRODUCER && s.parent?.spanId === parent.context.spanId
    );
    assertEquals(producer.name, "publish default,sums");
    assertEquals(producer.attributes["akadze.task"], "spans.fetch,spans.sum");
    assertEquals(producer.attributes["messaging.batch.message_count"], 3);
    const traceparent = `00-${producer.context.traceId}-${producer.context.spanId}-01`;
    const stored = await sql`select trace_context from akadze.jobs
      where id = any(${Object.values(flow.jobs)}::bigint[])`;
    assertEquals(stored.map((r) => r.trace_context), [{ traceparent }, { traceparent }, {
      traceparent,
    }]);
    await drain(app);
    for (const id of Object.values(flow.jobs)) {
      // Job ids repeat across this file's databases: the run of this trace.
      const [run] = spans.filter((s) =>
        s.kind === CONSUMER && s.attributes["messaging.message.id"] === id &&
        s.context.traceId === producer.context.traceId
      );
      assert(run, `the run of job ${id}`);
      assertEquals(run.parent?.spanId, producer.context.spanId);
    }
  });
});

Deno.test("a flow's step handed off by its dependency's outcome write runs in a CONSUMER span of its own, as a claimed one", async () => {
  await withApp("tracing_spans_hand_off", async (app, sql) => {
    const before = spans.length;
    const step = app.task("spans.step", () => {});
    const worker = startWorker(app);
    const chain = () =>
      app.enqueueFlow({
        a: { task: step },
        b: { task: step, dependsOn: ["a"] },
        c: { task: step, dependsOn: ["b"] },
      });
    let flow: Awaited<ReturnType<typeof chain>>;
    try {
      // The first flow shows the worker that the task has dependents; the second is handed off.
      const first = await chain();
      await waitForJob(sql, first.jobs.c, (r) => r.state === "succeeded", "the first flow");
      flow = await chain();
      await waitForJob(sql, flow.jobs.c, (r) => r.state === "succeeded", "the last step");
    } finally {
      await worker.stop();
    }
    const [handed] = await sql`
      select count(*)::int as n from akadze.jobs j
        join akadze.job_dependencies e on e.job_id = j.id
        join akadze.jobs d on d.id = e.depends_on
       where j.started_at = d.finished_at and j.id = any(${[flow.jobs.b, flow.jobs.c]})`;
    assertEquals(handed.n, 2, "b and c were handed off");
    for (const id of Object.values(flow.jobs)) {
      const runs = spans.slice(before).filter((s) =>
        s.kind === CONSUMER && s.attributes["messaging.message.id"] === id
      );
      assertEquals(runs.length, 1, `one run span for job ${id}`);
      assert(runs[0].ended);
      assertEquals(runs[0].attributes["akadze.outcome"], "succeeded");
    }
  });
});

Deno.test("the worker's record of a run's outcome carries the run's trace and span ids, written with the run's span active", async () => {
  await withApp("tracing_spans_logs", async (app) => {
    let runs = 0;
    const flaky = app.task("spans.logged", { backoff: () => 0 }, () => {
      if (++runs === 1) throw new Error("the first attempt fails");
    });
    // A success written by the handler's own transaction is logged apart from the batch.
    const inTx = app.task("spans.in_tx", (_args, ctx) => ctx.completeTx(async () => {}));
    const flakyId = await flaky.enqueue({});
    const inTxId = await inTx.enqueue({});
    // The span active when each record was written (what Deno's exporter reads).
    const active = new Map<unknown, SpanContext | undefined>();
    const records = await withLogs(async (records) => {
      const push = records.push.bind(records);
      records.push = (...items) => {
        for (const r of items) active.set(r, trace.getSpanContext(context.active()));
        return push(...items);
      };
      spans.length = 0;
      assertEquals(await drain(app), 3);
    });
    const runOf = (id: string, attempt: number) =>
      spans.find((s) =>
        s.kind === CONSUMER && s.attributes["messaging.message.id"] === id &&
        s.attributes["akadze.attempt"] === attempt
      )!;
    const states = records.filter((r) =>
      typeof r.properties.event === "string" && r.properties.event.startsWith("job_")
    );
    const of = (event: string, id: string) => {
      const record = states.find((r) => r.properties.event === event && r.properties.jobId === id);
      assert(record, `a ${event} record for job ${id}`);
      return record;
    };
    for (
      const [record, run] of [
        [of("job_retrying", flakyId), runOf(flakyId, 1)],
        [of("job_succeeded", flakyId), runOf(flakyId, 2)],
        [of("job_succeeded", inTxId), runOf(inTxId, 1)],
      ] as const
    ) {
      assertEquals(
        [record.properties.traceId, record.properties.spanId],
        [run.context.traceId, run.context.spanId],
      );
      assertEquals(active.get(record)?.spanId, run.context.spanId);
    }
    // A retry's run is a trace of its own: its record is not in the first run's trace.
    assert(
      of("job_succeeded", flakyId).properties.traceId !==
        of("job_retrying", flakyId).properties.traceId,
    );
    // Records that are not about one run carry no trace.
    const other = records.filter((r) => !states.includes(r));
    assert(other.length > 0);
    for (const r of other) {
      assertEquals([r.properties.traceId, active.get(r)], [undefined, undefined]);
    }
  });
});
