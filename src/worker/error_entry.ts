/**
 * Error entries: whatever a run threw, turned into the `{ error, message, stack }` the
 * database stores on the job. Building one never throws (a Proxy whose every trap throws,
 * a getter that throws, a `toString` that throws), and the entry is always storable: the name at
 * most 200 characters and the message at most 500, both cut between characters (never
 * inside a surrogate pair), with NUL characters and lone surrogates removed. Credentials,
 * the job's argument string values and the input a data exception quotes are hidden. The
 * stack keeps only its frames (`at fn (file:line:col)` lines), at most 20 of them and 4096
 * characters, redacted the same way; it is read only when a run failed.
 *
 * @module
 */
import { explainConnectionError, hideQuotedInput, redact } from "../db.ts";

/** The longest stored error name. */
export const NAME_MAX = 200;
/** The longest stored error message. */
export const MESSAGE_MAX = 500;
/** The most stack frames stored. */
export const STACK_FRAMES_MAX = 20;
/** The longest stored stack. */
export const STACK_MAX = 4_096;
/** Argument strings shorter than this are too common to hide ("true", "id"...). */
const SECRET_MIN = 4;
/** At most this many argument strings are hidden (a message is checked against each). */
const SECRETS_MAX = 1_000;
/** Only this much of a text is looked at: the stored part, and secrets straddling it. */
const WINDOW = 16_384;

/** An error entry as the completer writes it (`at` is added by the database). */
export interface ErrorEntry {
  /** The error's name. */
  error: string;
  /** What went wrong. */
  message: string;
  /**
   * Where it was thrown: the stack's frames, one `at …` per line, without the first line
   * (it repeats name and message). Absent when the thrown value has no stack frames.
   */
  stack?: string;
}

/**
 * What a run's error entries must not contain: the credentials and every string value of
 * at least four characters in the job's arguments, the longest first (so a value that
 * contains another is hidden whole).
 */
export function runSecrets(credentials: readonly string[], args: unknown): string[] {
  const found = new Set<string>(credentials);
  const visit = (value: unknown, depth: number): void => {
    if (found.size >= SECRETS_MAX + credentials.length || depth > 200) return;
    if (typeof value === "string") {
      if (value.length >= SECRET_MIN) found.add(value);
    } else if (Array.isArray(value)) {
      for (const item of value) visit(item, depth + 1);
    } else if (typeof value === "object" && value !== null) {
      for (const item of Object.values(value)) visit(item, depth + 1);
    }
  };
  visit(args, 0);
  return [...found].sort((a, b) => b.length - a.length);
}

/** The entry of whatever a run threw. Never throws. */
export function errorEntry(thrown: unknown, secrets: readonly string[]): ErrorEntry {
  let name = "Error";
  let message: string;
  let stack: string | undefined;
  try {
    if (isErrorLike(thrown)) {
      const rawName = read(thrown, "name");
      if (typeof rawName === "string" && rawName.length > 0) name = rawName;
      const rawMessage = read(thrown, "message");
      message = rawMessage === undefined ? "" : text(rawMessage);
      stack = stackFrames(read(thrown, "stack"), message);
      message = explainConnectionError(
        hideQuotedInput(message, read(thrown, "code")),
        read(thrown, "code"),
      );
    } else {
      message = `non-Error thrown: ${text(thrown)}`;
    }
  } catch {
    message = "non-Error thrown: a value that cannot be read";
  }
  const entry: ErrorEntry = {
    error: storableText(name, NAME_MAX, secrets),
    message: storableText(message, MESSAGE_MAX, secrets),
  };
  if (stack !== undefined) entry.stack = storableText(stack, STACK_MAX, secrets);
  return entry;
}

/**
 * A stack's frame lines (at most {@linkcode STACK_FRAMES_MAX}), or undefined for none.
 * The header (name and `message`, which may span lines) is skipped.
 */
function stackFrames(stack: unknown, message: string): string | undefined {
  if (typeof stack !== "string") return undefined;
  const frames: string[] = [];
  let more = 0;
  const at = message.length > 0 ? stack.indexOf(message) : -1;
  const body = at >= 0 ? stack.slice(at + message.length) : stack;
  for (const line of body.slice(0, WINDOW).split("\n")) {
    const frame = line.trim();
    if (!frame.startsWith("at ")) continue;
    if (frames.length < STACK_FRAMES_MAX) frames.push(frame);
    else more++;
  }
  if (frames.length === 0) return undefined;
  if (more > 0) frames.push(`… ${more} more frame${more === 1 ? "" : "s"}`);
  return frames.join("\n");
}

/**
 * `text` made storable: NUL characters removed, lone surrogates replaced by U+FFFD,
 * credentials and `secrets` replaced by `***`, then cut to at most `max` UTF-16 code units
 * (ending in `…` when cut) without splitting a surrogate pair.
 */
export function storableText(text: string, max: number, secrets: readonly string[]): string {
  let out = text.length > WINDOW ? text.slice(0, WINDOW) : text;
  out = out.replaceAll("\u0000", "").toWellFormed();
  out = redact(out, secrets);
  if (out.length <= max) return out;
  let end = max - 1;
  const last = out.charCodeAt(end - 1);
  if (last >= 0xd800 && last <= 0xdbff) end--; // the high half of a pair: keep it whole
  return `${out.slice(0, end)}…`;
}

/** An Error, or an object with a string `message` (an error from another realm, say). */
function isErrorLike(value: unknown): boolean {
  if (typeof value !== "object" || value === null) return false;
  try {
    return value instanceof Error || typeof read(value, "message") === "string";
  } catch {
    return false;
  }
}

/** A property, or undefined when reading it throws. */
function read(value: unknown, key: string): unknown {
  try {
    return (value as Record<string, unknown>)[key];
  } catch {
    return undefined;
  }
}

/** A value as text, or a description of it when it cannot be converted. */
function text(value: unknown): string {
  if (typeof value === "string") return value;
  if (typeof value === "function") return "a function";
  try {
    // String() of a Symbol works (Symbol(desc)); a template literal would throw.
    return String(value);
  } catch {
    return typeof value === "object" ? "an object that cannot be converted to text" : typeof value;
  }
}
