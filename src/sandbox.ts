/**
 * Sandboxed tasks: a task whose handler runs in a pool of Web Workers (threads of the
 * worker process) or of subprocesses instead of on the worker's event loop. What a task
 * declares, and the context its handler gets there.
 *
 * @module
 */
import type { JobContext } from "./context.ts";
import { AkadzeError } from "./errors.ts";
import type { JobInfo } from "./job.ts";
import { isPlainObject } from "./json.ts";

/**
 * What a sandboxed handler gets beside its arguments: the job, the abort signal, the
 * deadline and progress. No `completeTx`: the transaction would live on the main worker's
 * connection, which a thread cannot share; the handler's return value is the result.
 */
export interface SandboxContext {
  /** The job being run. */
  readonly job: JobInfo;
  /**
   * Aborted on timeout, on a cancel request and at the shutdown deadline; the thread is
   * stopped shortly after (a second), whether the handler noticed or not.
   */
  readonly signal: AbortSignal;
  /** When the timeout fires, or null without a timeout. */
  readonly deadline: Date | null;
  /** Milliseconds left before the timeout (never negative), or null without one. */
  remaining(): number | null;
  /** Report how far the run is, as `JobContext.progress` does (the worker writes it). */
  progress(value: unknown): void;
  /**
   * The outcomes of the jobs this one depends on, as `JobContext.dependencies` gives them
   * (read by the worker as the run starts).
   */
  dependencies(): ReturnType<JobContext["dependencies"]>;
  /** The result of the dependency that ran `task`, as `JobContext.resultOf` gives it. */
  resultOf<R>(
    task: { readonly name: string; readonly handler: (...args: never[]) => R },
    step?: string,
  ): Promise<Awaited<R>>;
}

/**
 * The shape of a sandboxed handler: export it from the sandbox module.
 *
 * @example
 * ```ts ignore
 * // render.ts
 * import type { SandboxHandler } from "@akadze/akadze";
 * export const render: SandboxHandler<{ pages: number }, number> = ({ pages }, ctx) => {
 *   ctx.progress(0);
 *   return pages * 2;
 * };
 * ```
 */
export type SandboxHandler<A = Record<string, unknown>, R = unknown> = (
  args: A,
  ctx: SandboxContext,
) => R | Promise<R>;

/** A validated sandbox declaration. */
export interface SandboxSpec {
  /** The module URL. */
  readonly module: string;
  /** The handler's export name. */
  readonly export: string;
  /** The most threads at once, or null for one per running job. */
  readonly pool: number | null;
  /** The threads' (or processes') permissions. */
  readonly permissions: Deno.PermissionOptions;
  /** Threads of the worker process, or processes of their own. */
  readonly isolation: "thread" | "process";
  /** The V8 heap cap of each process (MiB), or null for V8's default; processes only. */
  readonly maxHeapMb: number | null;
}

const SANDBOX_OPTION_NAMES = ["module", "export", "pool", "permissions", "isolation", "maxHeapMb"];
/** The smallest and largest heap cap a sandbox process may be given, MiB. */
export const SANDBOX_HEAP_MB = { min: 16, max: 1_048_576 } as const;
/** The most threads one sandboxed task may use in one worker. */
export const SANDBOX_POOL_MAX = 1024;

/** Validate a task's `sandbox` option (`where` names the task in the errors). */
export function checkSandbox(options: unknown, where: string): SandboxSpec {
  if (!isPlainObject(options)) {
    throw new AkadzeError(
      `${where}: sandbox must be an object like { module: import.meta.resolve("./handler.ts") }`,
    );
  }
  for (const key of Object.keys(options as object)) {
    if (!SANDBOX_OPTION_NAMES.includes(key)) {
      throw new AkadzeError(
        `${where}: unknown sandbox option "${key}" (options: ${SANDBOX_OPTION_NAMES.join(", ")})`,
      );
    }
  }
  const {
    module,
    export: name = "default",
    pool,
    permissions = "inherit",
    isolation = "thread",
    maxHeapMb,
  } = options as Record<string, unknown>;
  let url: URL | null = null;
  try {
    url = typeof module === "string" ? new URL(module) : null;
  } catch {
    url = null;
  }
  if (url === null) {
    throw new AkadzeError(
      `${where}: sandbox.module must be the absolute URL of a module, e.g. ` +
        `import.meta.resolve("./handler.ts"), got ${JSON.stringify(module)}`,
    );
  }
  if (typeof name !== "string" || name === "") {
    throw new AkadzeError(`${where}: sandbox.export must be the name of an export`);
  }
  if (
    pool !== undefined &&
    (typeof pool !== "number" || !Number.isInteger(pool) || pool < 1 || pool > SANDBOX_POOL_MAX)
  ) {
    throw new AkadzeError(
      `${where}: sandbox.pool must be an integer from 1 to ${SANDBOX_POOL_MAX}, got ${pool}`,
    );
  }
  if (permissions !== "inherit" && permissions !== "none" && !isPlainObject(permissions)) {
    throw new AkadzeError(
      `${where}: sandbox.permissions must be "inherit", "none" or an object of Deno permissions`,
    );
  }
  if (isolation !== "thread" && isolation !== "process") {
    throw new AkadzeError(
      `${where}: sandbox.isolation must be "thread" or "process", got ${JSON.stringify(isolation)}`,
    );
  }
  if (maxHeapMb !== undefined) {
    if (isolation !== "process") {
      throw new AkadzeError(
        `${where}: sandbox.maxHeapMb needs isolation: "process" (a thread's heap cannot be capped)`,
      );
    }
    if (
      typeof maxHeapMb !== "number" || !Number.isInteger(maxHeapMb) ||
      maxHeapMb < SANDBOX_HEAP_MB.min || maxHeapMb > SANDBOX_HEAP_MB.max
    ) {
      throw new AkadzeError(
        `${where}: sandbox.maxHeapMb must be an integer from ${SANDBOX_HEAP_MB.min} to ` +
          `${SANDBOX_HEAP_MB.max} (MiB), got ${maxHeapMb}`,
      );
    }
  }
  return {
    module: url.href,
    export: name,
    pool: pool ?? null,
    permissions: permissions as Deno.PermissionOptions,
    isolation,
    maxHeapMb: (maxHeapMb as number | undefined) ?? null,
  };
}
