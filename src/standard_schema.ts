/**
 * The Standard Schema v1 interface (https://standardschema.dev), implemented by valibot,
 * zod, arktype and others. Declared here rather than imported so akadze depends on no
 * validator.
 *
 * @module
 */
import { sameJson } from "./json.ts";

/**
 * A validator that implements Standard Schema v1 (valibot, zod, arktype, ...): what a task's
 * `args` option takes. Written out in one piece, so it is the only name of the standard a
 * user of akadze meets.
 */
export interface StandardSchemaV1<Input = unknown, Output = Input> {
  /** The Standard Schema properties. */
  readonly "~standard": {
    /** Always 1. */
    readonly version: 1;
    /** The library that made the schema. */
    readonly vendor: string;
    /**
     * Validate a value; may be async. The result is the value, or the issues: each says
     * what is wrong (`message`) and where (`path`, keys from the root).
     */
    readonly validate: (value: unknown) =>
      | { readonly value: Output; readonly issues?: undefined }
      | {
        readonly issues: ReadonlyArray<{
          readonly message: string;
          readonly path?: ReadonlyArray<PropertyKey | { readonly key: PropertyKey }> | undefined;
        }>;
      }
      | Promise<
        | { readonly value: Output; readonly issues?: undefined }
        | {
          readonly issues: ReadonlyArray<{
            readonly message: string;
            readonly path?: ReadonlyArray<PropertyKey | { readonly key: PropertyKey }> | undefined;
          }>;
        }
      >;
    /** Type carriers for inference only. */
    readonly types?: { readonly input: Input; readonly output: Output } | undefined;
  };
}

/** The result of a validation: a value, or issues. */
export type StandardSchemaResult<Output> = Awaited<
  ReturnType<StandardSchemaV1<unknown, Output>["~standard"]["validate"]>
>;

/** One validation problem. */
export type StandardSchemaIssue = NonNullable<StandardSchemaResult<unknown>["issues"]>[number];

/** Whether a value looks like a Standard Schema v1 validator. */
export function isStandardSchema(value: unknown): value is StandardSchemaV1 {
  const props = (value as { "~standard"?: { version?: unknown; validate?: unknown } } | null)
    ?.["~standard"];
  return typeof props === "object" && props !== null && props.version === 1 &&
    typeof props.validate === "function";
}

/**
 * Why a worker would not get `output` back from `schema`, when `output` is what the schema
 * made of `input` (the stored arguments): the worker validates the stored arguments again
 * before each run, so a schema that rejects its own output (a transform such as
 * `v.transform(Number)`) fails every run, and one that changes it again hands the handler
 * other arguments than were enqueued. The problem is said as what the schema does ("does
 * not accept its own output (...)"); null when it gives `output` back unchanged. When
 * `output` is a new value equal to `input` (no transform), validating it again would only
 * repeat the first validation, so it is skipped; synchronous then, and whenever the schema is.
 */
export function ownOutputProblem(
  schema: StandardSchemaV1,
  input: unknown,
  output: unknown,
): string | null | Promise<string | null> {
  // The same object back may have been changed in place, so only a copy is trusted.
  if (output !== input && sameJson(input, output)) return null;
  const check = (again: StandardSchemaResult<unknown>): string | null => {
    if (again.issues) {
      return `does not accept its own output (${
        formatIssues(again.issues)
      }), so every run would fail`;
    }
    return sameJson(again.value, output)
      ? null
      : "changes its own output again (a transform that is not idempotent), " +
        "so the handler would get other arguments than were enqueued";
  };
  const again = schema["~standard"].validate(output);
  return again instanceof Promise ? again.then(check) : check(again);
}

/** What to do about an {@linkcode ownOutputProblem}, for the end of its message. */
export const OWN_OUTPUT_ADVICE = "The worker validates the stored arguments again before each " +
  "run: keep conversions out of the schema (do them in the handler), or make it accept what " +
  "it returns.";

/**
 * Format issues as `field: message; other.field: message`. The value a validator quotes
 * after "received" (`Expected number but received "4111-…"`) is replaced by `***` (a type
 * name such as `number` is kept): the text ends up in errors, logs and stored jobs, and
 * arguments may be secret.
 */
export function formatIssues(issues: ReadonlyArray<StandardSchemaIssue>): string {
  return issues.slice(0, 5).map((issue) => {
    const path = (issue.path ?? []).map((p) =>
      String(typeof p === "object" && p !== null ? p.key : p)
    ).join(".");
    const message = hideReceived(String(issue.message));
    return path ? `${path}: ${message}` : message;
  }).join("; ") + (issues.length > 5 ? `; and ${issues.length - 5} more` : "");
}

function hideReceived(message: string): string {
  return message.replace(
    /(\breceived:?\s*)([\s\S]+)$/i,
    (all, head: string, value: string) => /^[A-Za-z]+$/.test(value.trim()) ? all : `${head}***`,
  );
}
