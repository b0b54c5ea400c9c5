/**
 * Tracing through `@opentelemetry/api`: a PRODUCER span per enqueue call, whose W3C trace
 * context is stored with its jobs (`trace_context`), and a CONSUMER span per run, a child of
 * that context on the job's first run and linked to it on later runs.
 *
 * With no tracer provider registered (Deno registers its own under `OTEL_DENO=true`), the
 * API is a no-op; akadze then skips all of this: {@linkcode activeTracer} is decided once,
 * on first use, and every path here starts with it. Register a provider of your own before
 * the first enqueue or worker start.
 *
 * @module
 */
import {
  type Attributes,
  type Context,
  context,
  type Link,
  propagation,
  ProxyTracerProvider,
  ROOT_CONTEXT,
  type Span,
  type SpanContext,
  SpanKind,
  SpanStatusCode,
  trace,
  type Tracer,
} from "@opentelemetry/api";
import { getConfig, withContext } from "@logtape/logtape";
import { quoteSchema } from "./db.ts";
import type { JobInfo } from "./job.ts";
import type { ErrorEntry } from "./worker/error_entry.ts";

/** The instrumentation scope of akadze's spans. */
export const TRACER_NAME = "akadze";

let tracer: Tracer | null | undefined;

/**
 * akadze's tracer, or null when no tracer provider is registered (tracing is off). Decided
 * on first use: what is registered later is not seen.
 */
export function activeTracer(): Tracer | null {
  if (tracer === undefined) {
    // The API hands out its own proxy: without a delegate (a provider registered through
    // the API) its tracers are no-ops. Deno registers its provider in the proxy's place.
    const provider = trace.getTracerProvider();
    const off = provider instanceof ProxyTracerProvider &&
      provider.getDelegateTracer(TRACER_NAME) === undefined;
    tracer = off ? null : trace.getTracer(TRACER_NAME);
  }
  return tracer;
}

/** A job's stored trace context: the W3C `traceparent` and `tracestate` headers. */
export interface TraceContext {
  /** The W3C traceparent (`00-<trace id>-<span id>-<flags>`). */
  traceparent: string;
  /** The W3C tracestate, when there is one. */
  tracestate?: string;
}

/** What an enqueue call is about. */
export interface PublishTarget {
  /** The task. */
  readonly task: string;
  /** The queue. */
  readonly queue: string;
  /** How many jobs the call inserts. */
  readonly count: number;
}

/**
 * Run `insert` (one enqueue call) inside a PRODUCER span, a child of the caller's active
 * span, giving it the span's trace context as JSON text to store with the jobs (null when
 * tracing is off: `insert` is then called at once, with nothing else done).
 */
export function tracePublish(
  target: PublishTarget,
  insert: (traceContext: string | null) => Promise<string[]>,
): Promise<string[]> {
  const t = activeTracer();
  if (t === null) return insert(null);
  const attributes: Attributes = {
    "messaging.system": "akadze",
    "messaging.operation": "publish",
    "messaging.operation.type": "send",
    "messaging.destination.name": target.queue,
    "akadze.task": target.task,
  };
  if (target.count > 1) attributes["messaging.batch.message_count"] = target.count;
  const span = t.startSpan(`publish ${target.queue}`, { kind: SpanKind.PRODUCER, attributes });
  const ctx = trace.setSpan(context.active(), span);
  return context.with(ctx, async () => {
    try {
      const ids = await insert(carrierText(ctx));
      if (ids.length === 1) span.setAttribute("messaging.message.id", ids[0]);
      return ids;
    } catch (error) {
      recordError(span, error);
      throw error;
    } finally {
      span.end();
    }
  });
}

/** The trace context of `ctx` as stored (JSON text), or null when no propagator writes one. */
function carrierText(ctx: Context): string | null {
  const carrier: Record<string, string> = {};
  propagation.inject(ctx, carrier);
  if (typeof carrier.traceparent !== "string") return null;
  const stored: TraceContext = { traceparent: carrier.traceparent };
  if (carrier.tracestate) stored.tracestate = carrier.tracestate;
  return JSON.stringify(stored);
}

/** A run's CONSUMER span and the context its handler runs in. */
export interface RunSpan {
  /** The span. */
  readonly span: Span;
  /** The active context of the handler (the span in it). */
  readonly context: Context;
}

/**
 * Start the CONSUMER span of one run of `job`: a child of the stored `traceContext` on the
 * job's first run, a new trace linked to it on later runs (retries, snoozes, rescued runs).
 */
