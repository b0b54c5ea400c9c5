/**
 * The inside of a sandbox process (`isolation: "process"`): the same runs as a sandbox
 * thread (sandbox_thread.ts), with the messages as lines of the process's standard input
 * and output. The process's entry imports this module, then the handler's module, then
 * calls {@linkcode serveProcess}.
 *
 * A message line starts with {@linkcode MESSAGE_PREFIX}; whatever else the handler prints
 * on standard output is passed on to the worker's. Messages are JSON, with dates kept as
 * dates (a job's times, arguments a schema turned into dates).
 *
 * @module
 */
import type {
  AbortMessage,
  DependenciesMessage,
  RunMessage,
  ThreadMessage,
} from "./sandbox_thread.ts";
import { type SandboxPort, serve } from "./sandbox_thread.ts";
import { jsonProblem } from "../json.ts";

/** What starts a message line (a record separator and a name, unlikely in printed text). */
export const MESSAGE_PREFIX = "\x1eakadze ";

const DATE_KEY = "$akadzeDate";

/** A message as one line of text (without the newline), dates kept. */
export function encodeMessage(message: unknown): string {
  return MESSAGE_PREFIX + JSON.stringify(message, function (this: unknown, key, value) {
    // The replacer sees a Date after its toJSON: look at the holder's own value.
    const raw = (this as Record<string, unknown>)[key];
    return raw instanceof Date ? { [DATE_KEY]: raw.toISOString() } : value;
  });
}

/**
 * A line of a sandbox process's standard output split into what the handler printed and
 * the message: a handler that printed without a final newline (a progress bar's `\r`) has
 * the next message glued to the end of its text.
 */
export function splitOutputLine(line: string): { text: string; message: unknown } {
  const at = line.indexOf(MESSAGE_PREFIX);
  if (at < 0) return { text: line, message: undefined };
  return { text: line.slice(0, at), message: decodeMessage(line.slice(at)) };
}

/** The message of a line of {@linkcode encodeMessage}, or undefined for any other line. */
export function decodeMessage(line: string): unknown {
  if (!line.startsWith(MESSAGE_PREFIX)) return undefined;
  return JSON.parse(line.slice(MESSAGE_PREFIX.length), (_key, value) => {
    if (
      value !== null && typeof value === "object" && !Array.isArray(value) &&
      typeof value[DATE_KEY] === "string" && Object.keys(value).length === 1
    ) {
      return new Date(value[DATE_KEY]);
    }
    return value;
  });
}

const encoder = new TextEncoder();

/** Write `text` and a newline to `to` at once and whole (a write may take only part). */
export function writeLineSync(to: { writeSync(p: Uint8Array): number }, text: string): void {
  const bytes = encoder.encode(text + "\n");
  for (let at = 0; at < bytes.length;) at += to.writeSync(bytes.subarray(at));
}

/**
 * Call `onLine` with each line of `stream` (the last one too, without its newline);
 * resolves at the stream's end, or when reading it fails (what was read is all there is).
 */
export async function readLines(
  stream: ReadableStream<Uint8Array>,
  onLine: (line: string) => void,
): Promise<void> {
  let buffer = "";
  try {
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
      buffer += chunk;
      for (let nl = buffer.indexOf("\n"); nl >= 0; nl = buffer.indexOf("\n")) {
        onLine(buffer.slice(0, nl));
        buffer = buffer.slice(nl + 1);
      }
    }
  } catch {
    // A process killed mid-write, or a closed input.
  }
  if (buffer) onLine(buffer);
}

/**
 * Serve runs with the exports of `module` over standard input and output; the process
 * exits when its input ends (the worker is gone).
 *
 * @example
 * ```ts ignore
 * import * as handlers from "./render.ts";
 * serveProcess(handlers);
 * ```
 */
export function serveProcess(module: Record<string, unknown>): void {
  const port: SandboxPort = {
    postMessage(message: ThreadMessage) {
      // A thread's result crosses by structured clone and the worker checks it; JSON text
      // would store a Map as {} and drop undefined values: refuse what JSON cannot carry.
      const problem = message.type === "done" && message.ok
        ? jsonProblem(message.value, "result")
        : null;
      if (problem !== null) {
        message = {
          type: "done",
          ok: false,
          error: { name: "ResultNotStorable", message: problem },
        };
      }
      // Written at once and whole: a Deno.exit right after a result must not lose it.
      writeLineSync(Deno.stdout, encodeMessage(message));
    },
    onmessage: null,
  };
  serve(module, port);
  readLines(Deno.stdin.readable, (line) => {
    const data = decodeMessage(line) as RunMessage | AbortMessage | DependenciesMessage;
    if (data !== undefined) port.onmessage?.({ data });
  }).then(() => Deno.exit(0));
}