export function startRunSpan(
  t: Tracer,
  job: JobInfo,
  traceContext: TraceContext | null | undefined,
): RunSpan {
  const stored = typeof traceContext?.traceparent === "string"
    ? propagation.extract(ROOT_CONTEXT, carrierOf(traceContext))
    : ROOT_CONTEXT;
  const remote = trace.getSpanContext(stored);
  const first = job.runCount <= 1;
  const links: Link[] = remote && !first ? [{ context: remote }] : [];
  const span = t.startSpan(`process ${job.queue}`, {
    kind: SpanKind.CONSUMER,
    links,
    attributes: {
      "messaging.system": "akadze",
      "messaging.operation": "process",
      "messaging.operation.type": "process",
      "messaging.destination.name": job.queue,
      "messaging.message.id": job.id,
      "akadze.task": job.task,
      // 1 for the first attempt (ctx.job.attempt's numbering); a snoozed run repeats it.
      "akadze.attempt": job.attempt,
      "akadze.run_count": job.runCount,
    },
  }, first ? stored : ROOT_CONTEXT);
  return { span, context: trace.setSpan(ROOT_CONTEXT, span) };
}

/** The headers of a stored trace context, strings only (the column may have been edited). */
function carrierOf(stored: TraceContext): Record<string, string> {
  const carrier: Record<string, string> = { traceparent: stored.traceparent };
  if (typeof stored.tracestate === "string") carrier.tracestate = stored.tracestate;
  return carrier;
}

/**
 * Call `fn` (the handler) inside the run's span: Deno's console records and spans made in
 * it join the run's trace, and so do LogTape records when the application configured a
 * `contextLocalStorage` (each gets `traceId` and `spanId` properties).
 */
export function inRunSpan<T>(run: RunSpan, fn: () => T): T {
  return context.with(run.context, () => {
    if (getConfig()?.contextLocalStorage == null) return fn();
    const { traceId, spanId } = run.span.spanContext();
    return withContext({ traceId, spanId }, fn);
  });
}

/**
 * End a run's span with its outcome (`succeeded`, `retry`, `fail`, ...) and the error the
 * job stores, if any: the stored entry, from which credentials and argument values are
 * already redacted.
 */
export function endRunSpan(
  run: RunSpan,
  job: JobInfo,
  outcome: string,
  error?: ErrorEntry,
): void {
  // A retry with no attempt left ends the job failed (the rule of the outcome write); the
  // run's attempt is numbered from 1.
  const last = outcome === "retry" && job.attempt >= job.maxAttempts;
  run.span.setAttribute("akadze.outcome", last ? "fail" : outcome);
  if (error) {
    run.span.recordException({ name: error.error, message: error.message, stack: error.stack });
    run.span.setStatus({ code: SpanStatusCode.ERROR, message: error.message });
  }
  run.span.end();
}

/**
 * Call `fn` (a log call about a run that has ended) with the run's span context active, so
 * that what it prints is exported with the run's trace and span ids, as what the handler
 * printed is.
 */
export function inRunSpanContext<T>(spanContext: SpanContext, fn: () => T): T {
  return context.with(trace.setSpanContext(ROOT_CONTEXT, spanContext), fn);
}

/** Record `error` on `span` as an exception event and set its status to error. */
function recordError(span: Span, error: unknown): void {
  if (error instanceof Error) {
    span.recordException(error);
    span.setStatus({ code: SpanStatusCode.ERROR, message: error.message });
  } else {
    span.recordException(String(error));
    span.setStatus({ code: SpanStatusCode.ERROR });
  }
}

/**
 * The stored trace contexts of `ids` (jobs just claimed), by id: read only when tracing is
 * on, so a worker without a tracer never reads the column.
 */
export async function readTraceContexts(
  sql: { unsafe(text: string, params: string[][]): PromiseLike<readonly unknown[]> },
  schema: string,
  ids: readonly string[],
): Promise<Map<string, TraceContext>> {
  const rows = await sql.unsafe(
    `select id::pg_catalog.text as id, trace_context from ${quoteSchema(schema)}.jobs
      where id operator(pg_catalog.=) any($1::bigint[]) and trace_context is not null`,
    [ids as string[]],
  ) as { id: string; trace_context: TraceContext }[];
  return new Map(rows.map((r) => [r.id, r.trace_context]));
}
